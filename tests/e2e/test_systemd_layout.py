"""Pods in kubelet's systemd-driver layout, the one kubelet normally uses on cgroup v2:
``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope``.

containerd runs its systemd cgroup driver (through ``koord_testing.runc_systemd``, since no
systemd runs here), kubelet's side sends systemd parents, and one koordlet process with
``--cgroup-driver systemd`` must find and write every level: the reconciler's cpuset and
batch resources, the pod-level quota of a cpuset pod, the metrics advisor's usage in the
NodeMetric, and BE suppress on the besteffort slice. Runs in both cgroup lanes.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from koord.hookapi import parse_quantity
from koord_testing import klogparse
from koord_testing.cgroups import Cgroup, PodLimits, shares_to_weight
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.runtimes import ContainerdRuntime
from koord_testing.wait import wait_for
from koord_testing.workloads import burn_command

from .qos_rig import write_json

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]

QOS = "koordinator.sh/qosClass"
# No batch-cpu limit: the BE pod keeps no CFS quota of its own, so suppress may take the
# besteffort slice below what a limit would be (v1 refuses a parent quota below a child's).
BATCH_SPEC = json.dumps({"containers": {"main": {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"},
    "limits": {"kubernetes.io/batch-memory": "2Gi"}}}})
PERIOD = 100000


@pytest.fixture(scope="module")
def systemd_containerd(
    tmp_path_factory: pytest.TempPathFactory, containerd_runtime: ContainerdRuntime
) -> Iterator[Containerd]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root: they run containerd/runc and write cgroups", pytrace=False)
    instance = Containerd(tmp_path_factory.mktemp("containerd-systemd"), cgroup_driver="systemd",
                          runtime=containerd_runtime)
    try:
        yield instance.start()
    finally:
        instance.stop()


@pytest.fixture
def kubelet(systemd_containerd: Containerd) -> Iterator[KubeletClient]:
    client = KubeletClient(systemd_containerd.endpoint, on_pod_created=systemd_containerd.track_pod_cgroup,
                           log_root=systemd_containerd.workdir / "pod-logs")
    client.kube_dir = "kubepods.slice"  # kubelet's systemd driver names
    yield client
    systemd_containerd.remove_pods_of(client)


def test_koordlet_finds_and_writes_every_level_of_the_systemd_layout(
        systemd_containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> None:
    image = systemd_containerd.image
    lsr = kubelet.run_pod(f"lsr-{uuid.uuid4().hex[:6]}", labels={QOS: "LSR"}, qos="guaranteed",
                          annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"0"}'},
                          pod_limits=PodLimits(cpu_shares=1024, cpu_quota=PERIOD))
    lsr_cid = kubelet.run_container(lsr, "main", image, resources={"cpu_period": PERIOD, "cpu_quota": PERIOD})
    be = kubelet.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"}, qos="besteffort",
                         annotations={"node.koordinator.sh/extended-resource-spec": BATCH_SPEC})
    be_cid = kubelet.run_container(be, "main", image, command=burn_command(1), resources={"cpu_shares": 2})

    lsr_parent, be_parent = kubelet.pod_cgroup_parent(lsr), kubelet.pod_cgroup_parent(be)
    assert lsr_parent.endswith(".slice") and "/kubepods.slice/kubepods-besteffort.slice/" in be_parent
    lsr_ctr, be_ctr = Cgroup.of_container(lsr_parent, lsr_cid), Cgroup.of_container(be_parent, be_cid)
    lsr_pod, be_pod = Cgroup.of_pod(lsr_parent), Cgroup.of_pod(be_parent)
    assert be_ctr.rel.endswith(f"/cri-containerd-{be_cid}.scope") and be_ctr.exists(), \
        "containers sit in systemd's scope dirs"
    assert lsr_pod.cpu_quota() == PERIOD and lsr_ctr.cpuset_cpus() != "0"

    cpus = os.cpu_count() or 1
    node_file, slo_file, node_metric = tmp_path / "node.json", tmp_path / "nodeslo.json", tmp_path / "nm.yaml"
    write_json(node_file, {"metadata": {"name": "systemd-node"},
                           "status": {"capacity": {"cpu": str(cpus), "memory": "8Gi"},
                                      "allocatable": {"cpu": str(cpus), "memory": "8Gi"}}})
    write_json(slo_file, {"metadata": {"name": "systemd-node"}, "spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 65}}})
    node_metric.write_text("apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeMetric\nmetadata: {name: n}\n"
                           "spec:\n  metricCollectPolicy: {reportIntervalSeconds: 2, aggregateDurationSeconds: 10}\n")
    koordlet = KoordletProcess(tmp_path / "koordlet", [
        "--cgroup-driver", "systemd", "--containerd-endpoint", systemd_containerd.endpoint,
        "--runtime-hooks-reconcile-interval", "500ms", "--kubelet-sync-interval", "1s",
        "--node-file", str(node_file), "--node-slo-file", str(slo_file),
        "--node-metric-file", str(node_metric), "--collect-res-used-interval", "1s"]).start()
    try:
        tolerate = (OSError, ValueError, KeyError, TypeError)
        wait_for(lambda: lsr_ctr.cpuset_cpus() == "0", "the reconciler to pin the LSR container", tolerate=tolerate)
        wait_for(lambda: lsr_pod.cpu_quota() == -1, "the LSR pod-level quota unset", tolerate=tolerate)
        assert lsr_ctr.cpu_quota() == -1
        wait_for(lambda: be_ctr.cpu_weight() == shares_to_weight(512), "BE batch shares on the container scope")
        assert be_ctr.memory_limit() == 2 << 30
        assert be_pod.cpu_weight() == shares_to_weight(512)

        def be_pod_usage() -> object:
            status = (yaml.safe_load(node_metric.read_text()) or {}).get("status") or {}
            for m in status.get("podsMetric") or []:
                if m["name"].startswith("be-"):
                    cpu = parse_quantity(m["podUsage"]["resources"]["cpu"])
                    # Any usage at all: the point is that it is read from the scope's files (a busy
                    # machine may leave a BE burner little CPU).
                    return cpu if cpu > 0 else None
            return None

        usage = wait_for(be_pod_usage, "the NodeMetric to show the BE burner's usage from its scope", 60,
                         tolerate=tolerate)
        print(f"NodeMetric: BE pod uses {float(usage):.3f} cores")

        besteffort = Cgroup("kubepods.slice/kubepods-besteffort.slice")
        wait_for(lambda: 0 < besteffort.cpu_quota() <= cpus * PERIOD * 65 // 100,
                 "BE suppress to write the besteffort slice's quota", 60, tolerate=tolerate)
        print(f"besteffort slice quota {besteffort.cpu_quota()} (capacity x 65% = {cpus * PERIOD * 65 // 100})")
        assert not klogparse.error_lines(koordlet.logs(tail=400))
    finally:
        koordlet.stop()
        print(f"--- koordlet log ---\n{koordlet.logs(tail=150)}")
