"""CPU suppress arithmetic, with upstream koordlet's table cases and their numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.qosmanager.nodeinfo import Processor
from koord.koordlet.qosmanager.suppresscalc import (
    be_pool,
    calculate_suppress,
    cfs_quota_target,
    cpuset_target,
    pick_cpus,
)
from koord.koordlet.resources import KubeQoS
from koord.koordlet.slo import HostApp

from .qos_fakes import pod, procs

LS = pod("ls", "LS")
BE = pod("be", "BE", "besteffort")


@pytest.mark.parametrize("case, kwargs, want_milli", [
    ("LS 8 BE 2 on node 12 at 70% of 20", dict(node_used=12, pod_used={"ls": 8, "be": 2}), 4000),
    ("+ LS host app 1", dict(node_used=12, pod_used={"ls": 8, "be": 2},
                             host_apps=[HostApp("app", "LS", None, "host-latency-sensitive/app")],
                             host_app_used={"app": 1}), 4000),
    ("+ BE host app under besteffort", dict(
        node_used=12, pod_used={"ls": 8, "be": 2},
        host_apps=[HostApp("app", "BE", KubeQoS.BESTEFFORT, "app")],
        host_app_used={"app": 1}), 5000),
    ("BE host app elsewhere counts as non-BE", dict(
        node_used=12, pod_used={"ls": 8, "be": 2},
        host_apps=[HostApp("app", "BE", None, "host-best-effort/app")],
        host_app_used={"app": 1}), 4000),
    ("min 60%", dict(node_used=12, pod_used={"ls": 8, "be": 2}, min_percent=60), 12000),
    ("pod without meta counts as non-BE", dict(node_used=11, pod_used={"unknown": 8, "be": 4}), 6000),
    ("reservation above system usage", dict(node_used=12, pod_used={"ls": 8, "be": 2},
                                            reserved_milli=3000), 3000),
    ("may go negative", dict(node_used=19, pod_used={"ls": 18, "be": 1}), -4000),
    ("empty input", dict(node_used=0, pod_used={}), 14000),
])
def test_calculate_suppress(case: str, kwargs: dict, want_milli: int) -> None:
    args = dict(capacity_milli=20000, reserved_milli=0, pods=[LS, BE], host_apps=[],
                host_app_used={}, threshold_percent=70, min_percent=None)
    args.update(kwargs)
    assert calculate_suppress(**args).milli == want_milli, case


def test_calculate_suppress_explains_itself() -> None:
    s = calculate_suppress(capacity_milli=20000, reserved_milli=0, node_used=12,
                           pod_used={"ls": 8, "be": 2}, pods=[LS, BE], host_apps=[],
                           host_app_used={}, threshold_percent=70, min_percent=None)
    assert s.explain() == ("suppress 4000m = 20000m x 70% - non-BE pods 8.000 - non-BE host apps "
                           "0.000 - system 2.000 cores")


def test_kube_besteffort_pod_without_label_is_be() -> None:
    s = calculate_suppress(capacity_milli=20000, reserved_milli=0, node_used=10,
                           pod_used={"x": 2}, pods=[pod("x", "", "besteffort")], host_apps=[],
                           host_app_used={}, threshold_percent=70, min_percent=None)
    assert s.non_be_pods == 0


HT_SPLIT = procs((0, 0, 0, 0), (4, 0, 0, 0), (1, 1, 0, 0), (5, 1, 0, 0),
                 (2, 2, 1, 1), (6, 2, 1, 1), (3, 3, 1, 1), (7, 3, 1, 1))
HT_ADJACENT = procs((0, 0, 0, 0), (1, 0, 0, 0), (2, 1, 0, 0), (3, 1, 0, 0),
                    (4, 2, 1, 1), (5, 2, 1, 1), (6, 3, 1, 1), (7, 3, 1, 1))
SIXTEEN = procs((12, 6, 3, 1), (13, 6, 3, 1), (14, 7, 3, 1), (2, 1, 0, 0), (3, 1, 0, 0),
                (11, 5, 2, 1), (4, 2, 1, 0), (5, 2, 1, 0), (8, 4, 2, 1), (15, 7, 3, 1),
                (0, 0, 0, 0), (1, 0, 0, 0), (9, 4, 2, 1), (10, 5, 2, 1), (6, 3, 1, 0), (7, 3, 1, 0))


@pytest.mark.parametrize("n, layout, want", [
    (3, HT_SPLIT, [0, 4, 2]),
    (3, HT_ADJACENT, [0, 1, 4]),
    (5, SIXTEEN, [0, 1, 4, 5, 8]),
    (5, sorted(SIXTEEN, key=lambda p: p.cpu), [0, 1, 4, 5, 8]),
    (5, list(reversed(SIXTEEN)), [0, 1, 4, 5, 8]),
    (9, HT_SPLIT, []),
    (0, HT_SPLIT, []),
])
def test_pick_cpus(n: int, layout: list[Processor], want: list[int]) -> None:
    assert pick_cpus(n, layout) == want


# Upstream's adjustByCPUSet fixture: an LSR pod bound to "0,6", an LSE pod to "7".
LSR_CPUS, LSE_CPUS = {0, 6}, {7}


@pytest.mark.parametrize("case, old, excluded, want", [
    ("scale down", {7, 6, 3, 2}, set(), {2, 3, 4}),
    ("scale up", {7, 6}, set(), {2, 3, 4}),
    ("reservedCPUs 3", {7, 6, 3, 2}, {3}, {0, 4, 5}),
    ("reservedCPUs 1-6: not enough, keep", {7, 6, 3, 2}, set(range(1, 7)), set()),
    ("reservedCPUs 0-1,5-6: just enough", {7, 6, 3, 2}, {0, 1, 5, 6}, {2, 3, 4}),
    ("everything excluded: no division by zero", {7}, set(range(0, 7)), set()),
])
def test_cpuset_target(case: str, old: set[int], excluded: set[int], want: set[int]) -> None:
    got = cpuset_target(3000, HT_ADJACENT, old, excluded, LSE_CPUS, LSR_CPUS)
    assert set(got) == want, case


def test_cpuset_target_minimum_two_and_ten_percent_growth() -> None:
    sixteen = sorted(SIXTEEN, key=lambda p: p.cpu)
    assert len(cpuset_target(-5000, sixteen, set(range(16)), set(), set(), set())) == 2
    assert len(cpuset_target(16000, sixteen, {0, 1}, set(), set(), set())) == 4  # 2 + ceil(1.6)


@pytest.mark.parametrize("case, suppress_milli, current, want", [
    ("up in a 10% step", 20000, 10 * 100000, 18 * 100000),
    ("up within one step", 20000, 19 * 100000, 20 * 100000),
    ("down at once", 20000, 24 * 100000, 20 * 100000),
    ("inside the 1% band", 20000, int(19.8 * 100000), None),
    ("minimum 2000", 1, 20 * 100000, 2000),
    ("minimum written even inside the band", 1, 2000, 2000),
    ("from unlimited at once", 20000, -1, 20 * 100000),
    ("negative suppress", -3000, 100000, 2000),
])
def test_cfs_quota_target(case: str, suppress_milli: int, current: int, want: int | None) -> None:
    assert cfs_quota_target(suppress_milli, 80, current) == want, case


def test_be_pool() -> None:
    assert be_pool(HT_ADJACENT, {3}, {7}) == [0, 1, 2, 4, 5, 6]


processor_lists = st.lists(
    st.builds(Processor, cpu=st.integers(0, 63), core=st.integers(0, 31),
              socket=st.integers(0, 3), node=st.integers(0, 3)),
    max_size=64, unique_by=lambda p: p.cpu)


@given(n=st.integers(-5, 70), layout=processor_lists)
def test_pick_cpus_properties(n: int, layout: list[Processor]) -> None:
    got = pick_cpus(n, layout)
    assert len(set(got)) == len(got)
    assert set(got) <= {p.cpu for p in layout}
    assert len(got) <= max(n, 0)
    if 0 < n <= len(layout):
        assert len(got) == n


@given(suppress=st.integers(-10**7, 10**7), layout=processor_lists,
       old=st.sets(st.integers(0, 63)), excluded=st.sets(st.integers(0, 63)),
       lse=st.sets(st.integers(0, 63)), lsr=st.sets(st.integers(0, 63)))
def test_cpuset_target_properties(suppress: int, layout: list[Processor], old: set[int],
                                  excluded: set[int], lse: set[int], lsr: set[int]) -> None:
    got = cpuset_target(suppress, layout, old, excluded, lse, lsr)
    assert not set(got) & (excluded | lse)
    assert set(got) <= {p.cpu for p in layout}
    assert len(set(got)) == len(got)


@given(suppress=st.integers(-10**9, 10**9), cap=st.integers(1, 1024),
       current=st.one_of(st.just(-1), st.integers(1000, 10**9)))
def test_cfs_quota_target_properties(suppress: int, cap: int, current: int) -> None:
    got = cfs_quota_target(suppress, cap, current)
    if got is not None:
        assert got >= 2000
        if current != -1 and got > current:
            assert got - current <= cap * 100000 * 0.1


@given(capacity=st.integers(1, 10**6), reserved=st.integers(0, 10**6), node_used=st.floats(0, 1e4),
       ls=st.floats(0, 1e4), be=st.floats(0, 1e4), threshold=st.integers(0, 100),
       minimum=st.one_of(st.none(), st.integers(0, 100)))
def test_calculate_suppress_properties(capacity: int, reserved: int, node_used: float, ls: float, be: float,
                                       threshold: int, minimum: int | None) -> None:
    s = calculate_suppress(capacity_milli=capacity, reserved_milli=reserved, node_used=node_used,
                           pod_used={"ls": ls, "be": be}, pods=[LS, BE], host_apps=[], host_app_used={},
                           threshold_percent=threshold, min_percent=minimum)
    assert s.milli <= capacity * threshold // 100 or (minimum is not None and s.milli == capacity * minimum // 100)
    if minimum is not None:
        assert s.milli >= capacity * minimum // 100
    assert s.system >= reserved / 1000
