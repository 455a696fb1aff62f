"""The cgroup layout: the driver normalised once, kubelet's names per driver and QoS class,
and detection of the driver from a pod's parent or the tree kubelet made."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest

from koord.koordlet import flags
from koord.koordlet.cgrouplayout import CgroupLayout, container_cgroup_dir
from koord.koordlet.resources import KubeQoS

NO_FS = Path("/nonexistent")


@pytest.mark.parametrize("driver, want", [("auto", None), (None, None), ("cgroupfs", "cgroupfs"),
                                          ("systemd", "systemd")])
def test_auto_is_kept_as_no_driver(driver: str | None, want: str | None) -> None:
    assert CgroupLayout(NO_FS, driver=driver).driver == want


@pytest.mark.parametrize("kwargs, match", [
    ({"driver": "cgroupfsx"}, "cgroup driver"),
    ({"version": 3}, "cgroup version"),
    ({"kube_dir": "../etc"}, "leaves the cgroup root"),
    ({"kube_dir": "kubepods/../../etc"}, "leaves the cgroup root"),
])
def test_bad_layouts_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CgroupLayout(NO_FS, **kwargs)


@pytest.mark.parametrize("kube_dir, want", [("kubepods/", "kubepods"), ("/t/kubepods/", "t/kubepods"),
                                            ("", "kubepods")])
def test_kube_dir_is_kept_relative(kube_dir: str, want: str) -> None:
    assert CgroupLayout(NO_FS, kube_dir=kube_dir).kube_dir == want


@pytest.mark.parametrize("argv, want", [
    ([], ("kubepods", None)),
    (["--cgroup-driver", "systemd", "--cgroup-kube-dir", "k8s/pods/"], ("k8s/pods", "systemd")),
    (["--cgroup-driver", "auto"], ("kubepods", None)),
])
def test_from_the_flags(tmp_path: Path, argv: list[str], want: tuple[str, str | None]) -> None:
    layout = CgroupLayout.from_args(flags.parse_args(["--cgroup-root-dir", str(tmp_path), *argv]))
    assert (layout.root, layout.kube_dir, layout.driver, layout.version) == (tmp_path, *want, 1)


def test_version_detected_from_root(tmp_path: Path) -> None:
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpu memory\n")
    assert (CgroupLayout(tmp_path).version, CgroupLayout(tmp_path / "v2").version) == (1, 2)


@pytest.mark.parametrize("driver, kube_dir, tree, parent, want", [
    ("systemd", "kubepods", None, "/kubepods/besteffort/pod1", "systemd"),  # configured: never detected
    (None, "kubepods", None, "kubepods-besteffort-pod1.slice", "systemd"),
    (None, "kubepods", None, "/kubepods/besteffort/pod1", "cgroupfs"),
    # No parent: the tree kubelet made (v1: in cpu).
    (None, "kubepods", "cpu/kubepods.slice", None, "systemd"),
    (None, "kubepods", "cpu/kubepods", None, "cgroupfs"),
    (None, "kubepods", None, None, "cgroupfs"),
    (None, "kubepods.slice", None, None, "systemd"),  # only systemd names a slice
    # A kube dir of one's own is there under both drivers: its QoS dirs tell.
    (None, "t/kubepods", "cpu/t/kubepods/besteffort", None, "cgroupfs"),
    (None, "t/kubepods", "cpu/t/kubepods/kubepods-burstable.slice", None, "systemd"),
    (None, "t/kubepods", "cpu/kubepods.slice", None, "cgroupfs"),  # kubelet's own tree says nothing of it
])
def test_driver_for(tmp_path: Path, driver: str | None, kube_dir: str, tree: str | None, parent: str | None,
                    want: str) -> None:
    if tree:
        (tmp_path / tree).mkdir(parents=True)
    assert CgroupLayout(tmp_path, kube_dir, driver).driver_for(parent) == want


def test_the_tree_is_looked_at_again_once_kubelet_made_it(tmp_path: Path) -> None:
    layout = CgroupLayout(tmp_path)
    before = layout.kube_qos_dir(KubeQoS.BESTEFFORT)
    (tmp_path / "cpu" / "kubepods.slice").mkdir(parents=True)
    assert (before, layout.kube_qos_dir(KubeQoS.BESTEFFORT)) == (
        "kubepods/besteffort", "kubepods.slice/kubepods-besteffort.slice")


@pytest.mark.parametrize("driver, kube_dir, qos, want", [
    ("cgroupfs", "kubepods", KubeQoS.GUARANTEED, "kubepods"),
    ("cgroupfs", "kubepods", KubeQoS.BURSTABLE, "kubepods/burstable"),
    ("cgroupfs", "kubepods", KubeQoS.BESTEFFORT, "kubepods/besteffort"),
    ("cgroupfs", "test-1/kubepods", KubeQoS.BESTEFFORT, "test-1/kubepods/besteffort"),
    ("cgroupfs", "test-1/kubepods", KubeQoS.GUARANTEED, "test-1/kubepods"),
    ("systemd", "kubepods", KubeQoS.GUARANTEED, "kubepods.slice"),
    ("systemd", "kubepods", KubeQoS.BURSTABLE, "kubepods.slice/kubepods-burstable.slice"),
    ("systemd", "kubepods", KubeQoS.BESTEFFORT, "kubepods.slice/kubepods-besteffort.slice"),
    ("systemd", "test.slice/kt.slice", KubeQoS.BURSTABLE, "test.slice/kt.slice/kubepods-burstable.slice"),
])
def test_kube_qos_dir(driver: str, kube_dir: str, qos: KubeQoS, want: str) -> None:
    assert CgroupLayout(NO_FS, kube_dir, driver).kube_qos_dir(qos) == want


@pytest.mark.parametrize("kube_dir, qos, driver, want", [
    ("kubepods/", "besteffort", "cgroupfs", "kubepods/besteffort/podu-1"),
    ("kubepods/", "burstable", "cgroupfs", "kubepods/burstable/podu-1"),
    ("kubepods/", "guaranteed", "cgroupfs", "kubepods/podu-1"),
    ("/t1/kubepods", "besteffort", "cgroupfs", "t1/kubepods/besteffort/podu-1"),
    ("kubepods/", "besteffort", "systemd",
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu_1.slice"),
    ("kubepods/", "guaranteed", "systemd", "kubepods.slice/kubepods-podu_1.slice"),
    ("kubepods.slice", "burstable", "systemd",
     "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice"),
])
def test_pod_dir(kube_dir: str, qos: str, driver: str, want: str) -> None:
    layout = CgroupLayout(NO_FS, kube_dir)
    assert layout.pod_dir(qos, "u-1", driver) == want
    # A QoS class's dir is the parent of its pods' dirs, whichever way it is asked for.
    assert layout.kube_qos_dir(qos, driver) == posixpath.dirname(want)


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_pod_dir_follows_the_configured_driver(driver: str) -> None:
    layout = CgroupLayout(NO_FS, driver=driver)
    assert layout.pod_dir("besteffort", "u") == layout.pod_dir("besteffort", "u", driver)


@pytest.mark.parametrize("uid, driver, match", [("", None, "uid"), ("..", None, "uid"), ("a/b", None, "uid"),
                                                ("u", "other", "cgroup driver")])
def test_pod_dir_refuses_what_cannot_name_a_dir(uid: str, driver: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CgroupLayout(NO_FS).pod_dir("besteffort", uid, driver)


@pytest.mark.parametrize("pod, cid, driver, want", [
    ("kubepods/podu", "abc", "cgroupfs", "kubepods/podu/abc"),
    ("p.slice", "abc", "systemd", "p.slice/cri-containerd-abc.scope"),
    ("p", "../x", "cgroupfs", ValueError),
    ("p", "", "systemd", ValueError),
])
def test_container_cgroup_dir(pod: str, cid: str, driver: str, want: str | type[Exception]) -> None:
    if isinstance(want, str):
        assert container_cgroup_dir(pod, cid, driver) == want
    else:
        with pytest.raises(want):
            container_cgroup_dir(pod, cid, driver)


@pytest.mark.parametrize("driver, parent, want", [
    (None, "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/abc"),
    (None, "kubepods-besteffort-pod1.slice",
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope"),
    ("systemd", "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/cri-containerd-abc.scope"),
])
def test_container_dir_of_parent(driver: str | None, parent: str, want: str) -> None:
    assert CgroupLayout(NO_FS, driver=driver).container_dir_of_parent(parent, "abc") == want
