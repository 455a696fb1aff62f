"""QoS strategies end to end over a fake cgroup tree, an in-memory metric cache, a states
informer fed by hand and a recording evictor: upstream's suppressBECPU cases and more."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache, Sample
from koord.koordlet.metricsadvisor import AdvisorConfig
from koord.koordlet.metricsadvisor.collectors import HostApplicationCollector
from koord.koordlet.metricsadvisor.framework import Env
from koord.koordlet.qosmanager import QOSConfig, QOSManager, framework
from koord.koordlet.qosmanager.cpusuppress import TREE_REWALK_ROUNDS, CPUSuppress
from koord.koordlet.qosmanager.evictor import Evictor
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.slo import SLOError, parse_node_slo
from koord.koordlet.statesinformer import NODE, NODE_SLO, PodMeta, StatesInformer
from koord.koordlet.statesinformer import informer as informer_module
from koord.koordlet.statesinformer.specs import merged_node_slo
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.pods import container_meta

from .qos_fakes import GI, pod

BE_DIR = "kubepods/besteffort"


class Pods:
    def __init__(self, pods: list[PodMeta]) -> None:
        self.pods = pods

    def describe(self) -> str:
        return "test pods"

    def list_pods(self) -> list[PodMeta]:
        return list(self.pods)

    def close(self) -> None:
        pass


class RecordingEvictor(Evictor):
    def __init__(self) -> None:
        super().__init__("/nonexistent.sock")
        self.stopped: list[tuple[str, str, str]] = []

    def _stop_containers(self, pod: PodMeta, message: str, detail: str) -> str | None:
        """Records (uid, the strategy's reason, the numbers): the message is upstream's
        ``<reason>, kill pod: <name>``."""
        self.stopped.append((pod.uid, message.split(",")[0], detail))
        return None


class Rig:
    def __init__(self, root: Path, pods: list[PodMeta], *, cpus: int = 16, capacity: str = "16",
                 memory: str = "40G", gates: dict[str, bool] | None = None,
                 annotations: dict[str, str] | None = None) -> None:
        self.root = root
        for p in pods:
            for c in p.containers:
                make_fake_v1_cgroup(root, c.cgroup_dir)
        make_fake_v1_cgroup(root, BE_DIR)
        self.executor = ResourceExecutor(CgroupLayout(root, driver="cgroupfs"))
        self.cache = MetricCache(None)
        self.cache.set_kv("node_cpu_info", {"total_cpus": cpus, "processors": [
            {"cpu": i, "core": i // 2, "socket": 0, "node": 0, "online": True} for i in range(cpus)]})
        self.informer = StatesInformer(pods=Pods(pods))
        self.informer.sync_pods()
        self.informer.set_object(NODE, {
            "metadata": {"name": "n", "annotations": dict(annotations or {})},
            "status": {"capacity": {"cpu": capacity, "memory": memory},
                       "allocatable": {"cpu": capacity, "memory": memory}}})
        self.evictor = RecordingEvictor()
        self.registry = CollectorRegistry()
        all_gates = {"BECPUSuppress": True, "BECPUEvict": False, "CPUEvict": False,
                     "BEMemoryEvict": False, "MemoryEvict": False, **(gates or {})}
        self.config = QOSConfig(gates=all_gates, memory_evict_cool_time=4, cpu_evict_cool_time=20)
        self.now = time.time()
        self.manager = QOSManager(self.config, self.informer, self.cache, self.executor,
                                  registry=self.registry, evictor=self.evictor, clock=lambda: self.now)

    def strategy(self, name: str):
        return next(s for s in self.manager.strategies if s.name == name)

    def slo(self, **threshold: object) -> None:
        self.informer.set_object(NODE_SLO, {"metadata": {"name": "n"},
                                            "spec": {"resourceUsedThresholdWithBE": threshold}})

    def sample(self, kind: str, value: float, **labels: str) -> None:
        self.cache.append([Sample(kind, labels, self.now, value)])

    def file(self, d: str, subsystem: str, name: str) -> str:
        return (self.root / subsystem / d / name).read_text().strip()

    def write(self, d: str, subsystem: str, name: str, text: str) -> None:
        (self.root / subsystem / d / name).write_text(text + "\n")

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, {"node": "", **labels})


LS_POD = pod("ls-pod", "LS", "burstable")
BE_POD = pod("be-pod", "BE", "besteffort")


def test_change_count_moves_with_the_pod_list_and_pleg(tmp_path: Path) -> None:
    rig = Rig(tmp_path, [LS_POD])
    ctx, source = rig.manager.ctx, rig.informer.pods_source
    assert isinstance(source, Pods)
    before = ctx.changes
    assert not rig.informer.sync_pods() and ctx.changes == before  # the same list: no change
    source.pods = [LS_POD, BE_POD]
    assert rig.informer.sync_pods() and ctx.changes != before
    before = ctx.changes
    rig.manager.cgroups_changed()
    assert ctx.changes != before


def test_node_slo_parsed_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strategies tick every second and the host-application collector as often: all read
    the typed sections the states informer parsed when it took the version. A relist of the
    same version is not parsed again; a new one is, once."""
    parses: list[dict] = []
    parse = informer_module.parse_node_slo
    monkeypatch.setattr(informer_module, "parse_node_slo", lambda merged: parses.append(merged) or parse(merged))
    rig = suppress_rig(tmp_path, gates={"BEMemoryEvict": True})
    apps = {"hostApplications": [{"name": "agent", "qos": "LS"}]}
    make_fake_v1_cgroup(tmp_path, "host-latency-sensitive/agent")
    collector = HostApplicationCollector(Env(AdvisorConfig(), rig.informer, rig.cache, rig.executor))
    strategies = [rig.strategy("BECPUSuppress"), rig.strategy("MemoryEvict")]

    def version(percent: int) -> dict:
        return {"metadata": {"name": "n"}, "spec": {**apps, "resourceUsedThresholdWithBE": {
            "enable": True, "cpuSuppressThresholdPercent": percent}}}

    for percent, parsed in ((70, 1), (70, 1), (80, 2)):
        rig.informer.set_object(NODE_SLO, version(percent))
        for _ in range(3):
            rig.now += 1
            for strategy in strategies:
                strategy.run_once()
            collector.collect(rig.now)
        assert len(parses) == parsed
        node_slo = rig.informer.get_node_slo()
        assert node_slo is not None and node_slo.thresholds.cpu_suppress_threshold_percent == percent
        assert [app.name for app in collector.apps()] == ["agent"]
        assert rig.strategy("BECPUSuppress").last_suppress is not None


calls: list[dict] = []


def count_and_read(merged: dict) -> int:
    calls.append(merged)
    return int(merged["spec"]["n"])


def refuse(merged: dict) -> int:
    calls.append(merged)
    raise SLOError("spec.n: not today")


@pytest.mark.parametrize("parse, want", [(count_and_read, 3), (refuse, SLOError)])
def test_a_strategys_own_section_is_parsed_once_per_version(parse, want) -> None:
    """What a strategy types itself (CPU burst, memory and resctrl QoS) through
    ``NodeSLO.section``: parsed at the first tick of a version, handed out after, its
    error raised again at each tick; a new version is parsed again."""
    calls.clear()
    versions = [parse_node_slo(merged_node_slo({"spec": {"n": n}})) for n in (3, 3)]
    for node_slo in versions:
        for _ in range(4):
            if want is SLOError:
                with pytest.raises(SLOError, match="not today"):
                    node_slo.section(parse)
            else:
                assert node_slo.section(parse) == want
    assert len(calls) == 2, "once per version"


def suppress_rig(tmp_path: Path, **kw) -> Rig:
    """upstream's suppressBECPU fixture: 16 cpus, node using 12, LS 8, BE 2; BE cpuset 0-9,
    BE quota 8 cores."""
    rig = Rig(tmp_path, [LS_POD, BE_POD], **kw)
    rig.sample("node_cpu_usage", 12)
    rig.sample("pod_cpu_usage", 8, pod_uid="ls-pod")
    rig.sample("pod_cpu_usage", 2, pod_uid="be-pod")
    for d in (BE_DIR, BE_POD.cgroup_dir, BE_POD.containers[0].cgroup_dir):
        rig.write(d, "cpuset", "cpuset.cpus", "0-9")
    rig.write(BE_DIR, "cpu", "cpu.cfs_quota_us", str(8 * 100000))
    return rig


@pytest.mark.parametrize("policy, enable, want_quota, want_cpus", [
    ("cfsQuota", True, "120000", "0-15"),
    ("cpuset", True, "-1", "0-1"),
    ("cpuset", False, "-1", "0-15"),
])
def test_suppress_be_cpu(tmp_path: Path, policy: str, enable: bool, want_quota: str, want_cpus: str) -> None:
    rig = suppress_rig(tmp_path)
    rig.slo(enable=enable, cpuSuppressPolicy=policy, cpuSuppressThresholdPercent=70)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us") == want_quota
    for d in (BE_DIR, BE_POD.cgroup_dir, BE_POD.containers[0].cgroup_dir):
        assert rig.file(d, "cpuset", "cpuset.cpus") == want_cpus, d


def test_suppress_gauges(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path)
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=70)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.metric("koordlet_be_suppress_cpu_cores", type="cfsQuota") == 1.2
    assert rig.metric("koordlet_be_suppress_ls_used_cpu_cores") == 8
    assert rig.metric("koordlet_be_suppress_be_used_cpu_cores") == 2
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.metric("koordlet_be_suppress_cpu_cores", type="cpuset") == 2


