"""The API-server path, driven by the real kubernetes client against a local fake server."""

import time

import pytest
from kubernetes import config

from koord.koordlet.metriccache import MetricCache
from koord.koordlet.statesinformer import (
    NODE,
    NODE_METRIC,
    NODE_SLO,
    FileObjectsSource,
    KubeObjectsSource,
    StatesInformer,
)
from koord.koordlet.statesinformer.reporter import KubeStatusWriter, NodeMetricReporter, TokenBucket
from koord_testing.kubeapi import NODEMETRICS, NODES, NODESLOS, FakeKubeAPI

WAIT = 10.0


def wait_for(cond, what):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def api(tmp_path):
    with FakeKubeAPI() as server:
        server.client = config.new_client_from_config(
            config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server


@pytest.fixture
def informer(api):
    made = StatesInformer(objects=KubeObjectsSource(api.client, "node1"))
    yield made
    made.stop()


def test_list_watch_sees_only_this_node_and_every_change(api, informer):
    api.put(NODES, {"metadata": {"name": "node1", "annotations": {"a": "1"}},
                    "status": {"capacity": {"cpu": "4"}}})
    api.put(NODES, {"metadata": {"name": "other"}})
    fired = []
    informer.register_callback(NODE_SLO, lambda: fired.append("slo"))
    informer.start()
    wait_for(informer.has_synced, "the first list of each kind")
    assert informer.get_node()["status"]["capacity"]["cpu"] == "4"
    assert informer.get_node_slo() is None and informer.get_node_metric() is None
    api.put(NODESLOS, {"metadata": {"name": "node1"},
                       "spec": {"resourceUsedThresholdWithBE": {"enable": True}}})
    wait_for(lambda: informer.get_node_slo() is not None, "the NodeSLO watch event")
    thresholds = informer.get_node_slo().thresholds
    assert thresholds.enable is True and thresholds.cpu_suppress_threshold_percent == 65
    assert fired == ["slo"]
    api.put(NODES, {"metadata": {"name": "other", "annotations": {"x": "y"}}})
    api.put(NODES, {"metadata": {"name": "node1", "annotations": {"a": "2"}}})
    wait_for(lambda: informer.get_node()["metadata"]["annotations"] == {"a": "2"}, "node update")
    api.delete(NODESLOS, "node1")
    wait_for(lambda: informer.get_node_slo() is None, "the NodeSLO deletion")


def test_api_server_down_at_start_is_retried(tmp_path):
    with FakeKubeAPI() as server:
        client = config.new_client_from_config(
            config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    informer = StatesInformer(objects=KubeObjectsSource(client, "node1", kinds=(NODE,)))
    informer.start()  # must not raise nor block
    time.sleep(0.3)
    assert not informer.has_synced() and informer.get_node() is None
    informer.stop()


def test_reporter_updates_status_keeping_spec_and_retries_conflicts(api, informer):
    api.put(NODEMETRICS, {"metadata": {"name": "node1"},
                          "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 1}}})
    informer.start()
    wait_for(lambda: informer.get_node_metric() is not None, "the NodeMetric")
    assert informer.get_node_metric_spec()["reportIntervalSeconds"] == 1
    cache = MetricCache(None)
    writer = KubeStatusWriter(api.client, "node1")
    reporter = NodeMetricReporter(informer, cache, writer)
    api.conflicts_to_inject = 2
    status = reporter.report_once()
    assert api.status_updates == [status]
    stored = api.objects[NODEMETRICS]["node1"]
    assert stored["spec"] == {"metricCollectPolicy": {"reportIntervalSeconds": 1}}
    assert stored["status"]["nodeMetric"]["nodeUsage"] == {}
    cache.close()


def test_status_updates_are_rate_limited_as_upstream(api, informer):
    api.put(NODEMETRICS, {"metadata": {"name": "node1"}})
    informer.start()
    wait_for(lambda: informer.get_node_metric() is not None, "the NodeMetric")
    clock = [0.0]
    writer = KubeStatusWriter(api.client, "node1", TokenBucket(0.1, 2, clock=lambda: clock[0]))
    cache = MetricCache(None)
    reporter = NodeMetricReporter(informer, cache, writer)
    for _ in range(3):
        wait_for(lambda: informer.get_node_metric()["metadata"]["resourceVersion"]
                 == api.objects[NODEMETRICS]["node1"]["metadata"]["resourceVersion"], "watch")
        reporter.report_once()
    assert len(api.status_updates) == 2  # burst 2, then refused
    clock[0] = 10.0
    reporter.report_once()
    assert len(api.status_updates) == 3
    cache.close()


def test_no_report_until_the_node_metric_exists(api, informer):
    informer.start()
    wait_for(informer.has_synced, "sync")
    cache = MetricCache(None)
    reporter = NodeMetricReporter(informer, cache, KubeStatusWriter(api.client, "node1"))
    assert reporter.report_once() is None and api.status_updates == []
    cache.close()


@pytest.mark.parametrize("tokens,elapsed,allowed", [(2, 0, [True, True, False]),
                                                     (2, 10, [True, True, True])])
def test_token_bucket(tokens, elapsed, allowed):
    clock = [0.0]
    bucket = TokenBucket(0.1, tokens, clock=lambda: clock[0])
    got = [bucket.allow(), bucket.allow()]
    clock[0] += elapsed
    got.append(bucket.allow())
    assert got == allowed


def test_api_server_outage_is_logged_once_when_it_goes_and_once_when_it_is_back(
        tmp_path, monkeypatch, caplog):
    """Three list-watches retrying every 50 ms and a status writer, through an outage: one
    line when the server goes, one when it is back, no urllib3 retry warnings."""
    import logging

    from koord.koordlet import cli
    from koord.koordlet.statesinformer import objects

    monkeypatch.setattr(objects, "RETRY_SECONDS", 0.05)
    caplog.set_level(logging.INFO)
    first = FakeKubeAPI().__enter__()
    port = first.server.server_address[1]
    node_metric = {"metadata": {"name": "node1"}}
    first.put(NODEMETRICS, node_metric)
    client = cli.kube_api_client(first.write_kubeconfig(tmp_path / "kubeconfig"))
    source = KubeObjectsSource(client, "node1")
    informer = StatesInformer(objects=source)
    writer = KubeStatusWriter(client, "node1", TokenBucket(1000, 1000),
                              reachability=source.reachability)
    informer.start()
    try:
        wait_for(informer.has_synced, "the first list of each kind")
        assert writer.write(node_metric, {"a": 1})
        first.__exit__()
        time.sleep(1.5)  # ~30 failed relists per kind
        for _ in range(5):
            assert not writer.write(node_metric, {"a": 2})
        assert source.reachability.down
        with FakeKubeAPI(port=port) as second:
            second.put(NODES, {"metadata": {"name": "node1", "annotations": {"back": "yes"}}})
            wait_for(lambda: (informer.get_node() or {}).get("metadata", {}).get("annotations")
                     == {"back": "yes"}, "the informer after the outage")
            second.put(NODEMETRICS, node_metric)
            assert writer.write(second.objects[NODEMETRICS]["node1"], {"a": 3})
            time.sleep(0.5)
            informer.stop()  # before this server goes too: that would be a second outage
    finally:
        informer.stop()
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
                and "reachab" in r.getMessage()]
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"API server http://127.0.0.1:{port} unreachable (")
    assert messages[1].startswith(f"API server http://127.0.0.1:{port} reachable again after ")
    assert not [r for r in caplog.records if r.name.startswith("urllib3") and r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.getMessage().startswith("states informer: list-watch")], \
        "no per-retry lines"


def test_kinds_the_api_server_does_not_serve_are_absent_and_logged_once(tmp_path, caplog, monkeypatch):
    """CRDs not installed: 404 for NodeSLO and NodeMetric. The informer syncs with them absent
    (defaults), says so once per kind, and asks again at the slow pace; once the CRDs exist
    the objects arrive."""
    from koord.koordlet.statesinformer import objects

    monkeypatch.setattr(objects, "NOT_SERVED_RETRY_SECONDS", 0.2)
    with FakeKubeAPI(crds=False) as api:
        api.put(NODES, {"metadata": {"name": "node1"}})
        client = config.new_client_from_config(config_file=str(api.write_kubeconfig(tmp_path / "kc")))
        informer = StatesInformer(objects=KubeObjectsSource(client, "node1"))
        informer.start()
        try:
            wait_for(informer.has_synced, "sync without the CRDs")
            assert informer.get_node() is not None and informer.get_node_slo() is None
            wait_for(lambda: sum(1 for v, p in api.requests if p == NODESLOS) >= 3, "slow retries")
            said = [r.getMessage() for r in caplog.records if "does not serve" in r.getMessage()]
            assert sorted(m.split("serve ")[1].split(" ")[0] for m in said) == ["NodeMetric", "NodeSLO"]
            api.crds = True
            api.put(NODESLOS, {"metadata": {"name": "node1"}, "spec": {}})
            wait_for(lambda: informer.get_node_slo() is not None, "the NodeSLO once its CRD exists")
        finally:
            informer.stop()


@pytest.mark.parametrize("objects", ["api", "files", None])
def test_the_informer_hands_out_its_api_client_only_when_it_has_one(api, tmp_path, objects):
    """The modules that write to the API server (the reporter, the QoS manager's evictions)
    or reach the kubelet with its credentials take the client from the informer."""
    node_metric = tmp_path / "nm.json"
    source = {"api": lambda: KubeObjectsSource(api.client, "node1"),
              "files": lambda: FileObjectsSource({NODE_METRIC: node_metric}),
              None: lambda: None}[objects]()
    informer = StatesInformer(objects=source)
    assert informer.api_source() is (source if objects == "api" else None)
    assert informer.api_client() is (api.client if objects == "api" else None)
    informer.expect_own_write(NODE_METRIC, b"{}")  # told to the file source; a no-op for the others
    informer.expect_own_write(NODE_SLO, b"{}")  # a kind no file is read for
