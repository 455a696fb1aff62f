"""koordlet's process wiring: module order, a failing module does not stall the others,
Prometheus on --addr, NodeMetric reported from the metric cache."""

import json
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from koord.koordlet.cli import Koordlet
from koord.koordlet.flags import parse_args
from koord.koordlet.metriccache import NODE_CPU_USAGE, NODE_MEMORY_USAGE, MetricCache, Sample
from koord.koordlet.metricsadvisor.framework import CgroupTarget
from koord.koordlet.prediction import PredictionConfig
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.pods import pod_meta
from koord_testing.scrape import samples


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def short_dir():
    d = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def koordlet(tmp_path, short_dir, *extra):
    root = tmp_path / "cg"
    make_fake_v1_cgroup(root, "kubepods/besteffort/podx")
    args = parse_args(["--runtime-hooks-addr", str(short_dir / "k.sock"),
                       "--runtime-hooks-config-path", str(short_dir / "cfg"),
                       "--cgroup-root-dir", str(root), "--runtime-hooks-reconcile-interval", "0",
                       "--containerd-endpoint", str(short_dir / "no-cri.sock"),
                       "--kubelet-sync-interval", "100ms",
                       "--prediction-checkpoint-filepath", str(tmp_path / "prediction"),
                       # Empty proc/sys: the metrics advisor finds nothing to add to the samples the tests write.
                       "--proc-root-dir", str(tmp_path / "proc"), "--sys-root-dir", str(tmp_path / "sys"), *extra])
    return Koordlet(args)


