"""koordlet as users run it, for fault tests: a real koordlet process, pods run on the real
containerd under a private kube dir and listed by a kubelet ``/pods`` stand-in, Node,
NodeSLO and NodeMetric as files, the metric cache on a path of the test's choosing.

A fault test breaks one thing under the running process (cgroup dirs vanishing under
listed pods, a full disk) and watches the NodeMetric file for what a scheduler would see.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from koord.hookapi import parse_quantity
from koord_testing.cgroups import Cgroup, enable_v2_controllers, remove_tree
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.kubeletpods import KubeletPodsServer, pod_json
from koord_testing.workloads import hold_command

MiB = 2**20
REPORT_SECONDS, AGGREGATE_SECONDS = 1, 3
"""A report a second averaging the last three: a change of a pod's memory shows within a
few seconds, so "not within ten report intervals" is a clear failure."""


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def node_files(workdir: Path, name: str) -> tuple[Path, Path, Path]:
    """The Node, NodeSLO and NodeMetric files koordlet reads (a report every
    ``REPORT_SECONDS`` over ``AGGREGATE_SECONDS``), written in ``workdir``."""
    node_file, slo_file, metric_file = workdir / "node.json", workdir / "nodeslo.json", workdir / "nodemetric.json"
    write_json(node_file, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                           "status": {"capacity": {"cpu": "2", "memory": "8Gi"},
                                      "allocatable": {"cpu": "2", "memory": "8Gi"},
                                      "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}})
    write_json(slo_file, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                          "metadata": {"name": name}, "spec": {}})
    write_json(metric_file, {
        "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": REPORT_SECONDS,
                                         "aggregateDurationSeconds": AGGREGATE_SECONDS}}})
    return node_file, slo_file, metric_file


def pod_memory(metric_file: Path) -> dict[str, float]:
    """Each reported pod's memory (bytes) by pod name, from a NodeMetric file."""
    status = (json.loads(metric_file.read_text()) or {}).get("status") or {}
    return {m["name"]: float(parse_quantity(m["podUsage"]["resources"]["memory"]))
            for m in status.get("podsMetric") or []}


@dataclass
class Pod:
    name: str
    sandbox: str
    uid: str
    cgroup: Cgroup
    listed: dict[str, Any]


@dataclass
class FaultNode:
    containerd: Containerd
    kubelet: KubeletClient
    kube: str
    workdir: Path
    server: KubeletPodsServer
    koordlet: KoordletProcess | None = None
    pods: dict[str, Pod] = field(default_factory=dict)

    @property
    def node_metric_file(self) -> Path:
        return self.workdir / "nodemetric.json"

    def run_pod(self, name: str, hold_mib: int) -> Pod:
        """A BestEffort pod whose one container holds ``hold_mib`` MiB, listed by the stand-in."""
        sandbox = self.kubelet.run_pod(name, labels={"koordinator.sh/qosClass": "BE"}, qos="besteffort",
                                       kube_dir=self.kube)
        cid = self.kubelet.run_container(sandbox, "hold", self.containerd.image, command=hold_command(hold_mib))
        listed = pod_json(self.kubelet, sandbox, {"hold": cid}, qos="besteffort")
        pod = Pod(name, sandbox, listed["metadata"]["uid"], Cgroup.of_pod(self.kubelet.pod_cgroup_parent(sandbox)),
                  listed)
        self.pods[name] = pod
        self.server.pods = [p.listed for p in self.pods.values()]
        return pod

    def hold_more(self, pod: Pod, mib: int) -> None:
        """A second container in the pod holding ``mib`` MiB more, listed by kubelet too."""
        cid = self.kubelet.run_container(pod.sandbox, "more", self.containerd.image, command=hold_command(mib))
        containers = {c["name"]: c["containerID"].partition("://")[2]
                      for c in pod.listed["status"]["containerStatuses"]}
        pod.listed = pod_json(self.kubelet, pod.sandbox, {**containers, "more": cid}, qos="besteffort")
        self.server.pods = [p.listed for p in self.pods.values()]

    def vanish(self, pod: Pod) -> None:
        """The pod's containers stopped and its cgroup dirs removed, as a teardown does, while
        kubelet's list still shows it running."""
        self.kubelet.stop_pod(pod.sandbox)
        self.kubelet.remove_pod(pod.sandbox)  # removes the cgroup tree too
        assert not remove_tree(pod.cgroup.rel), f"cgroup dirs of {pod.name} stayed"
        assert not pod.cgroup.exists()

    def start_koordlet(self, *args: str, tsdb: Path | None = None) -> KoordletProcess:
        node_file, slo_file, metric_file = node_files(self.workdir, "fault-node")
        self.koordlet = KoordletProcess(self.workdir / "koordlet", [
            "--cgroup-kube-dir", self.kube, "--cgroup-driver", "cgroupfs",
            "--containerd-endpoint", self.containerd.endpoint,
            "--node-file", str(node_file), "--node-slo-file", str(slo_file),
            "--node-metric-file", str(metric_file),
            "--pods-source", "kubelet", "--kubelet-insecure-tls", "--kubelet-read-only-port", str(self.server.port),
            "--kubelet-sync-interval", "500ms", "--collect-res-used-interval", "1s",
            *args])
        if tsdb is not None:
            command = self.koordlet.command
            command[command.index("--tsdb-path") + 1] = str(tsdb)
        return self.koordlet.start()

    def pod_memory(self) -> dict[str, float]:
        return pod_memory(self.node_metric_file)

    def logs(self) -> str:
        return self.koordlet.logs(tail=300) if self.koordlet else ""


class RigNode(Protocol):
    koordlet: KoordletProcess | None
    server: KubeletPodsServer

    def logs(self) -> str: ...


def shut_down(node: RigNode) -> None:
    """koordlet stopped (its log printed for a failing test) and the kubelet stand-in closed."""
    if node.koordlet is not None:
        rc = node.koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{node.logs()}")
    node.server.close()


def dump(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=200)


@pytest.fixture
def fault_node(containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> Iterator[FaultNode]:
    kube = f"koordfault-{uuid.uuid4().hex[:8]}/kubepods"
    enable_v2_controllers(f"{kube}/besteffort")
    server = KubeletPodsServer()
    node = FaultNode(containerd, kubelet, kube, tmp_path, server)
    try:
        yield node
    finally:
        shut_down(node)
        errors = kubelet.cleanup()
        stayed = remove_tree(kube.split("/")[0])
        assert not errors and not stayed, (errors, stayed)


def fill(path: Path) -> None:
    """Writes ``path`` until its filesystem has no byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own: filling it fills nothing else."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