def test_nodeslo_change_takes_effect_next_tick_and_disable_restores(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path)
    s = rig.strategy("BECPUSuppress")
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=70)
    s.run_once()
    assert rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us") == "120000"
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=80)
    s.run_once()  # 16 x 80% - 8 - 2 = 2.8 cores, a rise within the 10% step
    assert rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us") == "280000"
    rig.slo(enable=False, cpuSuppressPolicy="cfsQuota")
    s.run_once()
    assert rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us") == "-1"


def test_quota_climbs_in_ten_percent_steps(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path)
    s = rig.strategy("BECPUSuppress")
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=70)
    s.run_once()
    rig.sample("pod_cpu_usage", 0, pod_uid="ls-pod")  # LS stops: 16 x 70% - system (4 - 2) = 9.2 cores
    rig.sample("node_cpu_usage", 4)
    seen = []
    for _ in range(6):
        s.run_once()
        seen.append(int(rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us")))
    assert seen == [280000, 440000, 600000, 760000, 920000, 920000]  # +1.6 cores a tick


@pytest.mark.parametrize("slo, message", [
    ({"enable": True, "cpuSuppressThresholdPercent": 500}, "cpuSuppressThresholdPercent=500"),
    ({"enable": True, "cpuSuppressPolicy": "bogus"}, "cpuSuppressPolicy='bogus'"),
])
def test_bad_nodeslo_writes_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                    slo: dict, message: str) -> None:
    rig = suppress_rig(tmp_path)
    rig.slo(**slo)
    with caplog.at_level(logging.ERROR):
        rig.strategy("BECPUSuppress").run_once()
        rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us") == "800000"
    assert rig.file(BE_DIR, "cpuset", "cpuset.cpus") == "0-9"
    errors = [r.getMessage() for r in caplog.records if message in r.getMessage()]
    assert len(errors) == 1, errors  # said once, not every tick


def test_malformed_resource_status_writes_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = pod("lse", "LSE", "guaranteed",
              annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset": "0-"}'})
    rig = Rig(tmp_path, [LS_POD, BE_POD, bad])
    rig.sample("node_cpu_usage", 12)
    rig.write(BE_DIR, "cpuset", "cpuset.cpus", "0-9")
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    with caplog.at_level(logging.ERROR):
        rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpuset", "cpuset.cpus") == "0-9"
    assert "pod default/lse annotation scheduling.koordinator.sh/resource-status" in caplog.text


def test_offline_cpus_never_given_to_be(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path)
    rig.cache.set_kv("node_cpu_info", {"processors": [
        {"cpu": i, "core": i // 2, "socket": 0, "node": 0, "online": i >= 4} for i in range(16)]})
    rig.slo(enable=False)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpuset", "cpuset.cpus") == "4-15"


def test_lse_reserved_and_system_cpus_left_out_of_be_pool(tmp_path: Path) -> None:
    lse = pod("lse", "LSE", "guaranteed",
              annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset": "14-15"}'})
    rig = Rig(tmp_path, [LS_POD, BE_POD, lse], annotations={
        "node.koordinator.sh/reservation": '{"reservedCPUs": "0"}',
        "node.koordinator.sh/system-qos-resource": '{"cpuset": "1"}'})
    rig.slo(enable=False)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpuset", "cpuset.cpus") == "2-13"


def test_static_kubelet_policy_narrows_containers_only(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path, annotations={
        "kubelet.koordinator.sh/cpu-manager-policy": '{"policy": "static"}'})
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpuset", "cpuset.cpus") == "0-15"
    assert rig.file(BE_POD.cgroup_dir, "cpuset", "cpuset.cpus") == "0-15"
    assert rig.file(BE_POD.containers[0].cgroup_dir, "cpuset", "cpuset.cpus") == "0-1"


NEW_CTR = f"{BE_POD.cgroup_dir}/new-container"


def relist_with_new_container(rig: Rig) -> None:
    changed = replace(BE_POD, containers=(*BE_POD.containers, container_meta("new", "new-container", NEW_CTR)))
    rig.informer.pods_source.pods = [LS_POD, changed]  # type: ignore[union-attr]
    assert rig.informer.sync_pods()


@pytest.mark.parametrize("name, signal, rounds", [
    ("no-sign-found-by-the-periodic-walk", lambda rig: None, TREE_REWALK_ROUNDS),
    ("pleg-saw-it", lambda rig: rig.manager.cgroups_changed(), 1),
    ("pod-list-names-it", relist_with_new_container, 1),
])
def test_new_be_dir_found(tmp_path: Path, name: str, signal, rounds: int) -> None:
    """The besteffort tree is walked again when it changed, and every TREE_REWALK_ROUNDS
    rounds for a dir nothing reported."""
    rig = suppress_rig(tmp_path)
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    s = rig.strategy("BECPUSuppress")
    s.run_once()
    make_fake_v1_cgroup(rig.root, NEW_CTR)
    rig.write(NEW_CTR, "cpuset", "cpuset.cpus", "0-9")
    signal(rig)

    def round_found() -> bool:
        s.run_once()
        return rig.file(NEW_CTR, "cpuset", "cpuset.cpus") == "0-1"
    assert next((n for n in range(1, 3 * TREE_REWALK_ROUNDS) if round_found()), None) == rounds


def test_failed_write_walks_the_tree_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A dir gone since the walk fails its write once, not every round until the next walk."""
    rig = suppress_rig(tmp_path)
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    s = rig.strategy("BECPUSuppress")
    s.run_once()
    shutil.rmtree(rig.root / "cpuset" / BE_POD.containers[0].cgroup_dir)
    rig.now += 1  # LS down to 7 cores, node to 11: 16 x 70% - 7 - 2 = 2.2 cores, 3 cpus (writes)
    for kind, value, labels in (("node_cpu_usage", 11, {}), ("pod_cpu_usage", 7, {"pod_uid": "ls-pod"}),
                                ("pod_cpu_usage", 2, {"pod_uid": "be-pod"})):
        rig.sample(kind, value, **labels)
    failed = []
    for _ in range(3):
        caplog.clear()
        s.run_once()
        failed.append(any("missing" in r.message and r.levelno == logging.ERROR for r in caplog.records))
    assert failed == [True, False, False]
    assert rig.file(BE_POD.cgroup_dir, "cpuset", "cpuset.cpus") == "0-2"


def test_no_nodeslo_no_write(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.file(BE_DIR, "cpu", "cpu.cfs_quota_us") == "800000"


def test_systemd_layout(tmp_path: Path) -> None:
    be = pod("be1", "BE", "besteffort", kube_dir="kubepods.slice")
    rig = Rig(tmp_path, [LS_POD, be])
    make_fake_v1_cgroup(tmp_path, "kubepods.slice/kubepods-besteffort.slice")
    rig.executor = ResourceExecutor(CgroupLayout(tmp_path, driver="systemd"))
    rig.manager = QOSManager(rig.config, rig.informer, rig.cache, rig.executor,
                             registry=CollectorRegistry(), evictor=rig.evictor, clock=lambda: rig.now)
    rig.sample("node_cpu_usage", 12)
    rig.sample("pod_cpu_usage", 8, pod_uid="ls-pod")
    rig.sample("pod_cpu_usage", 2, pod_uid="be1")
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=70)
    rig.strategy("BECPUSuppress").run_once()
    assert rig.file("kubepods.slice/kubepods-besteffort.slice", "cpu", "cpu.cfs_quota_us") == "120000"


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    root = tmp_path / "v2"
    d = root / BE_DIR
    d.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu memory\n")
    for name, text in {"cpu.max": "max 100000", "cpuset.cpus": "", "cpuset.cpus.effective": "0-15"}.items():
        (d / name).write_text(text + "\n")
    rig = suppress_rig(tmp_path / "v1")
    rig.executor = ResourceExecutor(CgroupLayout(root, driver="cgroupfs"))
    rig.manager = QOSManager(rig.config, rig.informer, rig.cache, rig.executor,
                             registry=CollectorRegistry(), evictor=rig.evictor, clock=lambda: rig.now)
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=70)
    rig.strategy("BECPUSuppress").run_once()
    assert (d / "cpu.max").read_text().strip() == "120000 100000"
    rig.slo(enable=False)
    rig.strategy("BECPUSuppress").run_once()
    assert (d / "cpu.max").read_text().strip() == "max 100000"


# ---- memory evict ------------------------------------------------------------------------

def memory_rig(tmp_path: Path, gates: dict[str, bool]) -> Rig:
    pods = [pod("p100-20g", "BE", "besteffort", priority=100),
            pod("p100-5g", "BE", "besteffort", priority=100),
            pod("p120-10g", "BE", "besteffort", priority=120), LS_POD]
    rig = Rig(tmp_path, pods, memory=str(120 * GI), gates=gates)
    memory_samples(rig)
    return rig


def memory_samples(rig: Rig) -> None:
    rig.sample("node_memory_usage", 115 * GI)
    for uid, gib in (("p100-20g", 20), ("p100-5g", 5), ("p120-10g", 10), ("ls-pod", 30)):
        rig.sample("pod_memory_usage", gib * GI, pod_uid=uid)


def test_be_memory_evict_and_cool_down(tmp_path: Path) -> None:
    rig = memory_rig(tmp_path, {"BEMemoryEvict": True})
    rig.slo(enable=True, memoryEvictThresholdPercent=80)
    s = rig.strategy("MemoryEvict")
    s.setup()
    s.run_once()
    assert rig.evictor.stopped == []  # cool-down from start
    rig.now += 5
    memory_samples(rig)
    s.run_once()
    assert [u for u, _, _ in rig.evictor.stopped] == ["p100-20g", "p100-5g"]
    uid, reason, message = rig.evictor.stopped[0]
    assert reason == "EvictPodByNodeMemoryUsage" and "95% >= 80%" in message
    assert rig.metric("koordlet_pod_eviction_total", reason="evicted") == 2
    rig.now += 1
    memory_samples(rig)
    s.run_once()
    assert len(rig.evictor.stopped) == 2  # cooling down again


def test_memory_evict_disabled_by_nodeslo(tmp_path: Path) -> None:
    rig = memory_rig(tmp_path, {"BEMemoryEvict": True})
    rig.slo(enable=False, memoryEvictThresholdPercent=80)
    s = rig.strategy("MemoryEvict")
    s.run_once()
    assert rig.evictor.stopped == []


def test_memory_evict_counts_bytes_not_milli_bytes(tmp_path: Path) -> None:
    """MemoryEvict (labelled pods) must evict until the bytes cover the release."""
    on = {"koordinator.sh/eviction-enabled": "true"}
    pods = [pod("a", "LS", labels=on, priority=5000), pod("b", "LS", labels=on, priority=5000)]
    rig = Rig(tmp_path, pods, memory=str(120 * GI), gates={"MemoryEvict": True})
    rig.sample("node_memory_usage", 115 * GI)
    rig.sample("pod_memory_usage", 10 * GI, pod_uid="a")
    rig.sample("pod_memory_usage", 9 * GI, pod_uid="b")
    rig.slo(enable=True, memoryEvictThresholdPercent=82)  # release 18G
    rig.strategy("MemoryEvict").run_once()
    assert [u for u, _, _ in rig.evictor.stopped] == ["a", "b"]


# ---- cpu evict ---------------------------------------------------------------------------

def test_be_cpu_evict(tmp_path: Path) -> None:
    pods = [pod("a", "BE", "besteffort", batch_cpu=4000), pod("b", "BE", "besteffort", batch_cpu=2000)]
    rig = Rig(tmp_path, pods, gates={"BECPUEvict": True})
    for alloc, value in (("usage", 9500), ("request", 50000), ("real-limit", 10000)):
        rig.sample("node_be", value, be_resource="cpu", be_allocation=alloc)
    rig.sample("pod_cpu_usage", 1.0, pod_uid="a")
    rig.sample("pod_cpu_usage", 1.0, pod_uid="b")
    rig.slo(enable=True, cpuEvictBESatisfactionLowerPercent=30, cpuEvictBESatisfactionUpperPercent=40)
    rig.strategy("CPUEvict").run_once()
    # release 10000m of requests: b (more use per request) first, then a; 6000m < 10000m
    assert [u for u, _, _ in rig.evictor.stopped] == ["b", "a"]


def test_cpu_evict_by_node_usage(tmp_path: Path) -> None:
    on = {"koordinator.sh/eviction-enabled": "true"}
    pods = [pod("a", "LS", labels=on, priority=5000), pod("b", "LS", labels=on, priority=6000)]
    rig = Rig(tmp_path, pods, capacity="100", gates={"CPUEvict": True})
    rig.sample("node_cpu_usage", 81)
    rig.sample("pod_cpu_usage", 4, pod_uid="a")
    rig.sample("pod_cpu_usage", 4, pod_uid="b")
    rig.slo(enable=True, cpuEvictThresholdPercent=80)  # release 3000m
    rig.strategy("CPUEvict").run_once()
    assert [u for u, _, _ in rig.evictor.stopped] == ["a"]


# ---- framework ---------------------------------------------------------------------------

def test_gates_choose_threads_and_a_failing_tick_is_logged_and_retried(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = suppress_rig(tmp_path)
    calls = []

    def boom(self: CPUSuppress) -> None:
        calls.append(1)
        raise RuntimeError("kaboom")

    monkeypatch.setattr(CPUSuppress, "run_once", boom)
    config = QOSConfig(cpu_suppress_interval=0.05)
    registry = CollectorRegistry()
    manager = QOSManager(config, rig.informer, rig.cache, rig.executor, registry=registry,
                         evictor=RecordingEvictor())
    with caplog.at_level(logging.ERROR):
        manager.start()
        # the default gates: BECPUSuppress, CPUBurst and RdtResctrl on, every eviction off
        assert [t.name for t in manager._threads] == ["qos-BECPUSuppress", "qos-CPUBurst", "qos-ResctrlReconcile"]
        deadline = time.time() + 5
        while len(calls) < 3 and time.time() < deadline:
            time.sleep(0.02)
        manager.stop()
    assert len(calls) >= 3
    assert "kaboom" in caplog.text
    errors = registry.get_sample_value("koordlet_qos_strategy_errors_total",
                                       {"node": "", "strategy": "BECPUSuppress"})
    assert errors is not None and errors >= 3


def test_add_flags_defaults() -> None:
    from koord.koordlet import flags

    p = flags.build_parser()
    cfg = QOSConfig.from_args(p.parse_args([]))
    assert (cfg.cpu_suppress_interval, cfg.cpu_evict_interval, cfg.memory_evict_interval,
            cfg.memory_evict_cool_time, cfg.cpu_evict_cool_time, cfg.only_evict_by_api,
            cfg.reconcile_interval) == (1, 1, 1, 4, 20, False, 1)
    assert cfg.gates == {"BECPUSuppress": True, "BECPUEvict": False, "CPUEvict": False,
                         "BEMemoryEvict": False, "MemoryEvict": False, "CPUBurst": True,
                         "CPUAllocatableEvict": False, "MemoryAllocatableEvict": False, "CgroupReconcile": False,
                         "RdtResctrl": True, "SystemConfig": False}
    with pytest.raises(SystemExit):
        p.parse_args(["--cpu-suppress-interval-seconds", "-1"])


def test_koordlet_flags_reach_the_qos_manager() -> None:
    from koord.koordlet import flags

    args = flags.parse_args(["--cpu-suppress-interval-seconds", "2", "--only-evict-by-api",
                           "--feature-gates", "BEMemoryEvict=true,BECPUSuppress=false",
                           "--cgroup-kube-dir", "test/kubepods"])
    cfg = QOSConfig.from_args(args, node_name="n1")
    assert (cfg.cpu_suppress_interval, cfg.only_evict_by_api, cfg.node_name) == (2, True, "n1")
    assert cfg.gates["BEMemoryEvict"] is True and cfg.gates["BECPUSuppress"] is False


def test_pending_eviction_counts_what_the_pod_had(tmp_path: Path) -> None:
    """After its containers stop a pod's usage sample vanishes; the release it brought still
    counts, so the next tick does not evict another pod for the same shortage."""
    rig = memory_rig(tmp_path, {"BEMemoryEvict": True})
    rig.config = QOSConfig(gates=rig.config.gates, memory_evict_cool_time=0)
    rig.manager = QOSManager(rig.config, rig.informer, rig.cache, rig.executor,
                             registry=CollectorRegistry(), evictor=rig.evictor, clock=lambda: rig.now)
    rig.slo(enable=True, memoryEvictThresholdPercent=82)  # 18G: the 20G pod
    s = rig.strategy("MemoryEvict")
    s.run_once()
    assert [u for u, _, _ in rig.evictor.stopped] == ["p100-20g"]
    rig.now += 3  # the evicted pod's sample is stale now, the others are refreshed
    rig.sample("node_memory_usage", 115 * GI)
    for uid, gib in (("p100-5g", 5), ("p120-10g", 10)):
        rig.sample("pod_memory_usage", gib * GI, pod_uid=uid)
    s.run_once()
    assert [u for u, _, _ in rig.evictor.stopped] == ["p100-20g"]


def test_failed_eviction_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = memory_rig(tmp_path, {"BEMemoryEvict": True})
    evictor = Evictor(str(tmp_path / "no-such.sock"))
    rig.manager = QOSManager(QOSConfig(gates=rig.config.gates, memory_evict_cool_time=0), rig.informer,
                             rig.cache, rig.executor, registry=CollectorRegistry(), evictor=evictor,
                             clock=lambda: rig.now)
    rig.slo(enable=True, memoryEvictThresholdPercent=82)
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            rig.strategy("MemoryEvict").run_once()
    errors = [r for r in caplog.records if "p100-20g" in r.getMessage() or "default/p100-20g" in r.getMessage()]
    assert len(errors) == 1 and "stopping its containers through CRI failed" in errors[0].getMessage()
    evictor.close()


def test_cpusets_restored_once_then_left_to_the_hooks(tmp_path: Path) -> None:
    rig = suppress_rig(tmp_path)
    s = rig.strategy("BECPUSuppress")
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    s.run_once()
    ctr = BE_POD.containers[0].cgroup_dir
    assert rig.file(ctr, "cpuset", "cpuset.cpus") == "0-1"
    rig.slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=70)
    s.run_once()  # the policy switch restores the BE pool
    assert rig.file(ctr, "cpuset", "cpuset.cpus") == "0-15"
    rig.write(ctr, "cpuset", "cpuset.cpus", "3")  # a runtime hook's BE shared pool
    s.run_once()
    assert rig.file(ctr, "cpuset", "cpuset.cpus") == "3"
    rig.slo(enable=True, cpuSuppressPolicy="cpuset", cpuSuppressThresholdPercent=70)
    s.run_once()
    rig.slo(enable=False)
    s.run_once()  # disabling restores once more
    assert rig.file(ctr, "cpuset", "cpuset.cpus") == "0-15"


@pytest.mark.parametrize("calls, said", [
    # 1: said when it starts, not while it holds
    ([("k", "a"), ("k", "a")], ["a"]),
    # 2: said again when it changes
    ([("k", "a"), ("k", "b")], ["a", "b"]),
    # 3: over, then back: said again
    ([("k", "a"), ("k", None), ("k", "a")], ["a", "a"]),
    # 4: "over" for something never said says nothing
    ([("k", None), ("j", None)], []),
    # 5: keys are separate
    ([("k", "a"), ("j", "a"), ("k", "a")], ["a", "a"]),
])
def test_log_once_cases(tmp_path: Path, caplog: pytest.LogCaptureFixture, calls, said) -> None:
    ctx = Rig(tmp_path, []).manager.ctx
    with caplog.at_level(logging.INFO, logger="koord.koordlet.qosmanager.framework"):
        for key, message in calls:
            ctx.log_once(f"S/{key}", message)
    assert [r.getMessage() for r in caplog.records if r.name == framework.log.name] == [f"S: {m}" for m in said]


def test_log_once_forgets_what_is_over_and_stays_bounded(tmp_path: Path, monkeypatch) -> None:
    """Keys name pods and containers: a node running short jobs sees new ones all day."""
    monkeypatch.setattr(framework, "MAX_CONDITIONS", 50)
    ctx = Rig(tmp_path, []).manager.ctx
    for i in range(1000):
        ctx.log_once(f"CPUBurst/container/{i}", None)
    assert len(ctx._said) == 0
    for i in range(1000):
        ctx.log_once(f"CPUBurst/container/{i}", "missing")
        assert len(ctx._said) <= 50
