"""The gauges each NodeMetric report replaces, as the metrics pages serve them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from koord.koordlet.exposition import render
from koord.koordlet.metrics import KoordletMetrics, ReportRows
from koord.koordlet.metricsadvisor.framework import AdvisorMetrics, Point, SharedState
from koord.koordlet.statesinformer.meta import ContainerMeta, PodMeta


def pod(name: str, uid: str, containers: tuple[ContainerMeta, ...]) -> PodMeta:
    return PodMeta("ns", name, uid, {}, {}, "Burstable", "LS", None, f"kubepods/burstable/pod{uid}", "s", True,
                   containers)


WEB = pod("web", "u1", (ContainerMeta("app", "c1", "d", True, {"cpu": 500, "memory": 2**28},
                                      {"cpu": 1000, "memory": 2**29}),
                        ContainerMeta("side", "c2", "d", True, {"kubernetes.io/batch-cpu": 250}, {})))
JOB = pod("job", "u2", (ContainerMeta("run", "c3", "d", True, {"memory": 2**20}, {}),))
POD = {"node": "n1", "pod_uid": "u1", "pod_name": "web", "pod_namespace": "ns"}
APP = {**POD, "container_id": "c1", "container_name": "app"}
SIDE = {**POD, "container_id": "c2", "container_name": "side"}


def report(metrics: KoordletMetrics, pods: list[PodMeta],
           prod: tuple[dict[str, int] | None, dict[str, int] | None] | None = None) -> None:
    metrics.record_report_rows(ReportRows(
        (1.5, 2.0**30), (0.25, 2.0**28), [(p, (0.1, 2.0**20)) for p in pods],
        [(p, c.id, c.name, (0.05, 2.0**19)) for p in pods for c in p.containers], pods,
        [(0, (1.0, 2.0**29), (0.125, 2.0**27)), (1, (0.5, 2.0**29), None)], prod))


def value(metrics: KoordletMetrics, name: str, labels: dict[str, str]) -> float | None:
    """The sample from whichever registry serves it (each family is in one)."""
    found = [v for r in (metrics.registry, metrics.external) if (v := r.get_sample_value(name, labels)) is not None]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("name,labels,want", [
    ("koordlet_node_metric_node_usage", {"node": "n1", "resource": "cpu", "unit": "core"}, 1.5),
    ("koordlet_node_metric_node_usage", {"node": "n1", "resource": "memory", "unit": "byte"}, 2.0**30),
    ("koordlet_node_metric_system_usage", {"node": "n1", "resource": "cpu", "unit": "core"}, 0.25),
    ("koordlet_node_metric_numa_node_usage", {"node": "n1", "numa_node_id": "0", "resource": "cpu", "unit": "core"},
     1.0),
    ("koordlet_node_metric_numa_node_usage",
     {"node": "n1", "numa_node_id": "1", "resource": "memory", "unit": "byte"}, 2.0**29),
    ("koordlet_node_metric_numa_system_usage",
     {"node": "n1", "numa_node_id": "0", "resource": "cpu", "unit": "core"}, 0.125),
    ("koordlet_node_metric_numa_system_usage",
     {"node": "n1", "numa_node_id": "1", "resource": "cpu", "unit": "core"}, None),  # none reported
    ("koordlet_pod_resource_usage", {**POD, "resource": "cpu", "unit": "core"}, 0.1),
    ("koordlet_pod_resource_usage", {**POD, "resource": "memory", "unit": "byte"}, 2.0**20),
    ("koordlet_container_resource_usage", {**APP, "resource": "cpu", "unit": "core"}, 0.05),
    ("koordlet_container_resource_requests", {**APP, "resource": "cpu", "unit": "core"}, 0.5),
    ("koordlet_container_resource_requests", {**APP, "resource": "memory", "unit": "byte"}, 2**28),
    ("koordlet_container_resource_limits", {**APP, "resource": "cpu", "unit": "core"}, 1.0),
    ("koordlet_container_resource_requests", {**SIDE, "resource": "kubernetes.io/batch-cpu", "unit": "core"},
     0.25),
    ("koordlet_container_resource_limits", {**SIDE, "resource": "cpu", "unit": "core"}, None),
])
def test_a_report_is_served_as_gauges(name, labels, want):
    metrics = KoordletMetrics("n1")
    report(metrics, [WEB, JOB])
    assert value(metrics, name, labels) == want


def test_the_next_report_replaces_every_series_so_pods_that_left_disappear():
    metrics = KoordletMetrics("n1")
    report(metrics, [WEB, JOB])
    report(metrics, [JOB])
    assert value(metrics, "koordlet_pod_resource_usage", {**POD, "resource": "cpu", "unit": "core"}) is None
    assert value(metrics, "koordlet_container_resource_requests", {**APP, "resource": "cpu", "unit": "core"}) is None
    assert value(metrics, "koordlet_container_resource_requests",
                 {**POD, "pod_uid": "u2", "pod_name": "job", "container_id": "c3", "container_name": "run",
                  "resource": "memory", "unit": "byte"}) == 2**20


@pytest.mark.parametrize("path,served", [
    ("/external-metrics", {"koordlet_container_resource_requests", "koordlet_container_resource_limits"}),
    ("/internal-metrics", {"koordlet_start_time", "koordlet_node_metric_node_usage",
                           "koordlet_node_metric_system_usage", "koordlet_pod_resource_usage",
                           "koordlet_container_resource_usage", "koordlet_node_metric_numa_node_usage",
                           "koordlet_node_metric_numa_system_usage"}),
])
def test_each_report_family_is_served_on_upstreams_page_and_on_metrics(path, served):
    metrics = KoordletMetrics("n1")
    report(metrics, [WEB, JOB])
    assert families(metrics, path) == served
    assert served <= families(metrics, "/metrics")


def test_before_any_report_its_families_are_not_served_as_upstreams_go_client_leaves_empty_ones_out():
    assert families(KoordletMetrics("n1"), "/metrics") == {"koordlet_start_time"}


def families(metrics: KoordletMetrics, path: str) -> set[str]:
    out: list[bytes] = []
    body = metrics.pages()[path]({"REQUEST_METHOD": "GET"}, lambda status, headers: out.append(status.encode()))
    assert out == [b"200 OK"]
    return {line.split()[2] for line in b"".join(body).decode().splitlines() if line.startswith("# TYPE ")}


def allocatable(metrics: KoordletMetrics) -> dict[str, float]:
    return {s.labels["resource"] + "/" + s.labels["unit"]: s.value
            for f in metrics.external.collect() if f.name == "koordlet_node_resource_allocatable" for s in f.samples}


BATCH_MID = {"kubernetes.io/batch-cpu/integer": 3500, "kubernetes.io/batch-memory/byte": 2**30,
             "kubernetes.io/mid-cpu/integer": 0, "kubernetes.io/mid-memory/byte": 0}


@pytest.mark.parametrize("node,want", [
    ({"status": {"allocatable": {"cpu": "8", "kubernetes.io/batch-cpu": "3500",
                                 "kubernetes.io/batch-memory": "1Gi"}}}, BATCH_MID),
    ({"status": {"allocatable": {"kubernetes.io/batch-cpu": "3499.5", "kubernetes.io/batch-memory": 2**30}}},
     BATCH_MID),  # rounded up, as a Go Quantity's Value()
    ({"status": {}}, {}),
    (None, {}),
    ({"status": {"allocatable": {"kubernetes.io/batch-cpu": "lots"}}}, {}),
])
def test_the_nodes_batch_and_mid_allocatable_are_exported_as_upstreams(node, want):
    metrics = KoordletMetrics("n1")
    metrics.record_node_allocatable(node)
    assert allocatable(metrics) == want


def test_an_unreadable_node_keeps_the_last_allocatable():
    metrics = KoordletMetrics("n1")
    metrics.record_node_allocatable({"status": {"allocatable": {"kubernetes.io/batch-cpu": "3500",
                                                                "kubernetes.io/batch-memory": "1Gi"}}})
    metrics.record_node_allocatable({"status": {"allocatable": {"kubernetes.io/batch-cpu": "-"}}})
    assert allocatable(metrics) == BATCH_MID


@pytest.mark.parametrize("point,want", [
    (None, ""),
    (Point(1.5, 2.0**30, 0.0), '# HELP koordlet_node_used_cpu_cores Number of cpu cores used by node in realtime\n'
     '# TYPE koordlet_node_used_cpu_cores gauge\nkoordlet_node_used_cpu_cores{node="n1"} 1.5\n'
     '# HELP koordlet_node_used_memory_bytes Memory used by node in realtime\n'
     '# TYPE koordlet_node_used_memory_bytes gauge\nkoordlet_node_used_memory_bytes{node="n1"} 1.073741824e+09\n'),
])
def test_node_used_gauges_show_the_node_collectors_latest_tick(point, want):
    shared, registry = SharedState(), CollectorRegistry()
    registry.register(AdvisorMetrics(shared, "n1"))
    if point is not None:
        shared.set_node(point)
    assert render([registry]).decode() == want


def test_node_info_outcomes_are_served_as_upstreams_status_counters():
    shared, registry = SharedState(), CollectorRegistry()
    registry.register(AdvisorMetrics(shared, "n1"))
    for ok in (True, True, False):
        shared.count("node_cpu_info", ok)
    shared.count("node_numa_info", True)
    lines = [line for line in render([registry]).decode().splitlines() if not line.startswith("#")]
    assert lines == ['koordlet_collect_node_cpu_info_status{node="n1",status="succeeded"} 2',
                     'koordlet_collect_node_cpu_info_status{node="n1",status="failed"} 1',
                     'koordlet_collect_node_numa_info_status{node="n1",status="succeeded"} 1']


PROD = {"node": "n1", "priority": "koord-prod"}


@pytest.mark.parametrize("prod,cpu,memory,status", [
    (({"cpu": 2500, "memory": 2**30}, {"cpu": 1000, "memory": 2**29}), 2.5, 2**30, 0),
    ((None, None), 0, 0, 1),  # unpredicted: 0 and status 1, as upstream's
    (None, None, None, None),  # no predictor ran (the predict server is down): no series
])
def test_the_reports_prod_reclaimable_is_exported_as_upstreams_priority_gauges(prod, cpu, memory, status):
    metrics = KoordletMetrics("n1")
    report(metrics, [], prod)
    assert value(metrics, "koordlet_node_priority_resource_reclaimable", {**PROD, "resource": "cpu", "unit": "core"}) \
        == cpu
    assert value(metrics, "koordlet_node_priority_resource_reclaimable",
                 {**PROD, "resource": "memory", "unit": "byte"}) == memory
    assert value(metrics, "koordlet_node_resource_priority_reclaimable_status", PROD) == status


def test_kubelet_requests_are_upstreams_histogram_in_seconds():
    metrics = KoordletMetrics("n1")
    metrics.record_kubelet_request("get", "/pods/", 200, 0.003)
    labels = {"verb": "get", "path": "/pods/", "code": "200"}
    assert value(metrics, "koordlet_kubelet_request_duration_seconds_bucket", {**labels, "le": "0.004"}) == 1
    assert value(metrics, "koordlet_kubelet_request_duration_seconds_bucket", {**labels, "le": "0.001"}) == 0
