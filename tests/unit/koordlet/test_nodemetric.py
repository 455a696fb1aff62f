"""NodeMetric status: upstream's table cases, quantities, cold start, memory policies."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity

from koord.koordlet import metriccache as mc
from koord.koordlet.metriccache import Aggregation, MetricCache, Sample
from koord.koordlet.slo import parse_host_apps
from koord.koordlet.statesinformer import ContainerMeta
from koord.koordlet.statesinformer.nodemetric import (
    build_status,
    cpu_quantity,
    in_cold_start,
    memory_quantity,
    priority_class_with_default,
    qos_with_default,
)
from koord.koordlet.statesinformer.specs import node_metric_collect_policy
from koord_testing.pods import pod_meta

NOW = 1_800_000_000.0
DEFAULT_POLICY = node_metric_collect_policy(None)


class ByAggregation:
    """upstream's mock: every query answers 1, 2, 3, 4, 5 for avg, p50, p90, p95, p99."""

    VALUES = {Aggregation.AVG: 1, Aggregation.P50: 2, Aggregation.P90: 3, Aggregation.P95: 4,
              Aggregation.P99: 5}

    def __init__(self, span=3600.0):
        self.span = span

    def aggregate(self, kind, start, end, agg, labels=None):
        return float(self.VALUES[agg])

    def aggregates(self, kind, start, end, aggs, labels=None):
        return {agg: float(self.VALUES[agg]) for agg in aggs}

    def aggregate_by(self, kind, label, start, end, aggs):
        return {}  # no pod or container has samples

    def time_range(self, kind, start, end, labels=None):
        return self.span

    def get_kv(self, key):
        return None


def pod(name, uid, koord_qos="", kube_qos="besteffort", priority=None, containers=()):
    return pod_meta("default", name, uid, f"kubepods/{kube_qos}/pod{uid}", kube_qos=kube_qos,
                    koord_qos=koord_qos, containers=containers, priority=priority)


