"""koordlet as the node agent, end to end: real containerd and runc, real cgroups, a pod
burning one CPU and one holding 200 MiB; the NodeMetric file and Prometheus report them,
and the metric history survives ``kill -9``."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from koord.hookapi import parse_quantity
from koord.koordlet.metriccache import POD_CPU_USAGE, POD_UID, Aggregation, MetricCache
from koord_testing.cgroups import Cgroup, enable_v2_controllers, remove_tree
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.wait import scaled
from koord_testing.wait import wait_for as wait
from koord_testing.workloads import burn_command, hold_command

pytestmark = pytest.mark.e2e
T = TypeVar("T")

MiB = 2**20
REPORT_SECONDS, AGGREGATE_SECONDS, WINDOW = 2, 10, "16s"


def wait_for(check: Callable[[], T], what: str, timeout: float = 90.0) -> T:
    # a file being replaced, a metric not there yet
    return wait(check, what, timeout, interval=0.2, tolerate=(OSError, ValueError, KeyError))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, path: str = "/metrics") -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for name, labels, value in re.findall(r"^(\w+)(?:\{(.*)\})? (\S+)$", text, re.M):
        samples[(name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return samples


def pod_usage(status: dict, name: str) -> tuple[float, float] | None:
    for m in status.get("podsMetric", []):
        if m["name"] == name:
            res = m["podUsage"]["resources"]
            return float(parse_quantity(res["cpu"])), float(parse_quantity(res["memory"]))
    return None


def accurate(status: dict) -> dict | None:
    """The status when the burner shows 1 core (±20%) and the holder 200 MiB (±10%)."""
    burner, holder = pod_usage(status, "burner"), pod_usage(status, "holder")
    if burner is None or holder is None:
        return None
    if abs(burner[0] - 1.0) <= 0.2 and abs(holder[1] - 200 * MiB) <= 20 * MiB:
        return status
    return None


@pytest.fixture
def kube_dir(containerd: Containerd):
    """A private pod cgroup root (``--cgroup-kube-dir``), apart from any kubelet's and other
    tests'. It gets the largest cpu.shares (v2: weight), so the burner gets its core from the
    CFS even when the machine is busy with processes of the root cgroup."""
    name = f"kl-e2e-{uuid.uuid4().hex[:8]}"
    enable_v2_controllers(name)
    top = Cgroup(name)
    top.dir("cpu").mkdir(exist_ok=True)
    top.set_cpu_weight_from_shares(262144)
    yield f"{name}/kubepods"
    # pods are gone by now (the kubelet fixture removed them first)
    assert not remove_tree(name), f"cgroup dirs of {name} stayed"


@pytest.fixture
def pods(containerd: Containerd, kube_dir: str, kubelet: KubeletClient):
    kubelet.kube_dir = kube_dir
    # The burner asks for a full CPU (1024 shares) so it gets one on a busy machine too.
    burner = kubelet.run_pod("burner", labels={"koordinator.sh/qosClass": "LS"}, qos="burstable")
    kubelet.run_container(burner, "burn", containerd.image, command=burn_command(1),
                          resources={"cpu_shares": 1024, "cpu_period": 100000, "cpu_quota": 200000})
    holder = kubelet.run_pod("holder", labels={"koordinator.sh/qosClass": "BE"}, qos="besteffort")
    kubelet.run_container(holder, "hold", containerd.image, command=hold_command(200),
                          resources={"cpu_shares": 2})
    return {"burner": kubelet.sandbox_configs[burner].metadata.uid,
            "holder": kubelet.sandbox_configs[holder].metadata.uid}


def test_node_metric_and_prometheus_report_real_usage_and_survive_kill_9(
        containerd: Containerd, kube_dir: str, pods: dict[str, str], tmp_path: Path):
    node_metric = tmp_path / "nodemetric.yaml"
    node_metric.write_text(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeMetric\nmetadata: {name: e2e-node}\n"
        f"spec:\n  metricCollectPolicy:\n    reportIntervalSeconds: {REPORT_SECONDS}\n"
        f"    aggregateDurationSeconds: {AGGREGATE_SECONDS}\n"
        f"    nodeAggregatePolicy: {{durations: [{WINDOW}]}}\n")
    port = free_port()
    workdir = tmp_path / "koordlet"
    koordlet = KoordletProcess(workdir, [
        "--containerd-endpoint", containerd.endpoint, "--node-metric-file", str(node_metric),
        "--cgroup-kube-dir", kube_dir,
        "--addr", f"127.0.0.1:{port}", "--kubelet-sync-interval", "500ms",
        "--collect-res-used-interval", "1s", "--runtime-hooks-reconcile-interval", "0"]).start()
    try:
        seen: list[dict] = []

        def settled():
            status = yaml.safe_load(node_metric.read_text())["status"]
            seen[:] = [status]
            window = status["nodeMetric"]["aggregatedNodeUsages"][0]["usage"]["p90"]
            return window and accurate(status)  # the window needs 8 s of samples
        try:
            status = wait_for(settled, "podsMetric: burner ≈ 1000m and holder ≈ 200Mi, a full window")
        except AssertionError:
            print(f"last NodeMetric status: {seen}")
            raise
        burner_cpu, _ = pod_usage(status, "burner")
        _, holder_mem = pod_usage(status, "holder")
        by_name = {m["name"]: m for m in status["podsMetric"]}
        assert (by_name["burner"]["qos"], by_name["burner"]["priority"]) == ("LS", "koord-prod")
        assert (by_name["holder"]["qos"], by_name["holder"]["priority"]) == ("BE", "koord-batch")
        node = status["nodeMetric"]["nodeUsage"]["resources"]
        assert float(parse_quantity(node["cpu"])) >= 0.8, node  # covers the burner
        assert float(parse_quantity(node["memory"])) >= holder_mem, node
        print(f"measured: burner {burner_cpu:.3f} cores, holder {holder_mem / MiB:.1f} MiB, "
              f"node {node}")

        def prometheus_matches():
            """Prometheus and the file from one report: both show the same numbers."""
            before = yaml.safe_load(node_metric.read_text())["status"]
            m = scrape(port)
            after = yaml.safe_load(node_metric.read_text())["status"]
            if before["updateTime"] != after["updateTime"] or not accurate(after):
                return None

            def gauge(name, resource):
                for (metric, labels), value in m.items():
                    d = dict(labels)
                    if metric == "koordlet_pod_resource_usage" and d["pod_name"] == name \
                            and d["resource"] == resource:
                        return value
                return None
            cpu, mem = gauge("burner", "cpu"), gauge("holder", "memory")
            file_cpu, file_mem = pod_usage(after, "burner")[0], pod_usage(after, "holder")[1]
            return (cpu is not None and abs(cpu - file_cpu) < 0.001 and mem is not None
                    and abs(mem - file_mem) < 1 and (cpu, mem))
        print("prometheus:", wait_for(prometheus_matches, "Prometheus pod usage = podsMetric"))
        pages = {path: {name for name, _ in scrape(port, path)}
                 for path in ("/metrics", "/internal-metrics", "/external-metrics")}
        assert pages["/metrics"] == pages["/internal-metrics"] | pages["/external-metrics"]
        assert "koordlet_container_resource_requests" in pages["/external-metrics"] - pages["/internal-metrics"]
        assert "koordlet_pod_resource_usage" in pages["/internal-metrics"] - pages["/external-metrics"]
        assert not {n for n in pages["/metrics"] if n.endswith(("_created", "_total"))}, pages["/metrics"]

        killed_at = time.time()
        koordlet.kill()
        koordlet.start()
        restarted_at = time.time()

        def window_from_history():
            doc = yaml.safe_load(node_metric.read_text())
            if doc["status"]["updateTime"] < time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(restarted_at)):
                return None  # the report from before the kill
            return doc["status"]["nodeMetric"]["aggregatedNodeUsages"][0]["usage"]["p90"]
        # A 16 s window is reported only when its samples span 8 s; one report interval
        # (2 s) after the restart only samples from before the kill can make it non-empty.
        p90 = wait_for(window_from_history, "first report after the restart",
                       timeout=REPORT_SECONDS * 3 + 5)
        assert p90.get("resources"), "the window after restart must include pre-kill samples"
        assert time.time() - restarted_at < REPORT_SECONDS * 3 + 5
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs()}")
    cache = MetricCache(workdir / "tsdb")
    try:
        before = cache.query(POD_CPU_USAGE, killed_at - 60, killed_at, {POD_UID: pods["burner"]})
        assert len(before) >= 5, "burner samples from before the kill are kept"
        p50 = cache.aggregate(POD_CPU_USAGE, killed_at - 60, killed_at, Aggregation.P50,
                              {POD_UID: pods["burner"]})
        assert p50 is not None and p50 > 0.5, "the kept samples are the burner's"
    finally:
        cache.close()


def module_up(port: int) -> dict[str, float]:
    return {dict(labels)["module"]: value for (name, labels), value in scrape(port).items()
            if name == "koordlet_module_up"}


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status == 200
    except OSError:  # HTTPError (503) included
        return False


def overwrite_middle(db: Path, size: int = 4096) -> int:
    """Overwrites ``size`` bytes in the middle of the file (page-aligned); returns where."""
    data = bytearray(db.read_bytes())
    at = len(data) // 2 // 4096 * 4096
    data[at:at + size] = bytes(range(256)) * (size // 256)
    db.write_bytes(bytes(data))
    return at


def test_corrupted_metric_cache_is_moved_aside_and_every_module_runs_again(
        containerd: Containerd, kube_dir: str, pods: dict[str, str], tmp_path: Path):
    import sqlite3

    node_metric = tmp_path / "nodemetric.yaml"
    node_metric.write_text(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeMetric\nmetadata: {name: e2e-node}\n"
        f"spec:\n  metricCollectPolicy:\n    reportIntervalSeconds: {REPORT_SECONDS}\n"
        f"    aggregateDurationSeconds: {AGGREGATE_SECONDS}\n")
    port = free_port()
    workdir = tmp_path / "koordlet"
    koordlet = KoordletProcess(workdir, [
        "--containerd-endpoint", containerd.endpoint, "--node-metric-file", str(node_metric),
        "--cgroup-kube-dir", kube_dir, "--addr", f"127.0.0.1:{port}",
        "--kubelet-sync-interval", "500ms", "--collect-res-used-interval", "1s",
        "--runtime-hooks-reconcile-interval", "0"]).start()
    try:
        wait_for(lambda: accurate(yaml.safe_load(node_metric.read_text())["status"]),
                 "a first accurate report")
        time.sleep(5)  # a few more ticks: the file has pages to damage
        assert koordlet.stop() == 0
        db = workdir / "tsdb" / "metrics.db"
        size = db.stat().st_size
        at = overwrite_middle(db)
        with sqlite3.connect(db) as check:  # the damage is real: SQLite itself sees it
            try:
                verdict = check.execute("PRAGMA quick_check").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                verdict = str(exc)
        check.close()
        assert verdict != "ok", f"4 KiB at {at} of {size} bytes went unnoticed"
        print(f"overwrote 4 KiB at {at} of {size} bytes; quick_check: {verdict[:120]}")

        restarted_at = time.time()
        koordlet.start()
        aside = wait_for(lambda: list(db.parent.glob("metrics.db.corrupt-*")), "the file moved aside")
        log_text = koordlet.log_path.read_text()
        assert f"metric cache {db} is damaged" in log_text and str(aside[0]) in log_text
        want = {"resource-executor", "metric-cache", "states-informer", "nodemetric-reporter",
                "metrics-advisor", "qos-manager", "runtime-hooks"}
        wait_for(lambda: set(module_up(port)) >= want and set(module_up(port).values()) == {1.0},
                 "every module up")
        wait_for(lambda: ready(port), "/readyz 200")

        def fresh():
            status = yaml.safe_load(node_metric.read_text())["status"]
            after = status["updateTime"] >= time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                          time.gmtime(restarted_at))
            return after and accurate(status)
        status = wait_for(fresh, "a NodeMetric report after the restart, from new samples")
        print("after restart:", pod_usage(status, "burner"), pod_usage(status, "holder"))
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs()}")


COLD_START_SECONDS = round(scaled(45))
"""Long enough for koordlet to start and train once on a loaded machine (load 50 on 2 cores
delayed its start by 37 s once), stretched in the emulated v2 lane."""


def prod_metrics(status: dict) -> tuple[dict[str, float], dict[str, float]] | None:
    """(prodReclaimable, prodPeak) as {"cpu": cores, "memory": bytes}; None while unpredicted."""
    try:
        reclaimable = status["prodReclaimableMetric"]["resource"]["resources"]
        peak = status["prodPeakMetric"]["resource"]["resources"]
    except KeyError:
        return None
    return ({k: float(parse_quantity(v)) for k, v in reclaimable.items()},
            {k: float(parse_quantity(v)) for k, v in peak.items()})


def test_prod_reclaimable_and_peak_follow_the_cold_start_and_survive_kill_9(
        containerd: Containerd, kube_dir: str, kubelet: KubeletClient, tmp_path: Path):
    """A Prod pod requesting 4 cores and burning 1, a node of 8: during the cold start its
    request is its peak (nothing reclaimable); once past it the trained prediction gives
    ~1.1 x its usage as peak and the rest of its request back; a kill -9 restores the models
    from their checkpoints, so the first report after the restart says the same."""
    kubelet.kube_dir = kube_dir
    prod = kubelet.run_pod("prod", labels={"koordinator.sh/qosClass": "LS"}, qos="burstable")
    kubelet.run_container(prod, "burn", containerd.image, command=burn_command(1),
                          resources={"cpu_shares": 4096, "cpu_period": 100000, "cpu_quota": 200000})
    created = time.time()
    node_file = tmp_path / "node.yaml"
    node_file.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: e2e-node}\n"
                         "status: {allocatable: {cpu: '8', memory: 16Gi}, capacity: {cpu: '8', memory: 16Gi}}\n")
    node_metric = tmp_path / "nodemetric.yaml"
    node_metric.write_text(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeMetric\nmetadata: {name: e2e-node}\n"
        f"spec:\n  metricCollectPolicy:\n    reportIntervalSeconds: {REPORT_SECONDS}\n"
        f"    aggregateDurationSeconds: {AGGREGATE_SECONDS}\n")
    workdir = tmp_path / "koordlet"
    koordlet = KoordletProcess(workdir, [
        "--containerd-endpoint", containerd.endpoint, "--node-metric-file", str(node_metric),
        "--node-file", str(node_file), "--cgroup-kube-dir", kube_dir,
        "--kubelet-sync-interval", "500ms", "--collect-res-used-interval", "1s",
        "--runtime-hooks-reconcile-interval", "0",
        "--prediction-training-interval", "2s", "--prediction-model-checkpoint-interval", "1s",
        "--prediction-cold-start-duration", f"{COLD_START_SECONDS}s"]).start()

    def report(after: float):
        status = yaml.safe_load(node_metric.read_text()).get("status") or {}
        if status.get("updateTime", "") < time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(after)):
            return None
        found = prod_metrics(status)
        return found and (status["updateTime"], *found)

    try:
        # 1. cold start: the request (4 cores) is the peak, nothing is reclaimable
        stamp, reclaimable, peak = wait_for(lambda: report(created), "a first prediction")
        assert stamp < time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created + COLD_START_SECONDS - 2)), \
            f"the first prediction came after the cold start ({stamp}); the machine is too slow for this test"
        print(f"cold start: reclaimable {reclaimable}, peak {peak}")
        assert reclaimable == {"cpu": 0.0, "memory": 0.0}
        assert peak["cpu"] >= 4.0 and peak["memory"] > 0

        # 2. trained: the peak is 1.1 x the pod's p95 (about 1 core) or the priority
        # predictor's U = 1.1 x (system + Prod + unclassed), whichever is larger; whichever
        # predictor wins, with the allocatable (8) not binding, reclaimable = 4 cores - peak.
        def trained():
            found = report(created + COLD_START_SECONDS + 2)
            return found and found[1]["cpu"] > 0 and found
        try:
            stamp, reclaimable, peak = wait_for(trained, "a trained prediction", timeout=COLD_START_SECONDS + 60)
        except AssertionError:
            print("last NodeMetric:", node_metric.read_text())
            raise
        print(f"trained at {stamp}: reclaimable {reclaimable}, peak {peak}")
        assert reclaimable["cpu"] + peak["cpu"] == pytest.approx(4.0, abs=0.0015), (reclaimable, peak)
        assert peak["cpu"] >= 0.95, "at least 1.1 x the p95 of a pod burning one core"
        assert reclaimable["memory"] == 0.0  # CRI reports no memory requests
        assert peak["memory"] > 0
        checkpoints = {p.name for p in (workdir / "prediction").iterdir()}
        assert {"__node__", "__node-sys__", "__node-koord-prod__", "__node-__"} <= checkpoints
        assert kubelet.sandbox_configs[prod].metadata.uid in checkpoints

        # 3. kill -9 and restart: the models come back, no new cold start
        koordlet.kill()
        restarted = time.time()
        koordlet.start()
        # whole-second stamps: one from the second after the restart is the new process's
        stamp2, reclaimable2, peak2 = wait_for(lambda: report(restarted + 1), "the first report after the restart",
                                               timeout=REPORT_SECONDS * 3 + 10)
        print(f"after kill -9, at {stamp2}: reclaimable {reclaimable2}, peak {peak2}")
        assert abs(reclaimable2["cpu"] - reclaimable["cpu"]) <= 0.3, (reclaimable, reclaimable2)
        assert abs(peak2["cpu"] - peak["cpu"]) <= 0.3, (peak, peak2)
        assert "prediction: " in koordlet.log_path.read_text() and "models restored" in koordlet.logs()
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs(60)}")
