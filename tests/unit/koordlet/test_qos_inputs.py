"""Hostile NodeSLO thresholds, Node annotations and CPU topology: clean errors naming the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.qosmanager.nodeinfo import (
    NodeInfoError,
    capacity_milli_cpu,
    pod_allocated_cpus,
    processors,
    reserved_cpus,
    reserved_milli_cpu,
    system_qos_exclusive_cpus,
)
from koord.koordlet.slo import SLOError, ThresholdConfig, threshold_config
from koord.koordlet.statesinformer.specs import merged_node_slo

from .qos_fakes import pod


def slo(**fields: object) -> dict:
    return merged_node_slo({"spec": {"resourceUsedThresholdWithBE": fields}})


def test_defaults() -> None:
    cfg = threshold_config(merged_node_slo({"spec": {}}))
    assert cfg == ThresholdConfig(enable=False, cpu_suppress_threshold_percent=65,
                                  memory_evict_threshold_percent=70)
    assert cfg.memory_lower_percent == 68 and cfg.cpu_lower_percent is None


def test_parsed() -> None:
    cfg = threshold_config(slo(enable=True, cpuSuppressPolicy="cfsQuota", cpuSuppressThresholdPercent=65,
                               cpuSuppressMinPercent=10, cpuEvictThresholdPercent=80))
    assert (cfg.enable, cfg.cpu_suppress_policy, cfg.cpu_suppress_min_percent, cfg.cpu_lower_percent) == \
        (True, "cfsQuota", 10, 78)


@pytest.mark.parametrize("fields, message", [
    ({"cpuSuppressThresholdPercent": 101}, "cpuSuppressThresholdPercent=101: want an integer in [0, 100]"),
    ({"cpuSuppressThresholdPercent": -1}, "cpuSuppressThresholdPercent=-1"),
    ({"cpuSuppressThresholdPercent": "65"}, "cpuSuppressThresholdPercent='65'"),
    ({"cpuSuppressThresholdPercent": 65.5}, "cpuSuppressThresholdPercent=65.5"),
    ({"cpuSuppressThresholdPercent": True}, "cpuSuppressThresholdPercent=True"),
    ({"memoryEvictThresholdPercent": 10**30}, "memoryEvictThresholdPercent"),
    ({"memoryEvictThresholdPercent": 50, "memoryEvictLowerPercent": 60}, "above memoryEvictThresholdPercent"),
    ({"cpuEvictThresholdPercent": 50, "cpuEvictLowerPercent": 60}, "above cpuEvictThresholdPercent"),
    ({"cpuSuppressPolicy": "quota"}, "cpuSuppressPolicy='quota': want cpuset or cfsQuota"),
    ({"cpuEvictPolicy": 3}, "cpuEvictPolicy=3"),
    ({"enable": "yes"}, "enable='yes': want true or false"),
    ({"cpuEvictTimeWindowSeconds": 0}, "cpuEvictTimeWindowSeconds=0"),
])
def test_out_of_range(fields: dict, message: str) -> None:
    with pytest.raises(SLOError, match="spec.resourceUsedThresholdWithBE") as err:
        threshold_config(slo(**fields))
    assert message in str(err.value)


def test_not_an_object() -> None:
    with pytest.raises(SLOError, match="want an object, got list"):
        threshold_config({"spec": {"resourceUsedThresholdWithBE": []}})


@given(st.dictionaries(st.sampled_from([
    "enable", "cpuSuppressThresholdPercent", "cpuSuppressMinPercent", "cpuSuppressPolicy",
    "memoryEvictThresholdPercent", "memoryEvictLowerPercent", "cpuEvictThresholdPercent",
    "cpuEvictLowerPercent", "cpuEvictTimeWindowSeconds", "cpuEvictPolicy"]),
    st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=8),
              st.lists(st.integers(), max_size=2))))
def test_threshold_config_never_crashes(fields: dict) -> None:
    try:
        cfg = threshold_config(slo(**fields))
    except SLOError:
        return
    assert cfg is not None
    assert 0 <= cfg.cpu_suppress_threshold_percent <= 100
    assert cfg.memory_lower_percent <= cfg.memory_evict_threshold_percent


def node(capacity: str = "16", allocatable: str = "16", **annotations: object) -> dict:
    return {"metadata": {"annotations": {k.replace("_", "/", 1).replace("_", "-"): v if isinstance(v, str)
                                         else json.dumps(v) for k, v in annotations.items()}},
            "status": {"capacity": {"cpu": capacity, "memory": "40G"},
                       "allocatable": {"cpu": allocatable, "memory": "40G"}}}


RES = "node.koordinator.sh/reservation"
SYS = "node.koordinator.sh/system-qos-resource"


def with_ann(key: str, value: str) -> dict:
    n = node()
    n["metadata"]["annotations"][key] = value
    return n


@pytest.mark.parametrize("n, want", [
    (node(), 0),
    (node("16", "14"), 2000),
    (with_ann(RES, '{"resources": {"cpu": "3"}}'), 3000),
    (with_ann(RES, '{"reservedCPUs": "0-3"}'), 4000),
    ({"status": {"capacity": {"cpu": "16"}, "allocatable": {"cpu": "15500m"}},
      "metadata": {"annotations": {RES: '{"reservedCPUs": "0"}'}}}, 1000),
])
def test_reserved_milli_cpu(n: dict, want: int) -> None:
    assert reserved_milli_cpu(n) == want


@pytest.mark.parametrize("n, message", [
    (with_ann(RES, "{not json"), "node annotation node.koordinator.sh/reservation: bad JSON"),
    (with_ann(RES, '{"reservedCPUs": "0-99999"}'), "above the limit 4095"),
    (with_ann(RES, '{"reservedCPUs": "3-1"}'), "runs backwards"),
    (with_ann(RES, '{"reservedCPUs": 5}'), "reservation: reservedCPUs=5: want a string"),
    (with_ann(SYS, '{"cpuset": "x"}'), "system-qos-resource: cpuset: bad cpuset"),
    (with_ann(SYS, '{"cpuset": "1", "cpusetExclusive": "no"}'), "cpusetExclusive='no'"),
])
def test_bad_node_annotations(n: dict, message: str) -> None:
    with pytest.raises(NodeInfoError) as err:
        reserved_cpus(n) if RES in n["metadata"]["annotations"] else system_qos_exclusive_cpus(n)
    assert message in str(err.value)


def test_system_qos_not_exclusive() -> None:
    assert system_qos_exclusive_cpus(with_ann(SYS, '{"cpuset": "1-6", "cpusetExclusive": false}')) == set()
    assert system_qos_exclusive_cpus(with_ann(SYS, '{"cpuset": "1-2"}')) == {1, 2}


@pytest.mark.parametrize("n, message", [
    ({"status": {}}, "capacity.cpu: missing"),
    ({"status": {"capacity": {"cpu": "lots"}}}, "bad quantity"),
    ({"status": {"capacity": {"cpu": "1e30"}}}, "larger than"),
    ({"status": {"capacity": {"cpu": "9e18"}}}, "out of range"),
])
def test_bad_capacity(n: dict, message: str) -> None:
    with pytest.raises(NodeInfoError, match=message):
        capacity_milli_cpu(n)


@pytest.mark.parametrize("annotation, message", [
    ("{", "bad JSON"), ('{"cpuset": "0-a"}', "bad cpuset"), ('{"cpuset": 7}', "cpuset=7 is not a string"),
    ('{"cpuset": "0-100000000"}', "above the limit"),
])
def test_malformed_resource_status(annotation: str, message: str) -> None:
    p = pod("x", "LSR", annotations={"scheduling.koordinator.sh/resource-status": annotation})
    with pytest.raises(NodeInfoError, match=message):
        pod_allocated_cpus(p)


def test_processors_offline_dropped_and_bad_rejected() -> None:
    info = {"processors": [{"cpu": 0, "core": 0, "socket": 0, "node": 0, "online": True},
                           {"cpu": 1, "core": 0, "socket": 0, "node": 0, "online": False}]}
    assert [p.cpu for p in processors(info)] == [0]
    for bad, message in [({"processors": "x"}, "processors list"),
                         ({"processors": [{"cpu": -1}]}, r"processors\[0\].cpu=-1"),
                         ({"processors": [{"cpu": 0}, {"cpu": 0}]}, "listed twice"),
                         ({"processors": [{"cpu": 0, "core": "a"}]}, "core='a'")]:
        with pytest.raises(NodeInfoError, match=message):
            processors(bad)


_KEYS = st.sampled_from(["cpu", "core", "socket", "node", "online"])
_ENTRY = st.one_of(st.none(), st.integers(), st.dictionaries(
    _KEYS, st.one_of(st.integers(-5, 10**6), st.booleans(), st.text(max_size=3), st.none())))


@given(st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(_ENTRY, max_size=8),
                 st.fixed_dictionaries({"processors": st.lists(
                     st.dictionaries(_KEYS, st.integers(-2, 5000)), max_size=8)})))
def test_processors_never_crash(info: object) -> None:
    try:
        got = processors(info if not isinstance(info, list) else {"processors": info})
    except NodeInfoError:
        return
    assert len({p.cpu for p in got}) == len(got)
    assert all(0 <= p.cpu < 4096 for p in got)


@given(st.dictionaries(st.sampled_from([RES, SYS, "kubelet.koordinator.sh/cpu-manager-policy"]),
                       st.one_of(st.text(max_size=40), st.sampled_from([
                           '{"reservedCPUs": "0-3"}', '{"resources": {"cpu": "2"}}', '{"cpuset": "1"}',
                           '{"resources": {"cpu": "x"}}', '{"resources": []}', '{"policy": "static"}']))))
def test_node_readers_never_crash(annotations: dict[str, str]) -> None:
    n = node()
    n["metadata"]["annotations"] = annotations
    for reader in (reserved_milli_cpu, reserved_cpus, system_qos_exclusive_cpus):
        try:
            reader(n)
        except NodeInfoError:
            pass
