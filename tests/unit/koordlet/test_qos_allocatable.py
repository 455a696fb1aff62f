"""CPUAllocatableEvict / MemoryAllocatableEvict: upstream's
calculateMilliReleaseByAllocatableThresholdPercent table, the victim order, the NodeSLO
fields, and whole ticks through the evictor."""

from __future__ import annotations

import time

import pytest

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import POD_CPU_USAGE, POD_MEMORY_USAGE, POD_UID, MetricCache, Sample
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.qosmanager.cpuevict import CPUEvict
from koord.koordlet.qosmanager.evictcalc import (
    BATCH,
    MID,
    PROD,
    allocatable_release,
    allocatable_victims,
    priority_class,
    priority_value,
)
from koord.koordlet.qosmanager.memoryevict import MemoryEvict
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.slo import SLOError, threshold_config
from koord_testing.pods import FakeStatesInformer, with_resources

from .qos_fakes import GI, pod

BCPU, MCPU, BMEM = "kubernetes.io/batch-cpu", "kubernetes.io/mid-cpu", "kubernetes.io/batch-memory"
BATCH_MAX, MID_MAX = 5999, 7999


def requesting(uid: str, koord_qos: str, priority: int, annotations: dict[str, str] | None = None,
               labels: dict[str, str] | None = None):
    return pod(uid, koord_qos, "besteffort" if koord_qos == "BE" else "burstable", priority=priority,
               labels={"koordinator.sh/eviction-enabled": "true"} if labels is None else labels,
               annotations=annotations)


def batch_pod(uid: str, milli: int, priority: int = 5000, **meta: dict[str, str]):
    return with_resources(requesting(uid, "BE", priority, **meta), requests={BCPU: milli})


def mid_pod(uid: str, milli: int, priority: int = 7000):
    return with_resources(requesting(uid, "LS", priority), requests={MCPU: milli})


@pytest.mark.parametrize("name, pods, allocatable, threshold, lower, priority, want", [
    ("not exceeded", [batch_pod("a", 40), batch_pod("b", 40)], {BCPU: 100}, 80, 70, BATCH_MAX, {}),
    ("batch cpu", [batch_pod("a", 45000), batch_pod("b", 40000)], {BCPU: 100000}, 80, 70, BATCH_MAX,
     {BCPU: 15000}),
    ("mixed priority", [batch_pod("a", 85000), mid_pod("m", 85000)], {BCPU: 100000, MCPU: 100000},
     80, 70, MID_MAX, {BCPU: 15000, MCPU: 15000}),
    ("mixed, lower priority threshold", [batch_pod("a", 85000), mid_pod("m", 85000)],
     {BCPU: 100000, MCPU: 100000}, 80, 70, BATCH_MAX, {BCPU: 15000}),
    ("threshold 0", [batch_pod("a", 85000)], {BCPU: 100000, MCPU: 100000}, 0, 0, BATCH_MAX, {BCPU: 85000}),
    ("no batch-cpu allocatable", [batch_pod("a", 85000)], {}, 80, 70, BATCH_MAX, {BCPU: 85000}),
])
def test_release_upstream_table(name: str, pods: list, allocatable: dict, threshold: int, lower: int,
                                priority: int, want: dict) -> None:
    got = allocatable_release(pods, allocatable, "cpu", threshold, lower, priority)
    assert {k: v for k, v in got.items() if k in (BCPU, MCPU)} == want


@pytest.mark.parametrize("labels, priority, koord_qos, want_class, want_value", [
    ({}, None, "BE", BATCH, 5500), ({}, None, "LS", PROD, 9500), ({}, 7100, "LS", MID, 7100),
    ({"koordinator.sh/priority-class": "koord-mid"}, None, "BE", MID, 7500), ({}, None, "", "", 0),
])
def test_priority_class_and_value(labels: dict, priority: int | None, koord_qos: str, want_class: str,
                                  want_value: int) -> None:
    p = pod("p", koord_qos, priority=priority, labels=labels)
    assert (priority_class(p), priority_value(p)) == (want_class, want_value)


def test_victims_order_and_filters() -> None:
    big, small = batch_pod("big", 4000), batch_pod("small", 1000)
    first = batch_pod("first", 10, annotations={"koordinator.sh/eviction-priority": "-5"})
    no_label = batch_pod("nolabel", 9000, labels={})
    no_sample = batch_pod("nosample", 9000)
    prod = requesting("prod", "LS", 9500)
    refused = batch_pod("refused", 9000, annotations={"koordinator.sh/eviction-policy": '["BECPUEvict"]'})
    pods = [small, no_label, big, first, no_sample, prod, refused]
    used = {p.uid: 1.0 for p in pods if p.uid != "nosample"}
    got = allocatable_victims(pods, used, "CPUAllocatableEvict", BATCH_MAX, "cpu")
    assert [p.uid for p in got] == ["first", "big", "small"]


