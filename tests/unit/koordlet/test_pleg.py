"""PLEG: pod and container cgroup directories reported at once, on v1 and v2 trees with
either driver's names; bounded under churn."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.inotify import IN_IGNORED, Inotify, decode_events
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.pleg import BURST, RATE_PER_SECOND, Pleg, is_pod_dir
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord_testing.wait import wait_for

# (version, driver, QoS dirs relative to the hierarchy, a pod dir in besteffort, its container dir)
LAYOUTS = [
    (1, "cgroupfs", ["kubepods", "kubepods/burstable", "kubepods/besteffort"],
     "kubepods/besteffort/pod1234", "0123abcd"),
    (1, "systemd", ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice",
                    "kubepods.slice/kubepods-besteffort.slice"],
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice",
     "cri-containerd-0123abcd.scope"),
    (2, "cgroupfs", ["kubepods", "kubepods/burstable", "kubepods/besteffort"],
     "kubepods/besteffort/pod1234", "0123abcd"),
    (2, "systemd", ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice",
                    "kubepods.slice/kubepods-besteffort.slice"],
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice",
     "cri-containerd-0123abcd.scope"),
]


def tree(root: Path, version: int, qos_dirs: list[str]) -> Path:
    """The hierarchy PLEG watches: v1 ``cpu`` (the others exist but are not watched), v2 the root."""
    if version == 2:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        base = root
    else:
        base = root / "cpu"
        for other in ("memory", "cpuset"):
            (root / other / qos_dirs[0]).mkdir(parents=True)
    for d in qos_dirs:
        (base / d).mkdir(parents=True, exist_ok=True)
    return base


class Calls:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.n += 1


@pytest.fixture
def started():
    plegs: list[Pleg] = []

    def start(pleg: Pleg) -> Pleg:
        pleg.start()
        plegs.append(pleg)
        return pleg
    yield start
    for p in plegs:
        p.stop()


@pytest.mark.parametrize("version,driver,qos_dirs,pod,container", LAYOUTS)
def test_pod_and_container_dirs_are_reported(tmp_path, started, version, driver, qos_dirs, pod, container):
    base = tree(tmp_path, version, qos_dirs)
    calls = Calls()
    pleg = started(Pleg(CgroupExecutor(CgroupLayout(tmp_path, driver=driver)), [calls], follow_up=0.2))
    assert sorted(pleg.qos_dirs()) == sorted(base / d for d in qos_dirs)
    (base / pod).mkdir()
    wait_for(lambda: calls.n >= 1, "the pod directory to be reported", 5)
    wait_for(lambda: calls.n >= 2, "the follow-up call of the burst", 5)
    time.sleep(0.5)
    assert calls.n == 2  # and nothing more until something happens
    (base / pod / container).mkdir()
    wait_for(lambda: calls.n >= 3, "the container directory to be reported", 5)
    (base / pod / container).rmdir()
    (base / pod).rmdir()
    wait_for(lambda: pleg.events == 4, "the removals to be reported", 5)
    wait_for(lambda: (base / pod) not in pleg._watched, "the pod's watch to be dropped", 5)


def test_detected_driver_watches_both_trees(tmp_path, started):
    """A node may hold both drivers' trees (another kubelet's, a leftover): with the driver
    left to detection, a pod in either is seen."""
    base = tree(tmp_path, 1, LAYOUTS[0][2] + LAYOUTS[1][2])
    calls = Calls()
    pleg = started(Pleg(CgroupExecutor(CgroupLayout(tmp_path)), [calls]))
    (base / LAYOUTS[0][3]).mkdir()
    (base / LAYOUTS[1][3]).mkdir()
    wait_for(lambda: pleg.events == 2, "a pod in each tree", 5)


def test_other_dirs_and_files_are_not_pods(tmp_path, started):
    base = tree(tmp_path, 1, LAYOUTS[0][2])
    calls = Calls()
    pleg = started(Pleg(CgroupExecutor(CgroupLayout(tmp_path, driver="cgroupfs")), [calls]))
    (base / "kubepods/besteffort/cpu.shares").write_text("2\n")
    (base / "kubepods/other").mkdir()
    (base / "kubepods/burstable/pod9").write_text("")  # a file, not a directory
    time.sleep(0.5)
    assert (calls.n, pleg.events) == (0, 0)


def test_pods_present_at_start_are_watched_and_a_late_qos_dir_is_found(tmp_path, started):
    base = tmp_path / "cpu"
    (base / "kubepods/burstable/podA").mkdir(parents=True)
    calls = Calls()
    pleg = started(Pleg(CgroupExecutor(CgroupLayout(tmp_path, driver="cgroupfs", version=1)), [calls]))
    (base / "kubepods/burstable/podA/c1").mkdir()
    wait_for(lambda: calls.n >= 1, "a container in a pod that existed at start", 5)
    (base / "kubepods/besteffort").mkdir()  # kubelet made it after koordlet started
    wait_for(lambda: base / "kubepods/besteffort" in pleg._watched, "a rescan to watch it", 5)
    (base / "kubepods/besteffort/podB").mkdir()
    wait_for(lambda: pleg.events >= 2, "a pod in the late QoS dir", 5)


def test_churn_is_rate_limited_and_leaves_no_watches(tmp_path, started):
    """100 pods with a container each created and removed within a few seconds: the calls
    stay within the rate limit (no backlog), and every watch of a removed pod is gone."""
    base = tree(tmp_path, 1, LAYOUTS[0][2])
    calls = Calls()
    pleg = started(Pleg(CgroupExecutor(CgroupLayout(tmp_path, driver="cgroupfs")), [calls]))
    baseline = len(pleg._watched)
    t0 = time.monotonic()
    for i in range(100):
        pod = base / f"kubepods/besteffort/pod{i}"
        pod.mkdir()
        (pod / "c").mkdir()
        time.sleep(0.01)
    for i in range(100):
        pod = base / f"kubepods/besteffort/pod{i}"
        (pod / "c").rmdir()
        pod.rmdir()
    wait_for(lambda: len(pleg._watched) == baseline and len(pleg._watches) == baseline,
             "the watches of the removed pods to go", 10)
    elapsed = time.monotonic() - t0
    time.sleep(1.0)  # the last burst's call and its follow-up
    assert calls.n >= 1
    assert calls.n <= BURST + RATE_PER_SECOND * (elapsed + 1.0) + 1


@given(st.binary(max_size=300))
def test_decode_events_never_fails_on_any_bytes(data):
    for wd, mask, name in decode_events(data):
        assert isinstance(wd, int) and isinstance(mask, int) and "\0" not in name


def test_decode_events_reads_kernel_records():
    rec = struct.pack("iIII", 3, 0x40000100, 0, 16) + b"pod1234\0" + b"\0" * 8
    assert decode_events(rec + struct.pack("iIII", 4, 0x8000, 0, 0)) == [(3, 0x40000100, "pod1234"),
                                                                         (4, 0x8000, "")]
    assert decode_events(rec[:-1]) == []  # cut short


@pytest.mark.parametrize("name,pod", [("pod1234", True), ("kubepods-besteffort-pod12_34.slice", True),
                                      ("kubepods-pod12_34.slice", True), ("burstable", False),
                                      ("kubepods-burstable.slice", False), ("besteffort", False)])
def test_is_pod_dir(name, pod):
    assert is_pod_dir(name) is pod


@pytest.mark.parametrize("version", [1, 2])
def test_tree_made_at_once_after_start_is_seen_without_waiting_for_a_rescan(tmp_path, started, version):
    """runc makes kubepods/besteffort/pod<uid>/<container> in one go when the tree is gone (a
    kubelet restart that cleaned it): the watch on the nearest existing ancestor sees it."""
    base = tmp_path / "cpu" if version == 1 else tmp_path
    base.mkdir(exist_ok=True)
    if version == 2:
        (base / "cgroup.controllers").write_text("cpu memory\n")
    calls = Calls()
    started(Pleg(CgroupExecutor(CgroupLayout(tmp_path, driver="cgroupfs", version=version)), [calls],
                 rescan_interval=3600))
    (base / "kubepods/besteffort/pod1/c1").mkdir(parents=True)
    wait_for(lambda: calls.n >= 1, "the new tree's pod to be reported", 5)


class CgroupfsInotify(Inotify):
    """inotify as on cgroupfs: a removed directory's watch is not ended by the kernel (no
    IN_IGNORED; tmpfs sends one), only by ``rm_watch``, whose calls are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.removed: list[int] = []

    def read(self) -> list[tuple[int, int, str]]:
        return [(wd, mask, name) for wd, mask, name in super().read()
                if not mask & IN_IGNORED or wd in self.removed]

    def rm_watch(self, wd: int) -> None:
        self.removed.append(wd)
        super().rm_watch(wd)


