"""CPU QoS on a mainline kernel, end to end: koordlet as a process against real containerd +
runc pods, NodeSLO and Node from files, values read back from the real cgroup files through
``koord_testing.cgroups`` (so the same tests run in the cgroup v2 lane).

Pods live under the test's own kube dir (``koordtest-<id>/kubepods``, koordlet's
``--cgroup-kube-dir``), so nothing here touches other tests' pods or a real kubelet's.
"""

from __future__ import annotations

import copy
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from koord_testing.cgroups import Cgroup, enable_v2_controllers, remove_tree
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.kubeletpods import KubeletPodsServer, pod_json
from koord_testing.procstat import PodsOnlyProcStat
from koord_testing.wait import wait_for
from koord_testing.workloads import burn_command

from .qos_rig import write_json

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]

QOS = "koordinator.sh/qosClass"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"
T = TypeVar("T")


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
    # A node gives kubepods the weight of its cpus; here the test's top dir gets 4 times a
    # default group's, so its pods are not starved by group fairness on this shared machine
    # (other test runs, each in its own group) without starving those runs either.
    top = Cgroup(kube.split("/")[0])
    top.dir("cpu").mkdir(parents=True, exist_ok=True)
    top.set_cpu_weight_from_shares(4096)
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
        containerd.remove_pods_of(kubelet)  # burners first: they would slow koordlet's exit
        rc = node.koordlet.stop() if node.koordlet else None
        print(f"--- koordlet log (exit {rc}) ---\n{node.logs()[-20000:]}")
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
    # A suppress tick may land between the NodeSLO change and the reconciler's round that
    # unsets the BE quotas (two threads, as upstream): one refused write then, retried after
    # 1 s. Once suppressed, nothing may be refused any more.
    refused_at_switch = node.logs().count("EINVAL")
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
    refused = node.logs().count("EINVAL") - refused_at_switch
    print(f"EINVAL lines: {refused_at_switch} while switching to suppress, {refused} afterwards")
    assert refused == 0 and refused_at_switch <= 2, "no write refused once suppressed"


# ---- CPUBurst ------------------------------------------------------------------------------

LS_LIMIT = {"cpu_period": 100000, "cpu_quota": 50000, "cpu_shares": 512}
CPU_BURST = "koordinator.sh/cpuBurst"


def burst_us(cgroup: Cgroup) -> int:
    return int(cgroup.read("cpu", "cpu.cfs_burst_us", "cpu.max.burst"))


def test_cpu_burst_sets_the_burst_file_clamped_to_the_quota(qos_node: QoSNode) -> None:
    """cpuBurstOnly: an LS container limited to half a core, burning more, gets limit x
    cpuBurstPercent as its burst and its pod the sum; at 1000% (upstream's default) the
    value is clamped to the quota without one refused write; a pod that opts out keeps 0."""
    node = qos_node
    node.start_koordlet()
    pod, container = node.run_pod("ls", "burstable", "LS", burn_command(1), resources=LS_LIMIT)
    out_pod, out_container = node.run_pod("ls-out", "burstable", "LS", burn_command(0.2), resources=LS_LIMIT,
                                          annotations={CPU_BURST: '{"policy": "none"}'})
    if not container.file("cpu", "cpu.cfs_burst_us", "cpu.max.burst").exists():
        pytest.fail(f"this kernel has no burst file under {container.dir('cpu')}")
    node.slo({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 50}})
    # 0.5 core x 50% = 0.25 core = 25000 µs per 100 ms period
    wait_for(settled(lambda: burst_us(container) == 25000 and burst_us(pod) == 25000),
             "container and pod burst 25000 µs", 30)
    assert container.cpu_max() == (50000, 100000), "cpuBurstOnly leaves the quota alone"

    node.slo({"cpuBurstStrategy": {"policy": "cpuBurstOnly"}})  # 1000%: 500000 µs wanted
    wait_for(settled(lambda: burst_us(container) == 50000), "the burst clamped to the quota 50000", 30)
    time.sleep(2)
    assert (burst_us(container), burst_us(pod)) == (50000, 50000)
    assert (burst_us(out_container), burst_us(out_pod)) == (0, 0), "the opted-out pod keeps its values"
    assert out_container.cpu_max() == (50000, 100000)
    logs = node.logs()
    assert logs.count("clamped to it") == 1, "the clamp is said once"
    assert "EINVAL" not in logs and "Invalid argument" not in logs


def test_cfs_quota_burst_rises_while_idle_and_falls_when_the_node_fills(qos_node: QoSNode) -> None:
    """cfsQuotaBurstOnly: a throttled LS container's quota rises 1.2x a tick (pod too) while the
    share pool is below its threshold, and falls back to its limit once a burner fills the node."""
    node = qos_node
    proc = PodsOnlyProcStat(node.workdir / "proc", node.kube)
    try:
        run_cfs_quota_burst(node, proc)
    finally:
        proc.stop()


