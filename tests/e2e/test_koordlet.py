"""koordlet end to end: with koord-runtime-proxy and real containerd (Proxy mode), alone against
containerd (Standalone mode), and a NodeSLO change reaching pods that already run."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from koord_testing import klogparse
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.cgroups import Cgroup, PodLimits, shares_to_weight
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy
from koord_testing.wait import wait_for as wait

pytestmark = pytest.mark.e2e
cgroup = pytest.mark.cgroup

WAIT = 30.0
QOS = "koordinator.sh/qosClass"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"
BATCH_SPEC = json.dumps({"containers": {"main": {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"},
    "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"}}}})
TWO_GI = 2 * 1024**3


def wait_for(predicate: Callable[[], object], what: str, timeout: float = WAIT) -> object:
    # a cgroup file not there yet
    return wait(predicate, what, timeout, tolerate=(OSError, ValueError))


@pytest.fixture
def koordlet_factory(tmp_path: Path) -> Iterator[Callable[..., KoordletProcess]]:
    started: list[KoordletProcess] = []

    def make(*args: str, name: str = "koordlet") -> KoordletProcess:
        k = KoordletProcess(tmp_path / name, args).start()
        started.append(k)
        return k

    yield make
    for k in started:
        rc = k.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{k.logs()}")
        assert rc == 0, "koordlet must exit 0 on SIGTERM"
        assert not (k.config_dir / "koordlet.json").exists(), "registration removed on shutdown"


@pytest.fixture
def proxied(containerd: Containerd, koordlet_factory, tmp_path: Path):
    """koordlet (Proxy mode only: reconciler off) + a proxy that read its registration at start."""
    koordlet = koordlet_factory("--runtime-hooks-reconcile-interval", "0",
                                "--containerd-endpoint", containerd.endpoint)
    proxy = RuntimeProxy(tmp_path / "proxy", containerd.endpoint, hook_config_dir=koordlet.config_dir)
    proxy.start()
    client = KubeletClient(proxy.endpoint, on_pod_created=containerd.track_pod_cgroup,
                           log_root=containerd.workdir / "pod-logs")
    try:
        yield client, koordlet
    finally:
        containerd.remove_pods_of(client)
        proxy.stop()
        print("--- runtime proxy log ---\n" + proxy.logs(tail=120))


def run_lsr_pod(client: KubeletClient, image: str) -> tuple[str, str]:
    sandbox = client.run_pod(f"lsr-{uuid.uuid4().hex[:6]}", labels={QOS: "LSR"},
                             annotations={RESOURCE_STATUS: '{"cpuset":"0"}'}, qos="guaranteed")
    container = client.run_container(sandbox, "main", image,
                                     resources={"cpu_period": 100000, "cpu_quota": 200000,
                                                "cpuset_cpus": "0-1"})
    return sandbox, container


def run_be_pod(client: KubeletClient, image: str) -> tuple[str, str]:
    sandbox = client.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                             annotations={EXTENDED_SPEC: BATCH_SPEC}, qos="besteffort")
    container = client.run_container(sandbox, "main", image, resources={"cpu_shares": 2})
    return sandbox, container


def test_proxy_mode_lsr_pod_gets_its_cpuset(containerd: Containerd, proxied) -> None:
    client, _ = proxied
    sandbox, container = run_lsr_pod(client, containerd.image)
    cg = Cgroup.of_container(client.pod_cgroup_parent(sandbox), container)
    assert cg.cpuset_cpus() == "0"
    assert cg.cpu_quota() == -1


def test_proxy_mode_be_pod_gets_batch_resources(containerd: Containerd, proxied) -> None:
    client, _ = proxied
    sandbox, container = run_be_pod(client, containerd.image)
    cg = Cgroup.of_container(client.pod_cgroup_parent(sandbox), container)
    assert cg.cpu_weight() == shares_to_weight(512)
    assert cg.cpu_max() == (50000, 100000)
    assert cg.memory_limit() == TWO_GI


@cgroup
def test_standalone_reconciler_writes_pods_created_without_proxy(
        containerd: Containerd, kubelet: KubeletClient, koordlet_factory) -> None:
    lsr_sandbox, lsr = run_lsr_pod(kubelet, containerd.image)
    be_sandbox, be = run_be_pod(kubelet, containerd.image)
    lsr_cg = Cgroup.of_container(kubelet.pod_cgroup_parent(lsr_sandbox), lsr)
    be_pod = Cgroup.of_pod(kubelet.pod_cgroup_parent(be_sandbox))
    be_cg = Cgroup.of_container(kubelet.pod_cgroup_parent(be_sandbox), be)
    # containerd applied what it was asked for: nothing of koordlet's yet
    assert lsr_cg.cpuset_cpus() == "0-1"
    assert be_cg.cpu_weight() == shares_to_weight(2)
    koordlet = koordlet_factory("--runtime-hooks-reconcile-interval", "500ms",
                                "--containerd-endpoint", "unix://" + containerd.endpoint)
    wait_for(lambda: lsr_cg.cpuset_cpus() == "0", "the reconciler to set the LSR cpuset")
    assert lsr_cg.cpu_quota() == -1
    wait_for(lambda: be_cg.cpu_weight() == shares_to_weight(512), "the reconciler to set BE shares")
    assert be_cg.cpu_max() == (50000, 100000)
    assert be_cg.memory_limit() == TWO_GI
    # the pod level too, which the proxy path cannot reach before the pod cgroup exists
    assert be_pod.cpu_weight() == shares_to_weight(512)
    assert not klogparse.error_lines(koordlet.logs(tail=400))


@cgroup
def test_cpuset_pod_loses_kubelets_pod_level_quota_through_proxy_and_reconciler(
        containerd: Containerd, koordlet_factory, tmp_path: Path) -> None:
    """kubelet creates a Guaranteed pod's cgroup with its CFS quota before any hook runs; a pod
    bound to cpus must not stay throttled there while its containers read "no quota"."""
    koordlet = koordlet_factory("--runtime-hooks-reconcile-interval", "500ms",
                                "--containerd-endpoint", containerd.endpoint)
    proxy = RuntimeProxy(tmp_path / "proxy", containerd.endpoint, hook_config_dir=koordlet.config_dir).start()
    client = KubeletClient(proxy.endpoint, on_pod_created=containerd.track_pod_cgroup,
                           log_root=containerd.workdir / "pod-logs")
    try:
        kubelets = PodLimits(cpu_shares=2048, cpu_quota=200000, cpu_period=100000, memory_limit=256 << 20)
        sandbox = client.run_pod(f"lsr-{uuid.uuid4().hex[:6]}", labels={QOS: "LSR"},
                                 annotations={RESOURCE_STATUS: '{"cpuset":"0"}'}, qos="guaranteed",
                                 pod_limits=kubelets)
        pod = Cgroup.of_pod(client.pod_cgroup_parent(sandbox))
        # PreRunPodSandbox cleared it before the sandbox started; the rest of kubelet's values stay.
        assert pod.cpu_quota() == -1
        assert pod.cpu_weight() == shares_to_weight(2048) and pod.memory_limit() == 256 << 20
        container = client.run_container(sandbox, "main", containerd.image,
                                          resources={"cpu_period": 100000, "cpu_quota": 200000})
        assert Cgroup.of_container(client.pod_cgroup_parent(sandbox), container).cpu_quota() == -1
        # kubelet writes the pod's values again (a resize, a restart): the reconciler clears it.
        pod.set_cpu_max(200000, 100000)
        wait_for(lambda: pod.cpu_quota() == -1, "the reconciler to unset the pod-level quota again")
    finally:
        containerd.remove_pods_of(client)
        proxy.stop()
        print("--- runtime proxy log ---\n" + proxy.logs(tail=120))


def node_slo(be_enabled: bool) -> str:
    return json.dumps({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                       "metadata": {"name": "node1"},
                       "spec": {"resourceQOSStrategy": {
                           "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                           "beClass": {"cpuQOS": {"enable": be_enabled, "groupIdentity": -1}}}}})


def test_node_slo_change_reapplies_group_identity_to_existing_pods(
        containerd: Containerd, kubelet: KubeletClient, koordlet_factory,
        tmp_path: Path) -> None:
    be_sandbox = kubelet.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                                        qos="besteffort")
    ls_sandbox = kubelet.run_pod(f"ls-{uuid.uuid4().hex[:6]}", labels={QOS: "LS"},
                                        qos="burstable")
    root = tmp_path / "cgroup"
    make_fake_v1_cgroup(root, "kubepods")
    for rel in ("kubepods/besteffort", "kubepods/burstable"):
        make_fake_v1_cgroup(root, rel)
    be_pod = make_fake_v1_cgroup(root, kubelet.pod_cgroup_parent(be_sandbox))
    ls_pod = make_fake_v1_cgroup(root, kubelet.pod_cgroup_parent(ls_sandbox))
    slo = tmp_path / "nodeslo.json"
    slo.write_text(node_slo(be_enabled=True))
    koordlet_factory("--cgroup-root-dir", str(root), "--proc-root-dir", str(tmp_path),
                     "--node-slo-file", str(slo), "--runtime-hooks-reconcile-interval", "1h",
                     "--containerd-endpoint", containerd.endpoint)
    bvt = lambda d: (d / "cpu.bvt_warp_ns").read_text().strip()  # noqa: E731
    # One round writes both pods, in the runtime's list order: wait for both, not for the BE one only.
    wait_for(lambda: bvt(be_pod) == "-1" and bvt(ls_pod) == "2", "the first round to set group identity")
    assert bvt(root / "cpu/kubepods/besteffort") == "-1"
    slo.write_text(node_slo(be_enabled=False))
    # the interval is an hour: only the NodeSLO change can bring the next round
    wait_for(lambda: bvt(be_pod) == "0", "the NodeSLO change to reset BE group identity")
    assert bvt(root / "cpu/kubepods/besteffort") == "0"
    assert bvt(ls_pod) == "2"


def test_cpu_normalization_is_not_applied_twice_when_both_modes_run(
        containerd: Containerd, koordlet_factory, tmp_path: Path) -> None:
    """The proxy path scales the quota once; the reconciler replaying the stored (scaled)
    config must leave it alone, round after round."""
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"metadata": {"annotations": {
        "node.koordinator.sh/cpu-normalization-ratio": "1.2"}}}))
    koordlet = koordlet_factory("--runtime-hooks-reconcile-interval", "200ms",
                                "--feature-gates", "CPUNormalization=true", "--node-file", str(node),
                                "--containerd-endpoint", containerd.endpoint)
    proxy = RuntimeProxy(tmp_path / "proxy", containerd.endpoint, hook_config_dir=koordlet.config_dir).start()
    client = KubeletClient(proxy.endpoint, on_pod_created=containerd.track_pod_cgroup,
                           log_root=containerd.workdir / "pod-logs")
    try:
        sandbox = client.run_pod(f"ls-{uuid.uuid4().hex[:6]}", labels={QOS: "LS"}, qos="burstable")
        container = client.run_container(sandbox, "main", containerd.image,
                                         resources={"cpu_period": 100000, "cpu_quota": 100000})
        cg = Cgroup.of_container(client.pod_cgroup_parent(sandbox), container)
        assert cg.cpu_quota() == 83334
        wait_for(lambda: "reconcile" in koordlet.logs().lower(), "a reconcile round to be logged")
        time.sleep(1.0)  # several more 200 ms rounds
        assert cg.cpu_quota() == 83334
    finally:
        containerd.remove_pods_of(client)
        proxy.stop()


def two_numa_sysfs(root: Path) -> Path:
    """A sysfs tree of this 2-cpu machine split across two NUMA nodes: cpu 0 on node 0, cpu 1 on node 1."""
    for cpu in (0, 1):
        topo = root / f"devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{cpu}\n")
        node = root / f"devices/system/node/node{cpu}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(f"{cpu}\n")
    (root / "devices/system/cpu/online").write_text("0-1\n")
    return root


@cgroup
def test_numa_aware_ls_pod_gets_the_share_pool_of_its_numa_node(
        containerd: Containerd, kubelet: KubeletClient, koordlet_factory, tmp_path: Path) -> None:
    """The NodeResourceTopology koordlet computes from the CPU topology has one share pool per
    NUMA node; an LS pod the scheduler placed on node 1 is bound to node 1's pool, its
    containers and its sandbox (pause) container alike, while an LS pod without a NUMA
    placement gets every pool."""
    numa = json.dumps({"numaNodeResources": [{"node": 1, "resources": {"cpu": "1"}}]})
    placed = kubelet.run_pod(f"ls-{uuid.uuid4().hex[:6]}", labels={QOS: "LS"},
                             annotations={RESOURCE_STATUS: numa}, qos="burstable")
    anywhere = kubelet.run_pod(f"ls-{uuid.uuid4().hex[:6]}", labels={QOS: "LS"}, qos="burstable")
    containers = {sandbox: kubelet.run_container(sandbox, "main", containerd.image,
                                                 resources={"cpuset_cpus": "0"})
                  for sandbox in (placed, anywhere)}
    cg = {sandbox: Cgroup.of_container(kubelet.pod_cgroup_parent(sandbox), cid)
          for sandbox, cid in containers.items()}
    pause = Cgroup.of_container(kubelet.pod_cgroup_parent(placed), placed)
    assert cg[placed].cpuset_cpus() == "0"  # what the runtime was asked for: nothing of koordlet's yet
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"metadata": {"name": "node1", "annotations": {}}}))
    koordlet = koordlet_factory("--runtime-hooks-reconcile-interval", "500ms", "--node-file", str(node),
                                "--sys-root-dir", str(two_numa_sysfs(tmp_path / "sys")),
                                "--node-topology-sync-interval", "500ms", "--disable-query-kubelet-config",
                                "--containerd-endpoint", containerd.endpoint)
    wait_for(lambda: cg[placed].cpuset_cpus() == "1", "the placed pod's container on NUMA node 1's pool")
    wait_for(lambda: pause.cpuset_cpus() == "1", "the placed pod's sandbox container on NUMA node 1's pool")
    wait_for(lambda: cg[anywhere].cpuset_cpus() in ("0-1", "0,1"), "the other LS pod on every pool")
    assert not klogparse.error_lines(koordlet.logs(tail=400))
