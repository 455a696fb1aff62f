"""CPU QoS on a mainline kernel, end to end: koordlet as a process against real containerd +
runc pods, NodeSLO and Node from files, values read back from the real cgroup files through
``koord.testing.cgroups`` (so the same tests run in the cgroup v2 lane).

Pods live under the test's own kube dir (``koordtest-<id>/kubepods``, koordlet's
``--cgroup-kube-dir``), so nothing here touches other tests' pods or a real kubelet's.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from koord.testing.cgroups import Cgroup, enable_v2_controllers, remove_tree
from koord.testing.containerd import Containerd
from koord.testing.koordlet import KoordletProcess
from koord.testing.kubelet import KubeletClient
from koord.testing.wait import wait_for
from koord.testing.workloads import burn_command

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]

QOS = "koordinator.sh/qosClass"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"
T = TypeVar("T")


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def batch_spec(milli: int) -> str:
    amounts = {"kubernetes.io/batch-cpu": str(milli), "kubernetes.io/batch-memory": "256Mi"}
    return json.dumps({"containers": {"main": {"requests": amounts, "limits": amounts}}})


def settled(predicate: Callable[[], T]) -> Callable[[], T | None]:
    """``predicate`` with a cgroup file that is not there yet counted as "not yet"."""
    def check() -> T | None:
        try:
            return predicate()
        except (OSError, ValueError):
            return None
    return check


@dataclass
class QoSNode:
    """One test's private kube dir, its NodeSLO/Node files and a koordlet watching them."""

    kube: str
    workdir: Path
    containerd: Containerd
    kubelet: KubeletClient
    slo_file: Path
    node_file: Path
    koordlet: KoordletProcess | None = None

    def slo(self, spec: dict[str, Any]) -> None:
        write_json(self.slo_file, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                                   "metadata": {"name": "test-node"}, "spec": spec})

    def start_koordlet(self, *args: str) -> KoordletProcess:
        self.koordlet = KoordletProcess(self.workdir / "koordlet", [
            "--cgroup-kube-dir", self.kube, "--cgroup-driver", "cgroupfs",
            "--node-slo-file", str(self.slo_file), "--node-file", str(self.node_file),
            "--containerd-endpoint", self.containerd.endpoint,
            "--runtime-hooks-reconcile-interval", "500ms", *args]).start()
        return self.koordlet

    def run_pod(self, name: str, kube_qos: str, koord_qos: str, command: list[str], *,
                annotations: dict[str, str] | None = None,
                resources: dict[str, int] | None = None) -> tuple[Cgroup, Cgroup]:
        """A pod with one container ``main``: (pod cgroup, container cgroup)."""
        sandbox = self.kubelet.run_pod(f"{name}-{uuid.uuid4().hex[:6]}", labels={QOS: koord_qos},
                                       annotations=annotations, qos=kube_qos, kube_dir=self.kube)
        cid = self.kubelet.run_container(sandbox, "main", self.containerd.image, command=command,
                                         resources=resources)
        parent = self.kubelet.pod_cgroup_parent(sandbox)
        return Cgroup.of_pod(parent), Cgroup.of_container(parent, cid)

    def logs(self) -> str:
        return self.koordlet.logs(tail=2000) if self.koordlet else ""


@pytest.fixture
def qos_node(containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> Iterator[QoSNode]:
    kube = f"koordtest-{uuid.uuid4().hex[:8]}/kubepods"
    for qos_dir in ("besteffort", "burstable"):
        enable_v2_controllers(f"{kube}/{qos_dir}")
    cpus = os.cpu_count() or 1
    node_file = tmp_path / "node.json"
    write_json(node_file, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"},
                           "status": {"capacity": {"cpu": str(cpus), "memory": "8Gi"},
                                      "allocatable": {"cpu": str(cpus), "memory": "8Gi"}}})
    node = QoSNode(kube, tmp_path, containerd, kubelet, tmp_path / "nodeslo.json", node_file)
    node.slo({})
    try:
        yield node
    finally:
        rc = node.koordlet.stop() if node.koordlet else None
        print(f"--- koordlet log (exit {rc}) ---\n{node.logs()[-20000:]}")
        containerd.remove_pods_of(kubelet)
        remove_tree(kube.split("/")[0])
        assert rc in (None, 0), "koordlet must exit 0 on SIGTERM"


# ---- BatchResource follows NodeSLO's cfs-quota suppress -------------------------------------

def test_cfs_quota_suppress_goes_below_a_be_pods_own_limit(qos_node: QoSNode) -> None:
    """A BE pod's batch limit (50000) no longer floors the besteffort quota: under cfsQuota
    suppress the pod and its container get -1, suppress holds 2000 without one EINVAL, and
    the pod's limit comes back when suppress is turned off."""
    node = qos_node
    suppress = {"resourceUsedThresholdWithBE": {
        "enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 0}}
    besteffort = Cgroup(f"{node.kube}/besteffort")
    node.start_koordlet()
    pod, container = node.run_pod("be", "besteffort", "BE", burn_command(1),
                                  annotations={EXTENDED_SPEC: batch_spec(500)}, resources={"cpu_shares": 2})
    wait_for(settled(lambda: container.cpu_quota() == 50000 and pod.cpu_quota() == 50000),
             "the BE pod at its batch limit 50000 (suppress off)")

    node.slo(suppress)
    wait_for(settled(lambda: besteffort.cpu_quota() == 2000), "besteffort suppressed to 2000", 60)
    assert (pod.cpu_quota(), container.cpu_quota()) == (-1, -1)
    # it holds: the reconciler and suppress keep running and nothing moves
    for _ in range(6):
        time.sleep(0.5)
        assert (besteffort.cpu_quota(), pod.cpu_quota(), container.cpu_quota()) == (2000, -1, -1)
    used_before, t0 = besteffort.cpu_usage_ns(), time.monotonic()
    time.sleep(2)
    cores = (besteffort.cpu_usage_ns() - used_before) / 1e9 / (time.monotonic() - t0)
    periods, throttled = besteffort.throttling()
    print(f"under suppress: besteffort quota 2000 (0.02 cores), BE pods used {cores:.3f} cores, "
          f"throttled in {throttled} of {periods} periods")
    assert throttled > 0 and cores < 0.1, "the 1-core BE burner is held by the besteffort quota"

    node.slo({})
    wait_for(settled(lambda: besteffort.cpu_quota() == -1 and pod.cpu_quota() == 50000
                     and container.cpu_quota() == 50000),
             "suppress off: besteffort -1 and the BE pod back at 50000", 60)
    logs = node.logs()
    assert "EINVAL" not in logs and "Invalid argument" not in logs, "no write was refused"
