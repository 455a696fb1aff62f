"""koordlet as a drop-in for upstream's: started with the container arguments of upstream's
``config/manager/koordlet.yaml`` verbatim (paths that must exist moved to temp dirs), its
API server found through ``$KUBECONFIG``, its pods and the kubelet's configuration read from
an HTTPS kubelet endpoint with the API client's token, this machine's real /sys.

1. Without Koordinator's CRDs (404 for NodeSLO, NodeMetric, NodeResourceTopology) it becomes
   ready with defaults and says so once per kind.
2. With them, it reports a NodeMetric status and a NodeResourceTopology that validate
   against upstream's CRD schemas, with annotations matching this machine's /sys and the
   kubelet's state file; deploy/'s RBAC grants every request it made.
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from koord.hookapi import format_cpuset, parse_cpuset, parse_quantity
from koord_testing import crds, rbac
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.fakekubelet import FakeKubelet
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubeapi import NODEMETRICS, NODERESOURCETOPOLOGIES, NODES, FakeKubeAPI
from koord_testing.sockets import make_short_socket_dir
from koord_testing.wait import wait_for

pytestmark = pytest.mark.e2e

NODE = "e2e-node"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "koordlet.yaml"
SYS = Path("/sys/devices/system")


def upstream_args(cgroup_root: Path, hook_socket: Path) -> list[str]:
    """upstream config/manager/koordlet.yaml's args; only the two paths that must exist here differ."""
    return [
        f"-cgroup-root-dir={cgroup_root}/",
        "-feature-gates=AllAlpha=true,AllBeta=true",
        "-runtime-hooks-network=unix",
        f"-runtime-hooks-addr={hook_socket}",
        "-runtime-hooks-host-endpoint=/var/run/koordlet//koordlet.sock",
        "--logtostderr=true",
        "--v=4",
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_cpus() -> list[dict]:
    """This machine's CPUs from /sys, read here independently of koordlet."""
    node_of = {}
    for node_dir in SYS.glob("node/node[0-9]*"):
        for cpu in parse_cpuset((node_dir / "cpulist").read_text().strip()):
            node_of[cpu] = int(node_dir.name[4:])
    cpus = []
    for cpu_dir in sorted(SYS.glob("cpu/cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        topo = cpu_dir / "topology"
        cpus.append({"id": int(cpu_dir.name[3:]), "socket": int((topo / "physical_package_id").read_text()),
                     "core_id": int((topo / "core_id").read_text()), "node": node_of.get(int(cpu_dir.name[3:]), 0)})
    return cpus


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Machine:
    """Everything a koordlet run needs around it: temp dirs, API server, kubelet."""

    def __init__(self, tmp: Path, api: FakeKubeAPI, kubelet: FakeKubelet) -> None:
        self.tmp, self.api, self.kubelet = tmp, api, kubelet
        self.cgroup = tmp / "cgroup"
        make_fake_v1_cgroup(self.cgroup, "kubepods/besteffort")
        make_fake_v1_cgroup(self.cgroup, "kubepods/burstable")
        self.kubelet_dir = tmp / "var-lib-kubelet"
        self.kubelet_dir.mkdir()
        self.sockdir = make_short_socket_dir("kl-up-")
        self.port = free_port()

    def koordlet(self, name: str) -> KoordletProcess:
        workdir = self.tmp / name
        args = [*upstream_args(self.cgroup, self.sockdir / f"{name}.sock"),
                # where upstream's DaemonSet mounts host dirs at its default paths, this machine has temp dirs
                f"-runtime-hooks-config-path={workdir / 'hookserver.d'}", f"-tsdb-path={workdir / 'tsdb'}",
                f"-addr=127.0.0.1:{self.port}", f"-var-lib-kubelet-dir={self.kubelet_dir}",
                f"-containerd-endpoint={self.tmp / 'no-containerd.sock'}"]
        env = {"NODE_NAME": NODE, "KUBECONFIG": str(self.api.write_kubeconfig(self.tmp / "kubeconfig"))}
        return KoordletProcess(workdir, args, own_flags=False, env=env)


def pod(name: str, uid: str, qos_class: str, labels=None, annotations=None) -> dict:
    resources = {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}
    return {"metadata": {"name": name, "namespace": "default", "uid": uid, "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": resources}]},
            "status": {"phase": "Running", "qosClass": qos_class, "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{uid}-c", "state": {"running": {}}}]}}