def run_cfs_quota_burst(node: QoSNode, proc: PodsOnlyProcStat) -> None:
    # A small limit (0.2 core) and a low threshold (25% of the cpus), so that the test's pods
    # fill the share pool even while other test runs compete for the cpus.
    node.start_koordlet("--proc-root-dir", str(proc.root))
    limit = {"cpu_period": 100000, "cpu_quota": 20000, "cpu_shares": 205}
    pod, container = node.run_pod("ls", "burstable", "LS", burn_command(1), resources=limit)
    pod.set_cpu_max(20000)  # a pod-level limit, as kubelet sets for a pod whose containers all have one
    node.slo({"cpuBurstStrategy": {"policy": "cfsQuotaBurstOnly", "cfsQuotaBurstPercent": 300,
                                   "sharePoolThresholdPercent": 25}})
    seen = wait_for(settled(lambda: (q := container.cpu_quota()) >= 28800 and q), "the quota to rise", 90)
    pod_quota = pod.cpu_quota()
    print(f"idle node: container quota 20000 -> {seen}, pod {pod_quota}")
    assert seen <= 60000 and pod_quota >= seen, "within 300% of the limit, the pod at least as wide"

    cpus = os.cpu_count() or 1
    node.run_pod("filler", "burstable", "LS", burn_command(cpus))
    wait_for(settled(lambda: container.cpu_quota() == 20000 and pod.cpu_quota() == 20000),
             "the quota back at the limit once the node is full", 90)
    logs = node.logs()
    assert "share pool overload" in logs
    assert "EINVAL" not in logs and "Invalid argument" not in logs


# ---- OOMScoreAdj ---------------------------------------------------------------------------

OOM_SCORE_ADJ = "koordinator.sh/oom-score-adj"


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


CAP_SYS_RESOURCE = 24


def may_lower_oom_score_adj() -> bool:
    """Whether this process (and so koordlet, started by it) holds CAP_SYS_RESOURCE, without
    which the kernel refuses to lower an oom_score_adj."""
    status = Path("/proc/self/status").read_text()
    cap_eff = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
    return bool(int(cap_eff, 16) >> CAP_SYS_RESOURCE & 1)


def test_oom_score_adj_reaches_every_process_of_the_container(qos_node: QoSNode) -> None:
    """The spec's value for the container (over the pod's default) on every pid of its
    cgroup.procs, the sandbox's pause left alone; a negative value, which root may not set
    without CAP_SYS_RESOURCE (this project's machines), is reported once and nothing else
    breaks, or, where root has it (the v2 lane's guest), is set."""
    node = qos_node
    node.start_koordlet("--feature-gates", "OOMScoreAdj=true")
    annotations = {"koordinator.sh/oom-score-adj": "100", "koordinator.sh/oom-score-adj-spec": '{"main": 300}'}
    pod, container = node.run_pod("oom", "burstable", "LS", burn_command(0.05), annotations=annotations)
    pause = [p for d in pod.dir("cpu").iterdir() if d.is_dir() and d.name != container.rel.rsplit("/", 1)[1]
             for p in Cgroup(f"{pod.rel}/{d.name}").procs()]
    pause_before = {p: oom_score_adj(p) for p in pause}
    wait_for(settled(lambda: container.procs() and all(oom_score_adj(p) == 300 for p in container.procs())),
             "oom_score_adj 300 on every process of the container", 30)
    print(f"container pids {container.procs()} at 300; sandbox pids {pause_before}")
    assert pause_before and {p: oom_score_adj(p) for p in pause} == pause_before, "the sandbox is left alone"

    _, negative = node.run_pod("oom-neg", "burstable", "LS", burn_command(0.05),
                               annotations={"koordinator.sh/oom-score-adj": "-100"})
    if may_lower_oom_score_adj():
        wait_for(settled(lambda: negative.procs() and all(oom_score_adj(p) == -100 for p in negative.procs())),
                 "oom_score_adj -100 on every process (root has CAP_SYS_RESOURCE here)", 30)
        assert "refused oom_score_adj" not in node.logs()
    else:
        wait_for(lambda: "refused oom_score_adj -100" in node.logs(), "the refusal of -100 reported", 30)
        time.sleep(2)
        logs = node.logs()
        assert logs.count("refused oom_score_adj -100") == 1, "said once"
        assert all(oom_score_adj(p) >= 0 for p in negative.procs())
    assert all(oom_score_adj(p) == 300 for p in container.procs())