def running(k: Koordlet, name: str) -> object:
    """What module ``name`` runs; None while it is down or when it is not configured."""
    found = [m for m in k.modules.modules if m.name == name]
    return getattr(found[0], "running", None) if found else None


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def module_up(port):
    return {line.split('module="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
            for line in scrape(port).splitlines() if line.startswith("koordlet_module_up{")}


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_unusable_metric_cache_does_not_stall_informer_or_hooks_and_is_retried(
        tmp_path, short_dir, caplog):
    blocker = tmp_path / "tsdb"
    blocker.write_text("a file where the cache dir should be")
    port = free_port()
    k = koordlet(tmp_path, short_dir, "--tsdb-path", str(blocker), "--addr", f"127.0.0.1:{port}",
                 "--node-metric-file", str(tmp_path / "nm.json"))
    k.start()
    try:
        assert (short_dir / "cfg" / "koordlet.json").exists()  # runtime hooks registered
        assert running(k, "metric-cache") is None and running(k, "nodemetric-reporter") is None
        assert module_up(port) == {
            "resource-executor": "1", "metric-cache": "0", "states-informer": "1",
            "prediction": "0", "nodemetric-reporter": "0", "node-topology": "0",
            "metrics-advisor": "0", "qos-manager": "0", "runtime-hooks": "1", "pleg": "1"}
        code, body = readyz(port)
        assert code == 503 and ("metric-cache, prediction, nodemetric-reporter, node-topology, "
                                "metrics-advisor, qos-manager") in body
        time.sleep(2.5)  # a few retries fail: each cause is logged once, not per attempt
        blocker.unlink()  # the fault goes away: the next retry round brings every module up
        deadline = time.monotonic() + 15
        while set(module_up(port).values()) != {"1"} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(module_up(port).values()) == {"1"}, module_up(port)
        assert all(running(k, name) is not None for name in (
            "metric-cache", "nodemetric-reporter", "metrics-advisor", "qos-manager", "prediction"))
        # Not ready still, for the one remaining reason: no CRI here, so no pod list.
        assert readyz(port) == (503, "states informer has not synced yet\n")
    finally:
        k.stop()
    messages = [r.getMessage() for r in caplog.records]
    text = " ".join(messages)
    assert sum("module metric-cache cannot start" in m for m in messages) == 1
    assert str(blocker) in text
    assert "nodemetric-reporter cannot start: no metric cache" in text
    assert "module qos-manager cannot start: no metric cache" in text
    assert "module metric-cache running after" in text
    assert "module qos-manager running after" in text


def test_busy_addr_is_logged_and_koordlet_runs(tmp_path, short_dir, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        k = koordlet(tmp_path, short_dir, "--tsdb-path", str(tmp_path / "tsdb"),
                     "--addr", f"127.0.0.1:{port}")
        k.start()
        try:
            assert (short_dir / "cfg" / "koordlet.json").exists()
            assert running(k, "metric-cache") is not None
        finally:
            k.stop()
    assert any("cannot serve Prometheus metrics" in r.getMessage() for r in caplog.records)


def test_node_metric_file_reported_without_node_slo(tmp_path, short_dir):
    nm = tmp_path / "nm.json"
    nm.write_text(json.dumps({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
                              "metadata": {"name": "n1"},
                              "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 1}}}))
    cache = MetricCache(tmp_path / "tsdb")  # history written before koordlet starts
    now = time.time()
    cache.append([Sample(NODE_CPU_USAGE, {}, now - 2, 0.5), Sample(NODE_MEMORY_USAGE, {}, now - 2, 2**30)])
    cache.close()
    port = free_port()
    k = koordlet(tmp_path, short_dir, "--tsdb-path", str(tmp_path / "tsdb"),
                 "--addr", f"127.0.0.1:{port}", "--node-metric-file", str(nm),
                 "--collect-res-used-interval", "100ms")  # advisor off: only the samples above
    k.start()
    try:
        deadline = time.monotonic() + 10
        while "status" not in json.loads(nm.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        status = json.loads(nm.read_text())["status"]
        assert status["nodeMetric"]["nodeUsage"] == {"resources": {"cpu": "500m", "memory": "1Gi"}}
        assert 'koordlet_node_metric_node_usage{node=' in scrape(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        k.stop()


def test_node_metric_report_can_be_disabled(tmp_path, short_dir):
    nm = tmp_path / "nm.json"
    nm.write_text(json.dumps({"metadata": {"name": "n1"}}))
    k = koordlet(tmp_path, short_dir, "--tsdb-path", str(tmp_path / "tsdb"), "--addr", "",
                 "--node-metric-file", str(nm), "--enable-node-metric-report=false")
    k.start()
    try:
        assert running(k, "nodemetric-reporter") is None and running(k, "metric-cache") is not None
    finally:
        k.stop()


def test_in_a_cluster_objects_come_from_the_api_server_and_status_goes_back(tmp_path, short_dir,
                                                                             monkeypatch):
    from koord_testing.kubeapi import NODEMETRICS, NODES, NODESLOS, FakeKubeAPI

    monkeypatch.setenv("NODE_NAME", "node1")
    cache = MetricCache(tmp_path / "tsdb")
    now = time.time()
    cache.append([Sample(NODE_CPU_USAGE, {}, now - 2, 0.25), Sample(NODE_MEMORY_USAGE, {}, now - 2, 2**20)])
    cache.close()
    with FakeKubeAPI() as api:
        api.put(NODES, {"metadata": {"name": "node1"}, "status": {"capacity": {"cpu": "2"}}})
        api.put(NODESLOS, {"metadata": {"name": "node1"},
                           "spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}}}}})
        api.put(NODEMETRICS, {"metadata": {"name": "node1"},
                              "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 1}}})
        k = koordlet(tmp_path, short_dir, "--tsdb-path", str(tmp_path / "tsdb"), "--addr", "",
                     "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                     "--collect-res-used-interval", "100ms")
        k.start()
        try:
            deadline = time.monotonic() + 10
            while not api.status_updates and time.monotonic() < deadline:
                time.sleep(0.05)
            assert k.informer.get_node()["status"]["capacity"]["cpu"] == "2"
            assert k.informer.get_node_slo().thresholds.enable is False
        finally:
            k.stop()
        assert api.status_updates, "koordlet never updated the NodeMetric status"
        assert api.status_updates[0]["nodeMetric"]["nodeUsage"] == {
            "resources": {"cpu": "250m", "memory": "1Mi"}}
        assert api.objects[NODEMETRICS]["node1"]["spec"] == {"metricCollectPolicy": {"reportIntervalSeconds": 1}}


def test_the_modules_record_into_koordlets_metrics(tmp_path, short_dir):
    """The executor's writes, the reconciler's invocations and each report's predictors are
    told to koordlet's metrics; the advisor's PSI and host-application rows are served."""
    k = koordlet(tmp_path, short_dir, "--runtime-hooks-reconcile-interval", "10s")
    assert k.executor.observe_write == k.metrics.record_cgroup_update
    assert k.hooks.reconciler is not None and k.hooks.reconciler.observe == k.metrics.record_reconciler_call
    k.prediction.running = SimpleNamespace(config=PredictionConfig())
    predictor = k._prod_predictor(None)
    assert predictor is not None and predictor.observe == k.metrics.record_prediction
    k.metric_cache.running = MetricCache(None)
    advisor = k._start_advisor()
    try:
        advisor.env.shared.host_app_usage = (("nginx", "koord-prod", "LS", 0.5, 2.0**20),)
        advisor.env.shared.psi = ((CgroupTarget(pod_meta("ns", "p", "u1", "d"), None, "d", "u1", "pod ns/p"),
                                   (("cpu", {"some": (1.0, 2.0, 3.0)}),)),)
        assert len(samples(k.metrics, "/internal-metrics", "koordlet_host_application_resource_usage")) == 2
        assert len(samples(k.metrics, "/external-metrics", "koordlet_pod_psi")) == 3
    finally:
        advisor.stop()