@pytest.mark.parametrize("raw, error", [
    ({"cpuAllocatableEvictThresholdPercent": -1}, "cpuAllocatableEvictThresholdPercent=-1"),
    ({"allocatableEvictPriorityThreshold": 9000}, "allocatableEvictPriorityThreshold=9000"),
    ({"memoryAllocatableEvictLowerPercent": "70"}, "memoryAllocatableEvictLowerPercent='70'"),
])
def test_nodeslo_fields_checked(raw: dict, error: str) -> None:
    with pytest.raises(SLOError, match=error):
        threshold_config({"spec": {"resourceUsedThresholdWithBE": {"enable": True, **raw}}})


def test_nodeslo_accepts_above_100_percent() -> None:
    cfg = threshold_config({"spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "cpuAllocatableEvictThresholdPercent": 110, "cpuAllocatableEvictLowerPercent": 100,
        "allocatableEvictPriorityThreshold": 5999}}})
    assert cfg is not None and cfg.cpu_allocatable_evict_threshold_percent == 110


class RecordingEvictor:
    def __init__(self) -> None:
        self.evicted: list[tuple[str, str]] = []

    def evict_until(self, victims, release, amount, reason, message) -> int:
        released, n = 0.0, 0
        for p in victims:
            if released >= release:
                break
            self.evicted.append((p.uid, reason))
            message(p)
            released += amount(p)
            n += 1
        return n

    def close(self) -> None:
        pass


def manager(tmp_path, informer, gate: str, cache: MetricCache) -> tuple[QOSManager, RecordingEvictor]:
    evictor = RecordingEvictor()
    qos = QOSManager(QOSConfig(gates={gate: True}, cpu_evict_cool_time=0, memory_evict_cool_time=0),
                     informer, cache, ResourceExecutor(CgroupLayout(tmp_path, version=1)), evictor=evictor)  # type: ignore[arg-type]
    return qos, evictor


def test_cpu_allocatable_tick_evicts_until_released(tmp_path) -> None:
    pods = [batch_pod("a", 45000), batch_pod("b", 40000), batch_pod("c", 5000)]
    cache = MetricCache(None)
    now = time.time()
    cache.append([Sample(POD_CPU_USAGE, {POD_UID: p.uid}, now, 0.5) for p in pods])
    node = {"status": {"capacity": {"cpu": "100"}, "allocatable": {"cpu": "100", BCPU: "100000"}}}
    slo = {"spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "cpuAllocatableEvictThresholdPercent": 80, "cpuAllocatableEvictLowerPercent": 70,
        "allocatableEvictPriorityThreshold": BATCH_MAX}}}
    qos, evictor = manager(tmp_path, FakeStatesInformer(pods, slo, node), "CPUAllocatableEvict", cache)
    strategy = next(s for s in qos.strategies if isinstance(s, CPUEvict))
    assert strategy.enabled()
    strategy.run_once()
    # requests 90000 > 80% of 100000: release 90000 - 70000 = 20000: "a" (45000) covers it
    assert evictor.evicted == [("a", "trigger by koordlet feature CPUAllocatableEvict")]


def test_memory_allocatable_tick(tmp_path) -> None:
    pods = []
    for uid, gib in (("x", 3), ("y", 2)):
        pods.append(with_resources(requesting(uid, "BE", 5000), requests={BMEM: gib * GI}))
    cache = MetricCache(None)
    now = time.time()
    cache.append([Sample(POD_MEMORY_USAGE, {POD_UID: p.uid}, now, float(GI)) for p in pods])
    node = {"status": {"capacity": {"memory": "8Gi"}, "allocatable": {"memory": "8Gi", BMEM: "4Gi"}}}
    slo = {"spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "memoryAllocatableEvictThresholdPercent": 100, "memoryAllocatableEvictLowerPercent": 90,
        "allocatableEvictPriorityThreshold": BATCH_MAX}}}
    qos, evictor = manager(tmp_path, FakeStatesInformer(pods, slo, node), "MemoryAllocatableEvict", cache)
    strategy = next(s for s in qos.strategies if isinstance(s, MemoryEvict))
    strategy.run_once()
    # 5Gi requested > 100% of 4Gi: release 5Gi - 3.6Gi; the larger request goes first
    assert evictor.evicted == [("x", "trigger by koordlet feature MemoryAllocatableEvict")]


def test_incomplete_config_does_nothing(tmp_path, caplog) -> None:
    pods = [batch_pod("a", 90000)]
    node = {"status": {"capacity": {"cpu": "100"}, "allocatable": {"cpu": "100", BCPU: "100000"}}}
    slo = {"spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuAllocatableEvictThresholdPercent": 80}}}
    qos, evictor = manager(tmp_path, FakeStatesInformer(pods, slo, node), "CPUAllocatableEvict", MetricCache(None))
    next(s for s in qos.strategies if isinstance(s, CPUEvict)).run_once()
    assert evictor.evicted == []
    assert "CPUAllocatableEvict needs" in caplog.text