def test_oom_score_adj_follows_an_annotation_edited_while_the_pod_runs(qos_node: QoSNode) -> None:
    """Pods from kubelet's /pods (the stand-in serves what the test says): the pod starts with
    oom-score-adj 100; edited to 300 in kubelet's list (CRI's sandbox still says 100), every
    process of the container follows within a few rounds and the sandbox stays as it was."""
    node = qos_node
    node_obj = json.loads(node.node_file.read_text())
    node_obj["status"]["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}]
    write_json(node.node_file, node_obj)
    server = KubeletPodsServer()
    try:
        sandbox = node.kubelet.run_pod(f"oom-edit-{uuid.uuid4().hex[:6]}", labels={QOS: "LS"},
                                       annotations={OOM_SCORE_ADJ: "100"}, qos="burstable", kube_dir=node.kube)
        cid = node.kubelet.run_container(sandbox, "main", node.containerd.image, command=burn_command(0.05))
        listed = pod_json(node.kubelet, sandbox, {"main": cid}, qos="burstable")
        server.pods = [listed]
        node.start_koordlet("--feature-gates", "OOMScoreAdj=true", "--pods-source", "kubelet",
                            "--kubelet-insecure-tls", "--kubelet-read-only-port", str(server.port),
                            "--kubelet-sync-interval", "500ms")
        parent = node.kubelet.pod_cgroup_parent(sandbox)
        pod, container = Cgroup.of_pod(parent), Cgroup.of_container(parent, cid)
        pause = [p for d in pod.dir("cpu").iterdir() if d.is_dir() and d.name != cid
                 for p in Cgroup(f"{pod.rel}/{d.name}").procs()]
        pause_before = {p: oom_score_adj(p) for p in pause}
        wait_for(settled(lambda: container.procs() and all(oom_score_adj(p) == 100 for p in container.procs())),
                 "oom_score_adj 100 (the pod's annotation at start) on the container's processes", 30)

        edited = copy.deepcopy(listed)
        edited["metadata"]["annotations"][OOM_SCORE_ADJ] = "300"
        server.pods = [edited]
        wait_for(settled(lambda: container.procs() and all(oom_score_adj(p) == 300 for p in container.procs())),
                 "oom_score_adj 300 (the edited annotation) on the container's processes", 30)
        print(f"container pids {container.procs()} at 300; sandbox pids {pause_before}")
        assert pause_before and {p: oom_score_adj(p) for p in pause} == pause_before, "the sandbox is left alone"
        assert node.kubelet.sandbox_configs[sandbox].annotations[OOM_SCORE_ADJ] == "100", "CRI's is unchanged"
    finally:
        server.close()


# ---- CoreSched: cpu.idle at the kube-QoS level ----------------------------------------------

def cpu_idle(cgroup: Cgroup) -> int:
    return int(cgroup.read("cpu", "cpu.idle"))


def test_core_sched_policy_sets_cpu_idle_of_the_kube_qos_dirs(qos_node: QoSNode) -> None:
    """cpuPolicy coreSched with BE's schedIdle 1: besteffort's cpu.idle 1, burstable's and the
    kube dir's 0; back to 0 when the policy changes. Core scheduling itself is missing on this
    kernel: said in one line, and pods keep starting."""
    node = qos_node
    node.start_koordlet("--feature-gates", "CoreSched=true")
    be_pod, _ = node.run_pod("be", "besteffort", "BE", burn_command(0.05))
    node.run_pod("ls", "burstable", "LS", burn_command(0.05))
    kube, besteffort, burstable = (Cgroup(node.kube), Cgroup(f"{node.kube}/besteffort"),
                                   Cgroup(f"{node.kube}/burstable"))
    if not besteffort.file("cpu", "cpu.idle").exists():
        pytest.fail(f"this kernel has no cpu.idle under {besteffort.dir('cpu')}")
    strategy = {"policies": {"cpuPolicy": "coreSched"},
                "lsClass": {"cpuQOS": {"enable": True}}, "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}
    node.slo({"resourceQOSStrategy": strategy})
    wait_for(settled(lambda: (cpu_idle(besteffort), cpu_idle(burstable), cpu_idle(kube)) == (1, 0, 0)),
             "besteffort cpu.idle 1, burstable and kubepods 0", 30)
    _, late = node.run_pod("be-late", "besteffort", "BE", burn_command(0.05))
    assert late.procs(), "a pod still starts with the coreSched policy on a kernel without core scheduling"

    strategy["policies"] = {"cpuPolicy": "groupIdentity"}
    node.slo({"resourceQOSStrategy": strategy})
    wait_for(settled(lambda: (cpu_idle(besteffort), cpu_idle(burstable), cpu_idle(kube)) == (0, 0, 0)),
             "cpu.idle back to 0 once the policy is groupIdentity", 30)
    logs = node.logs()
    said = logs.count("core scheduling is not supported") + logs.count("supports core scheduling")
    assert said == 1, "the kernel's core-scheduling support is said in one line"