def test_collect_node_aggregate_metric_mocked_1_to_5():
    status = build_status(ByAggregation(), [], DEFAULT_POLICY, now=NOW)
    windows = status["nodeMetric"]["aggregatedNodeUsages"]
    assert [w["duration"] for w in windows] == ["5m0s", "10m0s", "30m0s"]
    for w in windows:
        assert w["usage"] == {name: {"resources": {"cpu": v, "memory": v}} for name, v in
                              (("avg", "1"), ("p50", "2"), ("p90", "3"), ("p95", "4"), ("p99", "5"))}
    assert status["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "1", "memory": "1"}}
    assert status["nodeMetric"]["systemUsage"] == {"resources": {"cpu": "1", "memory": "1"}}


@pytest.mark.parametrize("span,cold", [(150, True), (299, True), (300, False), (600, False)])
def test_metrics_in_cold_start_2_5_of_10_minutes(span, cold):
    assert in_cold_start(NOW - 600, NOW, span) is cold
    status = build_status(ByAggregation(span=span), [],
                          dict(DEFAULT_POLICY, durations=[600.0]), now=NOW)
    usage = status["nodeMetric"]["aggregatedNodeUsages"][0]["usage"]
    assert all(m == {} for m in usage.values()) is cold


def test_cold_start_with_real_cache_then_warm():
    cache = MetricCache(None)
    for i in range(0, 151, 10):  # 2.5 minutes of samples in a 10-minute window
        cache.append([Sample(mc.NODE_CPU_USAGE, {}, NOW - 150 + i, 1.5),
                      Sample(mc.NODE_MEMORY_USAGE, {}, NOW - 150 + i, 512 * 2**20)])
    policy = dict(DEFAULT_POLICY, durations=[600.0, 200.0])
    status = build_status(cache, [], policy, now=NOW)
    cold, warm = status["nodeMetric"]["aggregatedNodeUsages"]
    assert cold == {"duration": "10m0s", "usage": {k: {} for k in ("avg", "p50", "p90", "p95", "p99")}}
    assert warm["usage"]["p99"] == {"resources": {"cpu": "1500m", "memory": "512Mi"}}
    assert status["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "1500m", "memory": "512Mi"}}
    assert status["nodeMetric"]["systemUsage"] == {}  # no sys_* samples
    cache.close()


@pytest.mark.parametrize("policy,node_kind,pod_kind", [
    ("usageWithoutPageCache", mc.NODE_MEMORY_USAGE, mc.POD_MEMORY_USAGE),
    ("usageWithPageCache", mc.NODE_MEMORY_USAGE_WITH_PAGE_CACHE, mc.POD_MEMORY_USAGE_WITH_PAGE_CACHE),
    ("usageWithHotPageCache", mc.NODE_MEMORY_USAGE, mc.POD_MEMORY_USAGE),  # no cold-memory collector
])
def test_memory_policy_picks_the_memory_kind(policy, node_kind, pod_kind):
    cache = MetricCache(None)
    t = NOW - 10
    cache.append([Sample(mc.NODE_CPU_USAGE, {}, t, 1.0), Sample(mc.SYS_CPU_USAGE, {}, t, 0.25),
                  Sample(mc.SYS_MEMORY_USAGE, {}, t, 1024.0),
                  Sample(mc.POD_CPU_USAGE, {mc.POD_UID: "u1"}, t, 0.5)])
    cache.append([Sample(node_kind, {}, t, 2048.0), Sample(pod_kind, {mc.POD_UID: "u1"}, t, 4096.0)])
    status = build_status(cache, [pod("p", "u1")], dict(DEFAULT_POLICY, nodeMemoryCollectPolicy=policy),
                          now=NOW)
    assert status["nodeMetric"]["nodeUsage"]["resources"]["memory"] == "2Ki"
    assert status["nodeMetric"]["systemUsage"] == {"resources": {"cpu": "250m", "memory": "1Ki"}}
    assert status["podsMetric"][0]["podUsage"]["resources"] == {"cpu": "500m", "memory": "4Ki"}
    cache.close()


def test_pods_metric_sorted_with_priority_and_qos_and_pods_without_samples_omitted():
    cache = MetricCache(None)
    t = NOW - 5
    for uid, cores, n_bytes in (("u-b", 1.0, 200 * 2**20), ("u-a", 0.001, 1536)):
        cache.append([Sample(mc.POD_CPU_USAGE, {mc.POD_UID: uid}, t, cores),
                      Sample(mc.POD_MEMORY_USAGE, {mc.POD_UID: uid}, t, n_bytes)])
    pods = [pod("zeta", "u-b", koord_qos="BE",
                containers=[ContainerMeta("burn", "c1", "x", True)]),
            pod("alpha", "u-a", kube_qos="guaranteed", priority=9500),
            pod("quiet", "u-none")]
    status = build_status(cache, pods, DEFAULT_POLICY, now=NOW)
    assert status["podsMetric"] == [
        {"namespace": "default", "name": "alpha", "priority": "koord-prod", "qos": "LSR",
         "podUsage": {"resources": {"cpu": "1m", "memory": "1536"}}},
        {"namespace": "default", "name": "zeta", "priority": "koord-batch", "qos": "BE",
         "podUsage": {"resources": {"cpu": "1", "memory": "200Mi"}}},
    ]
    assert status["updateTime"] == "2027-01-15T08:00:00Z"
    cache.close()


def test_host_applications_from_node_slo():
    apps = parse_host_apps({"hostApplications": [{"name": "nginx", "qos": "LS", "priority": "koord-prod"},
                                                 {"name": "agent"}]})
    status = build_status(ByAggregation(), [], DEFAULT_POLICY, host_apps=apps, now=NOW)
    assert status["hostApplicationMetric"] == [
        {"name": "agent", "usage": {"resources": {"cpu": "1", "memory": "1"}}},
        {"name": "nginx", "usage": {"resources": {"cpu": "1", "memory": "1"}},
         "priority": "koord-prod", "qos": "LS"}]


@pytest.mark.parametrize("koord_qos,kube_qos,priority,want_qos,want_priority", [
    ("", "guaranteed", None, "LSR", "koord-prod"),
    ("", "burstable", None, "LS", "koord-prod"),
    ("", "besteffort", None, "BE", "koord-batch"),
    ("LSE", "guaranteed", None, "LSE", "koord-prod"),
    ("SYSTEM", "burstable", None, "SYSTEM", "koord-prod"),
    ("BE", "besteffort", 7500, "BE", "koord-mid"),
    ("LS", "burstable", 3500, "LS", "koord-free"),
    ("LS", "burstable", 100, "LS", "koord-prod"),
])
def test_qos_and_priority_defaults(koord_qos, kube_qos, priority, want_qos, want_priority):
    p = pod("p", "u", koord_qos=koord_qos, kube_qos=kube_qos, priority=priority)
    assert qos_with_default(p) == want_qos
    assert priority_class_with_default(p) == want_priority


@pytest.mark.parametrize("milli,text", [(0, "0"), (1, "1m"), (1500, "1500m"), (1000, "1"),
                                        (2000, "2"), (1_000_000, "1k"), (999, "999m")])
def test_cpu_quantity(milli, text):
    assert cpu_quantity(milli) == text


@pytest.mark.parametrize("n,text", [(0, "0"), (1023, "1023"), (1024, "1Ki"), (1536, "1536"),
                                    (209715200, "200Mi"), (2**30, "1Gi"), (4096 * 3, "12Ki")])
def test_memory_quantity(n, text):
    assert memory_quantity(n) == text


@given(st.integers(min_value=0, max_value=10**15))
def test_quantities_parse_back_to_their_value(n):
    """Kubernetes' own parser reads what we write: the API server and kubectl agree."""
    assert parse_quantity(cpu_quantity(n)) * 1000 == n
    assert parse_quantity(memory_quantity(n)) == n


def test_numa_usages_sorted_by_id_and_only_with_samples():
    cache = MetricCache(None)
    t = NOW - 5
    cache.set_kv(mc.NODE_NUMA_INFO, {"nodes": [{"id": 1}, {"id": 0}, {"id": 2}, {"id": "x"}]})
    for numa, cores in (("1", 0.5), ("0", 1.5)):
        cache.append([Sample(mc.NODE_NUMA_CPU_USAGE, {mc.NUMA_NODE_ID: numa}, t, cores),
                      Sample(mc.NODE_NUMA_MEMORY_USAGE, {mc.NUMA_NODE_ID: numa}, t, 2**30)])
    status = build_status(cache, [], DEFAULT_POLICY, now=NOW)
    assert status["nodeMetric"]["numaUsages"] == [
        {"numaNodeID": 0, "nodeUsage": {"resources": {"cpu": "1500m", "memory": "1Gi"}}, "systemUsage": {}},
        {"numaNodeID": 1, "nodeUsage": {"resources": {"cpu": "500m", "memory": "1Gi"}}, "systemUsage": {}}]
    cache.set_kv(mc.NODE_NUMA_INFO, "garbage")
    assert "numaUsages" not in build_status(cache, [], DEFAULT_POLICY, now=NOW)["nodeMetric"]
    cache.close()