def cgroupfs_pleg(tmp_path, calls, **kwargs) -> Pleg:
    pleg = Pleg(CgroupExecutor(CgroupLayout(tmp_path, driver="cgroupfs")), [calls], **kwargs)
    pleg._inotify = CgroupfsInotify()
    pleg._rescan()
    return pleg


def test_a_removed_pod_dirs_watch_is_ended_when_its_removal_is_seen(tmp_path):
    base = tree(tmp_path, 1, LAYOUTS[0][2])
    pods = [base / f"kubepods/besteffort/pod{i}" for i in range(3)]
    for pod in pods:
        pod.mkdir()
    pleg = cgroupfs_pleg(tmp_path, Calls())
    try:
        wds = [pleg._watched[pod] for pod in pods]
        pods[0].rmdir()
        pods[2].rmdir()
        wait_for(lambda: pleg._handle(pleg._inotify.read()) or pleg._inotify.removed, "the removals", 5)
        assert pleg._inotify.removed == [wds[0], wds[2]]
        assert pods[1] in pleg._watched and pods[0] not in pleg._watched and pods[2] not in pleg._watched
    finally:
        pleg._inotify.close()


def test_a_rescan_ends_the_watches_of_pod_dirs_and_qos_dirs_that_are_gone(tmp_path):
    """Removals not seen as events (the kernel's queue overflowed) are found by the rescan."""
    base = tree(tmp_path, 1, LAYOUTS[0][2])
    (base / "kubepods/besteffort/pod1").mkdir()
    (base / "kubepods/burstable/pod2").mkdir()
    pleg = cgroupfs_pleg(tmp_path, Calls())
    try:
        watched = dict(pleg._watched)
        (base / "kubepods/besteffort/pod1").rmdir()
        (base / "kubepods/burstable/pod2").rmdir()
        (base / "kubepods/burstable").rmdir()
        pleg._rescan()  # the events are never read
        assert sorted(pleg._inotify.removed) == sorted(watched[base / d] for d in (
            "kubepods/besteffort/pod1", "kubepods/burstable/pod2", "kubepods/burstable"))
        assert sorted(pleg._watched) == [base / "kubepods", base / "kubepods/besteffort"]
        (base / "kubepods/burstable/pod3").mkdir(parents=True)
        pleg._rescan()
        assert base / "kubepods/burstable/pod3" in pleg._watched  # the QoS dir made again: watched again
    finally:
        pleg._inotify.close()
