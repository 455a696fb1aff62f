"""koordlet over a cgroup tree of plain files, as a fault suite without a container runtime
runs it: pods listed by a kubelet ``/pods`` stand-in, their cgroup files written by the
test (each change an atomic replace, as a careful writer of such a tree makes it), Node,
NodeSLO and NodeMetric as files.

What a plain file allows and cgroupfs does not (a file replaced under an open descriptor,
a removed file still readable through one) is exactly what this rig exercises; the real
cgroup faults are in ``fault_rig``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koord_testing.cgroupfs import make_fake_v1_cgroup, memory_stat_text, write_usage
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubeletpods import KubeletPodsServer

from .fault_rig import MiB, node_files, pod_memory, shut_down

V1_SUBSYSTEMS = ("cpu", "cpuacct", "cpuset", "memory")


@dataclass
class PlainPod:
    name: str
    uid: str
    container: str

    @property
    def rel(self) -> str:
        return f"kubepods/besteffort/pod{self.uid}"


@dataclass
class PlainTreeNode:
    workdir: Path
    server: KubeletPodsServer
    koordlet: KoordletProcess | None = None
    pods: list[PlainPod] = field(default_factory=list)
    _cpu_ns: int = 10**9

    @property
    def root(self) -> Path:
        return self.workdir / "cgroup"

    def add_pods(self, count: int, mib: int) -> list[PlainPod]:
        """``count`` BestEffort pods each holding ``mib`` MiB, listed by the stand-in."""
        new = [PlainPod(f"pod-{len(self.pods) + i:02d}", str(uuid.uuid4()), uuid.uuid4().hex)
               for i in range(count)]
        self.pods += new
        for pod in new:
            make_fake_v1_cgroup(self.root, f"{pod.rel}/{pod.container}")
            self.set_memory(pod, mib)
        self.server.pods = [{
            "metadata": {"name": p.name, "namespace": "default", "uid": p.uid, "labels": {}, "annotations": {}},
            "spec": {"containers": [{"name": "c", "resources": {}}]},
            "status": {"phase": "Running", "qosClass": "BestEffort", "containerStatuses": [
                {"name": "c", "containerID": f"containerd://{p.container}", "state": {"running": {}}}]}}
            for p in self.pods]
        return new

    def set_memory(self, pod: PlainPod, mib: int) -> None:
        """The pod's and its container's files written anew, each by an atomic replace."""
        self._cpu_ns += 10**8
        staging = self.workdir / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        for rel in (pod.rel, f"{pod.rel}/{pod.container}"):
            write_usage(staging, rel, 1, cpu_ns=self._cpu_ns, memory_stat=memory_stat_text(1, mib * MiB))
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            target = self.root / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            path.replace(target)

    def vanish(self, pod: PlainPod) -> None:
        """The pod's dirs removed from every subsystem while the stand-in still lists it."""
        for subsystem in V1_SUBSYSTEMS:
            shutil.rmtree(self.root / subsystem / pod.rel, ignore_errors=True)
        assert not any((self.root / s / pod.rel).exists() for s in V1_SUBSYSTEMS)

    def start_koordlet(self, tsdb: Path | None = None) -> KoordletProcess:
        node_file, slo_file, metric_file = node_files(self.workdir, "plain-node")
        self.koordlet = KoordletProcess(self.workdir / "koordlet", [
            "--cgroup-root-dir", str(self.root), "--cgroup-driver", "cgroupfs",
            "--containerd-endpoint", str(self.workdir / "no-runtime.sock"),
            "--node-file", str(node_file), "--node-slo-file", str(slo_file), "--node-metric-file", str(metric_file),
            "--pods-source", "kubelet", "--kubelet-insecure-tls", "--kubelet-read-only-port", str(self.server.port),
            "--kubelet-sync-interval", "500ms", "--collect-res-used-interval", "1s"])
        if tsdb is not None:
            command = self.koordlet.command
            command[command.index("--tsdb-path") + 1] = str(tsdb)
        return self.koordlet.start()

    def pod_memory(self) -> dict[str, float]:
        return pod_memory(self.workdir / "nodemetric.json")

    def logs(self) -> str:
        return self.koordlet.logs(tail=300) if self.koordlet else ""


@pytest.fixture
def plain_tree_node(tmp_path: Path) -> Iterator[PlainTreeNode]:
    server = KubeletPodsServer()
    node = PlainTreeNode(tmp_path, server)
    make_fake_v1_cgroup(node.root, "kubepods/besteffort")
    for rel in ("kubepods", "kubepods/besteffort"):
        write_usage(node.root, rel, 1, cpu_ns=1, memory_stat=memory_stat_text(1, 1))
    try:
        yield node
    finally:
        shut_down(node)