@pytest.fixture
def machine(tmp_path):
    cpus = machine_cpus()
    last = cpus[-1]["id"]
    pods = [pod("guaranteed", "g-uid", "Guaranteed"),
            pod("lsr", "lsr-uid", "Guaranteed", labels={"koordinator.sh/qosClass": "LSR"},
                annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0"})})]
    config = {"cpuManagerPolicy": "static", "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
              "reservedSystemCPUs": "0", "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod"}
    with FakeKubeAPI(crds=False) as api, FakeKubelet(tmp_path, pods, config) as kubelet:
        m = Machine(tmp_path, api, kubelet)
        (m.kubelet_dir / "cpu_manager_state").write_text(json.dumps({
            "policyName": "static", "defaultCPUSet": format_cpuset(c["id"] for c in cpus[:-1]),
            "entries": {"g-uid": {"main": str(last)}}, "checksum": 1}))
        api.put(NODES, {"metadata": {"name": NODE, "uid": "node-uid"},
                        "status": {**kubelet.node_status(), "capacity": {"cpu": str(len(cpus)), "memory": "8Gi"},
                                   "allocatable": {"cpu": str(len(cpus)), "memory": "8Gi"}}})
        try:
            yield m
        finally:
            shutil.rmtree(m.sockdir, ignore_errors=True)


def test_upstream_manifest_arguments_run_report_and_stay_within_rbac(machine):
    api, kubelet = machine.api, machine.kubelet

    # 1. no Koordinator CRDs: ready with defaults, one line per kind not served
    first = machine.koordlet("no-crds").start()
    try:
        wait_for(lambda: ready(machine.port), "/readyz 200 without the CRDs", timeout=60)
        wait_for(lambda: "does not serve NodeResourceTopology" in first.logs(400), "the NRT 404 noticed", timeout=30)
        logs = first.logs(2000)
    finally:
        assert first.stop() == 0, first.logs()
    for kind in ("NodeSLO", "NodeMetric", "NodeResourceTopology"):
        assert logs.count(f"does not serve {kind} ") == 1, logs
    assert logs.count("feature gates enabled but not implemented here") == 1
    assert "pods from kubelet" in logs and "flag provided but not defined" not in logs

    # 2. with the CRDs and a NodeMetric from the manager: both objects reported
    api.crds = True
    api.put(NODEMETRICS, {"metadata": {"name": NODE}, "spec": {"metricCollectPolicy": {
        "aggregateDurationSeconds": 10, "reportIntervalSeconds": 2, "nodeAggregatePolicy": {"durations": ["16s"]}}}})
    second = machine.koordlet("with-crds").start()
    try:
        nrt = wait_for(lambda: api.objects[NODERESOURCETOPOLOGIES].get(NODE), "the NodeResourceTopology", timeout=60)
        wait_for(lambda: api.status_updates, "a NodeMetric status", timeout=60)
        nrt = wait_for(lambda: api.objects[NODERESOURCETOPOLOGIES][NODE] if "zones" in api.objects[
            NODERESOURCETOPOLOGIES][NODE] and api.objects[NODERESOURCETOPOLOGIES][NODE]["zones"] else None,
            "the NodeResourceTopology's zones", timeout=30)
        node_metric = api.objects[NODEMETRICS][NODE]
    finally:
        assert second.stop() == 0, second.logs()

    assert crds.errors("NodeResourceTopology", nrt) == []
    assert crds.errors("NodeMetric", node_metric) == []
    assert parse_quantity(node_metric["status"]["nodeMetric"]["nodeUsage"]["resources"]["memory"]) > 0

    cpus = machine_cpus()
    a = nrt["metadata"]["annotations"]
    detail = json.loads(a["node.koordinator.sh/cpu-topology"])["detail"]
    assert [(c["id"], c["socket"], c["node"]) for c in detail] == [(c["id"], c["socket"], c["node"]) for c in cpus]
    same_core = {(c["socket"], c["core_id"]) for c in cpus}
    assert len({c["core"] for c in detail}) == len(same_core)  # threads of one core share its number
    assert json.loads(a["kubelet.koordinator.sh/cpu-manager-policy"]) == {
        "policy": "static", "options": {"full-pcpus-only": "true"}, "reservedCPUs": "0"}
    last = cpus[-1]["id"]
    assert json.loads(a["node.koordinator.sh/pod-cpu-allocs"]) == [
        {"namespace": "default", "name": "guaranteed", "uid": "g-uid", "cpuset": str(last), "managedByKubelet": True}]

    def pools(exclude: set[int]) -> list[dict] | None:
        by_node: dict[int, list[dict]] = {}
        for c in cpus:
            if c["id"] not in exclude:
                by_node.setdefault(c["node"], []).append(c)
        found = [{"socket": group[0]["socket"], "node": n, "cpuset": format_cpuset(c["id"] for c in group)}
                 for n, group in sorted(by_node.items())]
        return found or None
    assert json.loads(a["node.koordinator.sh/cpu-shared-pools"]) == pools({0, last})  # LSR-bound and kubelet's
    assert json.loads(a["node.koordinator.sh/be-cpu-shared-pools"]) == pools({last})  # BE shares LSR's cpus
    assert json.loads(a["node.koordinator.sh/cpu-basic-info"]).get("cpuModel")
    assert nrt["topologyPolicies"] == ["SingleNUMANodePodLevel"]
    for zone in nrt["zones"]:
        node_id = int(zone["name"].removeprefix("node-"))
        resources = {r["name"]: parse_quantity(r["capacity"]) for r in zone["resources"]}
        assert resources["cpu"] == sum(1 for c in cpus if c["node"] == node_id)
        meminfo = (SYS / f"node/node{node_id}/meminfo").read_text().split("MemTotal:")[1].split()[0]
        # A NUMA node's MemTotal moves where memory is hot-plugged (virtio-mem on these VMs):
        # the zone holds the node's total as read when it was reported, within 5 %.
        total = int(meminfo) * 1024
        assert abs(resources["memory"] - total) <= total // 20, (resources["memory"], total)

    # the kubelet was asked with the API client's credentials, upstream's way
    assert {"/pods/", "/configz"} <= set(kubelet.paths) and set(kubelet.tokens) == {"Bearer t"}
    role = next(d for d in yaml.safe_load_all(DEPLOY.read_text()) if d and d["kind"] == "ClusterRole")
    needed = {rbac.permission(verb, path) for verb, path in api.requests}
    needed |= {rbac.kubelet_permission(path) for path in kubelet.paths}
    assert ("topology.node.k8s.io", "noderesourcetopologies", "create") in needed
    assert rbac.missing(needed, role) == []
