"""The e2e infrastructure itself: a kubelet-shaped lifecycle straight against the private containerd."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as cri

from koord_testing.cgroups import Cgroup, shares_to_weight
from koord_testing.containerd import Containerd, mounts_under
from koord_testing.image import image_archive_bytes
from koord_testing.kubelet import KubeletClient
from koord_testing.runtimes import ContainerdRuntime

pytestmark = pytest.mark.e2e


@pytest.mark.cgroup
def test_direct_lifecycle(containerd: Containerd, kubelet: KubeletClient) -> None:
    uid = str(uuid.uuid4())
    sandbox_id = kubelet.run_pod("fixture-pod", namespace="e2e", uid=uid, qos="burstable")
    parent = kubelet.pod_cgroup_parent(sandbox_id)
    assert parent == f"/kubepods/burstable/pod{uid}"

    pod = kubelet.pod_status(sandbox_id).status
    assert pod.state == cri.SANDBOX_READY
    assert pod.metadata.uid == uid
    assert pod.labels["io.kubernetes.pod.namespace"] == "e2e"

    container_id = kubelet.create_container(
        sandbox_id, "app", containerd.image, envs={"KOORD_E2E": "yes"}, resources={"cpu_shares": 1024}
    )
    kubelet.start_container(container_id)
    assert kubelet.container_status(container_id).status.state == cri.CONTAINER_RUNNING
    cg = Cgroup.of_container(parent, container_id)
    assert cg.exists()

    result = kubelet.exec_sync(container_id, ["/pause", "env"])
    assert result.exit_code == 0
    assert "KOORD_E2E=yes" in result.stdout.decode().splitlines()

    assert cg.cpu_weight() == shares_to_weight(1024)
    kubelet.update_resources(container_id, {"cpu_shares": 333, "cpu_quota": 50000, "cpu_period": 100000})
    assert cg.cpu_weight() == shares_to_weight(333)
    assert cg.cpu_max() == (50000, 100000)

    kubelet.stop_container(container_id, grace=2)
    assert kubelet.container_status(container_id).status.state == cri.CONTAINER_EXITED
    kubelet.remove_container(container_id)
    kubelet.stop_pod(sandbox_id)
    kubelet.remove_pod(sandbox_id)
    listed = kubelet.runtime.ListPodSandbox(cri.ListPodSandboxRequest()).items
    assert sandbox_id not in {p.id for p in listed}


def test_pause_binary_commands(containerd: Containerd, kubelet: KubeletClient) -> None:
    sandbox_id = kubelet.run_pod("pause-cmds")
    container_id = kubelet.run_container(sandbox_id, "app", containerd.image)
    echo = kubelet.exec_sync(container_id, ["/pause", "echo", "a", "b c"])
    assert echo.stdout == b"a b c\n"
    assert kubelet.exec_sync(container_id, ["/pause", "exit", "7"]).exit_code == 7
    assert kubelet.exec_sync(container_id, ["/pause", "big", "100000"]).stdout == b"x" * 100000
    cat = kubelet.exec_sync(container_id, ["/pause", "cat", "/proc/self/cgroup"])
    assert container_id in cat.stdout.decode()
    assert kubelet.exec_sync(container_id, ["/pause", "cat", "/nonexistent"]).exit_code == 1


def test_image_archive_is_reproducible() -> None:
    assert image_archive_bytes(b"bin", "x/y:z") == image_archive_bytes(b"bin", "x/y:z")
    assert image_archive_bytes(b"bin", "x/y:z") != image_archive_bytes(b"bin2", "x/y:z")


def test_stop_cleans_mounts_processes_and_cgroups(tmp_path: Path, containerd_runtime: ContainerdRuntime) -> None:
    """A second containerd torn down with a running pod leaves nothing behind."""
    with Containerd(tmp_path / "ctd", runtime=containerd_runtime) as instance:
        client = instance.client()
        sandbox_id = client.run_pod("leftover")
        client.run_container(sandbox_id, "app", instance.image)
        parent = client.pod_cgroup_parent(sandbox_id)
        pod_dir = Cgroup.of_pod(parent).dir("cpu")
        assert pod_dir.is_dir()
        assert mounts_under(instance.workdir)
        client.close()
    assert not mounts_under(instance.workdir)
    assert not pod_dir.exists()
    assert not any(str(instance.workdir).encode() in cmdline for cmdline in _cmdlines())


def test_stop_cleans_up_after_containerd_crash(tmp_path: Path, containerd_runtime: ContainerdRuntime) -> None:
    """Cleanup can't rely on CRI: containerd died with a pod running (a failed test)."""
    instance = Containerd(tmp_path / "ctd", runtime=containerd_runtime).start()
    try:
        client = instance.client()
        sandbox_id = client.run_pod("crashed")
        client.run_container(sandbox_id, "app", instance.image)
        pod_dir = Cgroup.of_pod(client.pod_cgroup_parent(sandbox_id)).dir("memory")
        client.close()
        assert instance.pid is not None
        os.kill(instance.pid, signal.SIGKILL)
    finally:
        instance.stop()
    assert not mounts_under(instance.workdir)
    assert not pod_dir.exists()
    assert not any(f"{instance.workdir}/".encode() in cmdline for cmdline in _cmdlines())


def _cmdlines() -> list[bytes]:
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes())
        except OSError:
            continue
    return found
