"""Eviction arithmetic and victim orders, with upstream koordlet's table cases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.qosmanager.evictcalc import (
    BEUsage,
    be_cpu_victims,
    be_memory_victims,
    eviction_allowed,
    labelled_victims,
    pick_until_released,
    release_by_be_satisfaction,
    release_by_used_threshold,
    release_memory,
)

from .qos_fakes import GI, pod


@pytest.mark.parametrize("case, usage, want", [
    ("avg: limit 10000 of request 50000, used 9500", BEUsage(9500, 50000, 10000), 10000),
    ("last: limit 14000", BEUsage(13500, 50000, 14000), 6000),
    ("avg limit 13000", BEUsage(12500, 50000, 13000), 7000),
    ("last limit 11000", BEUsage(10500, 50000, 11000), 9000),
    ("usage below 90% of the limit", BEUsage(5000, 50000, 10000), 0),
    ("satisfied above lower", BEUsage(19000, 50000, 20000), 0),
    ("no request", BEUsage(900, 0, 1000), 0),
    ("limit below one core counts as saturated", BEUsage(0, 50000, 500), 19500),
    ("no limit", BEUsage(100, 50000, 0), 0),
])
def test_release_by_be_satisfaction(case: str, usage: BEUsage, want: int) -> None:
    assert release_by_be_satisfaction(usage, 30, 40, 90) == want, case


def test_release_by_be_satisfaction_takes_min_of_avg_and_last() -> None:
    """Upstream's two cases: avg and last computed alike, the smaller release wins."""
    avg, last = BEUsage(9500, 50000, 10000), BEUsage(13500, 50000, 14000)
    assert min(release_by_be_satisfaction(u, 30, 40, 90) for u in (avg, last)) == 6000
    avg, last = BEUsage(12500, 50000, 13000), BEUsage(10500, 50000, 11000)
    assert min(release_by_be_satisfaction(u, 30, 40, 90) for u in (avg, last)) == 7000


@pytest.mark.parametrize("used, lower, want", [(81, 78, 3000), (81, 80, 1000), (11, 78, 0)])
def test_release_by_used_threshold(used: float, lower: int, want: int) -> None:
    assert release_by_used_threshold(used, 100000, 80, lower) == want


# Upstream's Test_memoryEvict: a 120G node using 115G (95%); BE pods at priority 100 using
# 20G and 5G, one at priority 120 using 10G.
NODE = 120 * GI
PODS = [pod("p100-20g", "BE", "besteffort", priority=100), pod("p100-5g", "BE", "besteffort", priority=100),
        pod("p120-10g", "BE", "besteffort", priority=120), pod("ls", "LS", priority=9000)]
USED = {"p100-20g": 20 * GI, "p100-5g": 5 * GI, "p120-10g": 10 * GI, "ls": 30 * GI}


@pytest.mark.parametrize("case, node_used, threshold, lower, want_release, want_victims", [
    ("threshold 82: 18G", 115 * GI, 82, None, 18 * NODE // 120, ["p100-20g"]),
    ("threshold 80: 20.4G", 115 * GI, 80, None, NODE * 17 // 100, ["p100-20g", "p100-5g"]),
    ("threshold 50: all BE", 115 * GI, 50, None, NODE * 47 // 100, ["p100-20g", "p100-5g", "p120-10g"]),
    ("lower 74: 25.2G", 115 * GI, 82, 74, NODE * 21 // 100, ["p100-20g", "p100-5g", "p120-10g"]),
    ("80G used: none", 80 * GI, 82, None, 0, []),
])
def test_memory_evict(case: str, node_used: int, threshold: int, lower: int | None,
                      want_release: int, want_victims: list[str]) -> None:
    release = release_memory(node_used, NODE, threshold, threshold - 2 if lower is None else lower)
    assert release == want_release, case
    victims = be_memory_victims(PODS, USED, "BEMemoryEvict")
    picked = pick_until_released(victims, release, lambda p: USED[p.uid]) if release else []
    assert [p.uid for p in picked] == want_victims, case


def test_memory_victims_without_sample_last_by_name_desc() -> None:
    pods = [pod("a", "BE", "besteffort"), pod("b", "BE", "besteffort"), pod("c", "BE", "besteffort")]
    assert [p.uid for p in be_memory_victims(pods, {"b": 1.0}, "BEMemoryEvict")] == ["b", "c", "a"]


def test_memory_victims_priority_only_when_both_set() -> None:
    pods = [pod("low-use", "BE", "besteffort", priority=100), pod("high-use", "BE", "besteffort")]
    got = be_memory_victims(pods, {"low-use": 1.0, "high-use": 9.0}, "BEMemoryEvict")
    assert [p.uid for p in got] == ["high-use", "low-use"]


@pytest.mark.parametrize("annotation, allowed", [
    (None, True), ('["BEMemoryEvict"]', True), ('["CPUEvict"]', False), ("not json", False),
    ('{"a": 1}', False),
])
def test_eviction_policy(annotation: str | None, allowed: bool) -> None:
    p = pod("x", "BE", annotations={"koordinator.sh/eviction-policy": annotation} if annotation else {})
    assert eviction_allowed(p, "BEMemoryEvict") is allowed


def test_be_cpu_victims_by_usage_per_request() -> None:
    pods = [pod("a", "BE", "besteffort", batch_cpu=4000), pod("b", "BE", "besteffort", batch_cpu=1000),
            pod("ls", "LS")]
    got = be_cpu_victims(pods, {"a": 2.0, "b": 1.0, "ls": 5.0}, "BECPUEvict")
    assert [p.uid for p in got] == ["b", "a"]


def test_labelled_victims_order_and_filter() -> None:
    on = {"koordinator.sh/eviction-enabled": "true"}
    pods = [pod("p1", "LS", labels=on, priority=5000, annotations={"koordinator.sh/eviction-priority": "2"}),
            pod("p2", "LS", labels=on, priority=5000),
            pod("p3", "LS", labels=on, priority=4000),
            pod("off", "LS", priority=1000),
            pod("high", "LS", labels=on, priority=9000),
            pod("nosample", "LS", labels=on, priority=1000)]
    used = {"p1": 1.0, "p2": 1.0, "p3": 0.5, "off": 9.0, "high": 9.0}
    got = labelled_victims(pods, used, "CPUEvict", priority_threshold=7999)
    assert [p.uid for p in got] == ["p3", "p2", "p1"]


@given(used=st.floats(0, 2**50, allow_nan=False), capacity=st.integers(0, 2**50),
       threshold=st.integers(0, 100), lower=st.integers(0, 100))
def test_release_memory_never_negative_when_lower_le_threshold(used: float, capacity: int,
                                                               threshold: int, lower: int) -> None:
    if lower <= threshold:
        assert release_memory(used, capacity, threshold, lower) >= 0
