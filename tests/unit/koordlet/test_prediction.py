"""The peak predictor: histograms, the predict server (training, gc, checkpoints, restore) and
the Prod reclaimable predictors, with upstream's table cases and numbers."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet import flags
from koord.koordlet.metriccache import (
    NODE_CPU_USAGE,
    NODE_MEMORY_USAGE,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    POD_UID,
    MetricCache,
    Sample,
)
from koord.koordlet.metrics import KoordletMetrics
from koord.koordlet.prediction import PredictionConfig
from koord.koordlet.prediction.histogram import (
    DecayingHistogram,
    ExponentialOptions,
    Histogram,
    HistogramError,
)
from koord.koordlet.prediction.predictor import (
    PodReclaimablePredictor,
    PredictionError,
    PriorityReclaimablePredictor,
    ProdReclaimablePredictor,
    node_allocatable,
    report_problems,
)
from koord.koordlet.prediction.server import (
    CPU_OPTIONS,
    MEMORY_OPTIONS,
    NODE_UID,
    PeakPredictServer,
    PredictionUnavailable,
    node_item_uid,
)
from koord.koordlet.rfc3339 import format_time, parse_time
from koord.koordlet.statesinformer.nodemetric import build_status, cpu_quantity
from koord_testing.pods import FakeStatesInformer, container_meta, pod_meta
from koord_testing.scrape import samples, scrape

GiB, MiB = 2**30, 2**20
HOUR = 3600.0
EPS = 1e-4
PROD, BATCH = 9000, 5999  # PriorityProdValueMin, PriorityBatchValueMax


# ---- histogram options and histograms (upstream's util/histogram cases) ---------------------

def test_exponential_options_as_upstream():
    o = ExponentialOptions(500.0, 40.0, 1.5, EPS)
    assert o.num_buckets == 6
    assert [o.bucket_start(b) for b in range(6)] == [0.0, 40.0, 100.0, 190.0, 325.0, 527.5]
    assert [o.find_bucket(v) for v in (-1.0, 39.99, 40.0, 100.0, 900.0)] == [0, 0, 1, 2, 5]
    with pytest.raises(IndexError):
        o.bucket_start(6)


@pytest.mark.parametrize("args", [(0, 1, 1.5, EPS), (1, 0, 1.5, EPS), (1, 1, 1.0, EPS), (1, 1, 1.5, 0)])
def test_exponential_options_refuse_bad_parameters(args):
    with pytest.raises(HistogramError):
        ExponentialOptions(*args)


@pytest.mark.parametrize("options, low, high", [(CPU_OPTIONS, 0.05, 1024), (MEMORY_OPTIONS, 10 << 20, 1 << 31)])
def test_default_histograms_resolve_their_range_within_one_bucket(options, low, high):
    """upstream TestDefaultHistogram: min and max come back within the 5 % bucket growth."""
    h = DecayingHistogram(options, 12 * HOUR)
    h.add_sample(low, 1, time.time())
    h.add_sample(high, 1, time.time())
    assert abs(h.percentile(1.0) - high) / high <= 0.05
    assert abs(h.percentile(0.0) - low) / low <= 0.05


TEST_OPTIONS = ExponentialOptions(100.0, 1.0, 1.5, EPS)
"""Buckets [0,1) [1,2.5) [2.5,4.75) [4.75,8.125) ...: ends 1, 2.5, 4.75, 8.125."""


def test_percentile_is_the_end_of_the_bucket():
    h = Histogram(TEST_OPTIONS)
    assert h.percentile(0.5) == 0.0 and h.is_empty()
    for value, weight in ((0.5, 1), (2.0, 2), (3.0, 3), (5.0, 4)):
        h.add(value, weight)
    # cumulative weight 1, 3, 6, 10 of 10
    assert [h.percentile(p) for p in (0.0, 0.1, 0.2, 0.3, 0.6, 0.61, 1.0)] == [1.0, 1.0, 2.5, 2.5, 4.75, 8.125, 8.125]
    h.add(1e9, 1)  # the last bucket has no end: its start
    assert h.percentile(1.0) == TEST_OPTIONS.bucket_start(TEST_OPTIONS.num_buckets - 1)


def test_empty_decaying_histogram_gives_zero():
    h = DecayingHistogram(TEST_OPTIONS, HOUR)
    assert [h.percentile(p) for p in (-0.5, 0, 0.5, 1, 1.5)] == [0.0] * 5


T0 = 1_700_000_000.0


def test_simple_decay():
    """upstream TestSimpleDecay: a heavy sample is almost forgotten after 20 half-lives."""
    h = DecayingHistogram(TEST_OPTIONS, HOUR)
    h.add_sample(3, 1000, T0)
    h.add_sample(1.5, 1, T0 + 20 * HOUR)
    assert h.percentile(0.999) == 2.5  # the new sample's bucket
    assert h.percentile(1.0) == 4.75  # the old one still there


def test_longterm_decay_renormalises():
    """upstream TestLongtermDecay: more than 2^100 between samples: the old one vanishes."""
    h = DecayingHistogram(TEST_OPTIONS, HOUR)
    h.add_sample(3, 1, T0)
    h.add_sample(1.5, 1, T0 + 101 * HOUR)
    assert h.percentile(1.0) == 2.5


def test_decaying_percentiles():
    """upstream TestDecayingHistogramPercentiles: weights 1..4, one half-life apart."""
    h = DecayingHistogram(TEST_OPTIONS, HOUR)
    for i, value in enumerate((0.5, 2.0, 3.0, 5.0)):
        h.add_sample(value, i + 1, T0 + i * HOUR)
    # weights 1/8, 2/4, 3/2, 4 of 6.125: cumulative 2 %, 10 %, 35 %, 100 %
    assert [h.percentile(p) for p in (0.0, 0.02, 0.03, 0.10, 0.11, 0.34, 0.35, 1.0)] == [
        1.0, 1.0, 2.5, 2.5, 4.75, 4.75, 8.125, 8.125]


def test_checkpoint_round_trip_keeps_percentiles_and_reference():
    h = DecayingHistogram(CPU_OPTIONS, 12 * HOUR)
    for i in range(200):
        h.add_sample(0.1 + (i % 20) / 10, 1, T0 + i * 60)
    saved = json.loads(json.dumps(h.save()))
    assert max(saved["bucketWeights"].values()) == 10000
    assert saved["referenceTimestamp"] == format_time(h.reference)
    restored = DecayingHistogram(CPU_OPTIONS, 12 * HOUR)
    restored.load(saved)
    assert restored.reference == h.reference
    for p in (0.5, 0.9, 0.95, 0.98, 1.0):
        assert restored.percentile(p) == h.percentile(p)
    assert restored.total == pytest.approx(h.total)


def test_load_upstream_checkpoint():
    """upstream TestDecayingHistogramLoadFromCheckpoint."""
    h = DecayingHistogram(TEST_OPTIONS, HOUR)
    h.load({"totalWeight": 6.0, "bucketWeights": {"0": 1}, "referenceTimestamp": "2018-01-02T03:04:05Z"})
    assert not h.is_empty()
    assert h.reference == parse_time("2018-01-02T03:04:05Z", "t")


@pytest.mark.parametrize("checkpoint, words", [
    (None, "want an object"),
    ({"totalWeight": -1}, "non-negative"),
    ({"totalWeight": "x"}, "non-negative"),
    ({"bucketWeights": []}, "want an object"),
    ({"bucketWeights": {"-1": 1}}, "want an index"),
    ({"bucketWeights": {"9999": 1}}, "exceeds"),
    ({"bucketWeights": {"1": -5}}, "unsigned 32-bit"),
    ({"bucketWeights": {"1": 2**32}}, "unsigned 32-bit"),
    ({"bucketWeights": {"1": 1.5}}, "unsigned 32-bit"),
    ({"totalWeight": 1, "bucketWeights": {"1": 1}, "referenceTimestamp": "yesterday"}, "RFC 3339"),
])
def test_bad_checkpoints_are_refused_and_load_nothing(checkpoint, words):
    h = DecayingHistogram(TEST_OPTIONS, HOUR)
    with pytest.raises(HistogramError, match=words):
        h.load(checkpoint)
    assert h.is_empty() and h.total == 0


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.floats(), st.text(max_size=4)),
                       max_size=8), st.one_of(st.floats(), st.integers(), st.text(max_size=4), st.none()))
def test_any_checkpoint_loads_or_is_refused(buckets, total):
    h = DecayingHistogram(CPU_OPTIONS, HOUR)
    try:
        h.load({"bucketWeights": buckets, "totalWeight": total})
    except HistogramError:
        assert h.total == 0
        return
    assert math.isfinite(h.total) and 0 <= h.percentile(0.95) <= 1100


@given(st.text(max_size=50))
def test_rfc3339_parser_never_crashes(text):
    try:
        value = parse_time(text, "t")
    except ValueError:
        return
    assert math.isfinite(value)


@given(st.floats(min_value=0, max_value=4e9))
def test_rfc3339_round_trip(seconds):
    assert parse_time(format_time(seconds), "t") == int(seconds)


@pytest.mark.parametrize("text, want", [
    ("2023-01-01T00:00:00Z", 1672531200.0),
    ("2023-01-01T00:00:00.123456789Z", 1672531200.123456),
    ("2023-01-01T02:00:00+02:00", 1672531200.0),
    ("0001-01-01T00:00:00Z", -62135596800.0),
])
def test_rfc3339_values(text, want):
    assert parse_time(text, "t") == pytest.approx(want)


@pytest.mark.parametrize("text", ["2023-01-01", "2023-01-01T00:00:00", "", "2023-13-01T00:00:00Z", 5, None])
def test_rfc3339_refused(text):
    with pytest.raises(ValueError, match="where"):
        parse_time(text, "where")


# ---- predictors (upstream peak_predictor_test.go) -----------------------------------------

def resources(cpu_milli: int, memory: int) -> dict[str, int]:
    return {"cpu": cpu_milli, "memory": memory}


@dataclass(frozen=True)
class Fixed:
    """A model's answer with the given p95 and p98 (milli-cores, bytes), as upstream's mock."""

    p95: tuple[int, int]
    p98: tuple[int, int]

    def cpu_milli(self, p: float) -> int:
        return self.p95[0] if p <= 0.95 else self.p98[0]

    def memory_bytes(self, p: float) -> int:
        return self.p95[1] if p <= 0.95 else self.p98[1]


prediction = Fixed


ZERO = prediction((0, 0), (0, 0))
TEST_RESULT = prediction((500, 512 * MiB), (800, 768 * MiB))


class FakeServer:
    def __init__(self, results: dict[str, Fixed] | None = None, default: Fixed | None = None):
        self.results, self.default = results or {}, default

    def get_prediction(self, uid: str) -> Fixed:
        found = self.results.get(uid, self.default)
        if found is None:
            raise PredictionUnavailable(f"no model for {uid}")
        return found


NOW = time.time()


def node(cpu_milli: int, memory: int, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": "test-node", "annotations": annotations or {}},
            "status": {"allocatable": {"cpu": f"{cpu_milli}m", "memory": str(memory)}}}


def pod(uid: str, cpu_milli: int, memory: int, *, age: float = 2 * HOUR, priority: int | None = PROD,
        running: bool = True, created: bool = True):
    p = pod_meta("default", uid, uid, f"kubepods/pod{uid}", running=running, containers=[
        container_meta("c", f"c-{uid}", "", requests={"cpu": cpu_milli, "memory": memory})])
    return replace(p, priority=priority, created=NOW - age if created else None)


CONFIG = PredictionConfig(cold_start_duration=HOUR, safety_margin_percent=10)
POD1 = pod("pod-1-uid", 1000, 1 * GiB, age=60)  # cold start
POD2 = pod("pod-2-uid", 2000, 2 * GiB)  # normal
POD3 = pod("pod-3-uid", 2000, 2 * GiB, running=False)  # terminating
POD4 = pod("pod-4-uid", 2000, 2 * GiB, priority=BATCH)  # batch


@pytest.mark.parametrize("case, allocatable, want", [
    ("node allocatable > pods' requests", (3000, 3 * GiB), (2000 - 550, 2 * GiB - int(1.1 * 768 * MiB))),
    ("node allocatable < pods' requests", (1000, 1 * GiB), (1000 - 550, 1 * GiB - int(1.1 * 768 * MiB))),
])
def test_pod_reclaimable_predictor(case, allocatable, want):
    """upstream TestPodReclaimablePredictor."""
    predictor = PodReclaimablePredictor(FakeServer(default=TEST_RESULT), node(*allocatable), CONFIG, NOW)
    for p in (POD1, POD2, POD3, POD4):
        predictor.add_pod(p)
    assert predictor.result() == resources(*want), case


def test_pod_reclaimable_predictor_peak_counts_unpredicted_requests():
    """upstream TestPodReclaimablePredictor_GetPeak: peak = 550m + 1.1 x 768Mi of the normal
    pod + the requests of the cold-start pod and of the pod without a prediction."""
    cold = pod("pod-cold-start-uid", 1000, 1 * GiB, age=60)
    normal = pod("pod-normal-uid", 2000, 2 * GiB)
    failed = pod("pod-predict-failed-uid", 500, 512 * MiB)
    predictor = PodReclaimablePredictor(FakeServer({normal.uid: TEST_RESULT}), None, CONFIG, NOW)
    predictor.add_pod(cold)
    predictor.add_pod(normal)
    with pytest.raises(PredictionError, match="no model"):
        predictor.add_pod(failed)
    assert predictor.peak() == resources(550 + 1000 + 500, int(1.1 * 768 * MiB) + 1 * GiB + 512 * MiB)
    with pytest.raises(PredictionError, match="already added"):
        predictor.add_pod(normal)
    with pytest.raises(PredictionError, match="no Node"):
        predictor.result()


def test_pod_of_unknown_age_counts_as_cold_start():
    predictor = PodReclaimablePredictor(FakeServer(default=TEST_RESULT), node(8000, 8 * GiB), CONFIG, NOW)
    predictor.add_pod(pod("no-created", 2000, 2 * GiB, created=False))
    assert predictor.result() == resources(0, 0)
    assert predictor.peak() == resources(2000, 2 * GiB)


SYS = prediction((300, 512 * MiB), (500, 512 * MiB))


@pytest.mark.parametrize("case, allocatable, want", [
    ("node allocatable > pods' requests", (3000, 3 * GiB), (1000 - (300 + 500), (2048 - (512 + 1024)) * MiB)),
    ("node allocatable < pods' requests", (900, 1 * GiB), (900 - (300 + 500), 0)),
])
def test_priority_reclaimable_predictor(case, allocatable, want):
    """upstream Test_priorityReclaimablePredictor (safety margin 0)."""
    prod = prediction((500, 768 * MiB), (800, 1024 * MiB))
    batch = prediction((1000, 1024 * MiB), (1500, 2048 * MiB))
    server = FakeServer({node_item_uid("koord-prod"): prod, node_item_uid("koord-batch"): batch,
                         node_item_uid("sys"): SYS, node_item_uid(""): ZERO})
    predictor = PriorityReclaimablePredictor(server, node(*allocatable), replace(CONFIG, safety_margin_percent=0))
    predictor.add_pod(pod("pod-1-uid", 1000, 2048 * MiB, age=60))  # no cold start here
    predictor.add_pod(pod("pod-2-uid", 2000, 2 * GiB, priority=BATCH))
    assert predictor.result() == resources(*want), case


PROD_RESULT = prediction((1000, 1 * GiB), (1200, 1 * GiB))
POD_RESULT = prediction((500, 768 * MiB), (1000, 1 * GiB))
SERVER = FakeServer({node_item_uid("koord-prod"): PROD_RESULT, node_item_uid("koord-batch"): ZERO,
                     node_item_uid("sys"): SYS, node_item_uid(""): ZERO,
                     POD1.uid: POD_RESULT, POD2.uid: POD_RESULT, POD3.uid: ZERO})


@pytest.mark.parametrize("case, allocatable, want_pod, want_priority", [
    ("node allocatable == pods' requests", (3000, 3 * GiB),
     (2000 - 550, 2 * GiB - int(1.1 * GiB)), (3000 - 1430, 3 * GiB - int(1.1 * 1536 * MiB))),
    ("node allocatable > pods' requests", (8000, 8 * GiB),
     (2000 - 550, 2 * GiB - int(1.1 * GiB)), (3000 - 1430, 3 * GiB - int(1.1 * 1536 * MiB))),
    ("node allocatable < pods' requests", (1000, 1 * GiB), (1000 - 550, 0), (0, 0)),
])
def test_prod_reclaimable_predictor(case, allocatable, want_pod, want_priority):
    """upstream TestProdReclaimablePredictor_AddPod: the minimum of both results, the maximum
    of both peaks."""
    predictor = ProdReclaimablePredictor(SERVER, node(*allocatable), CONFIG, NOW)
    for p in (POD1, POD2, POD3):
        predictor.add_pod(p)
    by_pod, by_priority = predictor.predictors
    assert by_pod.result() == resources(*want_pod), case
    assert by_priority.result() == resources(*want_priority), case
    assert predictor.result() == {r: min(want_pod[i], want_priority[i]) for i, r in enumerate(("cpu", "memory"))}
    assert predictor.peak() == {r: max(by_pod.peak()[r], by_priority.peak()[r]) for r in ("cpu", "memory")}
    # cold pod1's request + pod2's peak; priority: 1.1 x (sys 300m + prod 1000m)
    assert by_pod.peak() == resources(1000 + 550, 1 * GiB + int(1.1 * GiB))
    assert by_priority.peak() == resources(1430, int(1.1 * 1536 * MiB))


def predicted(metrics: KoordletMetrics, kind: str) -> dict[tuple[str, str, str], float]:
    """The gauge's samples by (predictor, resource, unit)."""
    out = {}
    for labels, value in samples(metrics, "/internal-metrics", f"koordlet_node_predicted_resource_{kind}").items():
        d = dict(labels)
        assert d["node"] == "n1"
        out[(d["predictor"], d["resource"], d["unit"])] = value
    return out


def gauges(by_predictor: dict[str, dict[str, int]]) -> dict[tuple[str, str, str], float]:
    return {k: v for name, r in by_predictor.items()
            for k, v in (((name, "cpu", "core"), r["cpu"] / 1000), ((name, "memory", "byte"), r["memory"]))}


def test_each_predictors_result_and_peak_are_upstreams_gauges_as_a_report_predicts_them():
    metrics = KoordletMetrics("n1")
    predictor = ProdReclaimablePredictor(SERVER, node(3000, 3 * GiB), CONFIG, NOW, observe=metrics.record_prediction)
    for p in (POD1, POD2, POD3):
        predictor.add_pod(p)
    result, peak = predictor.report()
    by_pod, by_priority = predictor.predictors
    assert predicted(metrics, "reclaimable") == gauges({"podReclaimablePredictor": by_pod.result(),
                                                         "priorityReclaimablePredictor": by_priority.result(),
                                                         "minPredictor": result})
    assert predicted(metrics, "peak") == gauges({"podReclaimablePredictor": by_pod.peak(),
                                                  "priorityReclaimablePredictor": by_priority.peak(),
                                                  "minPredictor": peak})
    assert result == {"cpu": 1450, "memory": 2 * GiB - int(1.1 * GiB)}
    assert "koordlet_node_predicted" not in scrape(metrics, "/external-metrics")


def test_a_result_that_cannot_be_predicted_is_not_recorded_its_peak_is():
    metrics = KoordletMetrics("n1")
    predictor = ProdReclaimablePredictor(SERVER, None, CONFIG, NOW, observe=metrics.record_prediction)
    predictor.add_pod(POD2)
    result, peak = predictor.report()
    assert result is None and peak is not None
    assert predicted(metrics, "reclaimable") == {}
    assert predicted(metrics, "peak")[("minPredictor", "cpu", "core")] == peak["cpu"] / 1000


def test_a_missing_model_is_said_once_across_reports_until_it_clears(caplog):
    """A predictor is built per report; the NodeMetric interval is seconds, a model's absence
    lasts as long as its history takes to build."""
    said, models = report_problems(), FakeServer()

    def report() -> tuple:
        return ProdReclaimablePredictor(models, node(3000, 3 * GiB), CONFIG, NOW, said=said).report()

    with caplog.at_level(logging.INFO, logger="koord.koordlet.prediction.predictor"):
        for _ in range(3):
            assert report() == (None, None)
        models.default = TEST_RESULT
        report()
        models.default = None
        report()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[1] for line in lines] == [" no prodReclaimable prediction", " no prodPeak prediction",
                                                       " prodReclaimable predicted again",
                                                       " prodPeak predicted again",
                                                       " no prodReclaimable prediction", " no prodPeak prediction"]


@pytest.mark.parametrize("case, the_node, want", [
    ("status.allocatable", node(3000, 3 * GiB), (3000, 3 * GiB)),
    ("raw allocatable annotation wins", node(3000, 3 * GiB, {
        "node.koordinator.sh/raw-allocatable": '{"cpu": "4", "memory": "8Gi"}'}), (4000, 8 * GiB)),
    ("bad annotation: status.allocatable", node(3000, 3 * GiB, {
        "node.koordinator.sh/raw-allocatable": "{"}), (3000, 3 * GiB)),
    ("fractions round up", {"status": {"allocatable": {"cpu": "1500500u", "memory": "1.5"}}}, (1501, 2)),
])
def test_node_allocatable(case, the_node, want):
    assert node_allocatable(the_node) == resources(*want), case


@pytest.mark.parametrize("the_node, words", [
    (None, "no Node"), ({}, "status.allocatable: missing"),
    ({"status": {"allocatable": {"cpu": "lots"}}}, "status.allocatable.cpu"),
])
def test_node_allocatable_errors(the_node, words):
    with pytest.raises(PredictionError, match=words):
        node_allocatable(the_node)


# ---- the predict server -------------------------------------------------------------------

class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def server_with(tmp_path: Path, pods: list, node_obj: dict | None = None,
                **config) -> tuple[PeakPredictServer, MetricCache, Clock]:
    cache = MetricCache(None)
    clock = Clock(time.time())
    cfg = replace(PredictionConfig(checkpoint_filepath=tmp_path / "ckpt"), **config)
    server = PeakPredictServer(cfg, FakeStatesInformer(pods=pods, node=node_obj or node(8000, 8 * GiB)),
                               cache, clock=clock)
    server.checkpointer.prepare()
    return server, cache, clock


def feed(cache: MetricCache, now: float, node_usage: tuple[float, float], pods: dict[str, tuple[float, float]]) -> None:
    samples = [Sample(NODE_CPU_USAGE, {}, now - 1, node_usage[0]),
               Sample(NODE_MEMORY_USAGE, {}, now - 1, node_usage[1])]
    for uid, (cpu, memory) in pods.items():
        samples += [Sample(POD_CPU_USAGE, {POD_UID: uid}, now - 1, cpu),
                    Sample(POD_MEMORY_USAGE, {POD_UID: uid}, now - 1, memory)]
    cache.append(samples)


def bucket_end(options: ExponentialOptions, value: float) -> float:
    return options.bucket_start(options.find_bucket(value) + 1)


def test_training_models_as_upstream(tmp_path):
    """upstream TestPredictServerMainLoop: 2 pods + node + 5 priority classes + sys = 9 models."""
    pods = [pod("pod1", 0, 0, priority=None), pod("pod2", 0, 0, priority=None)]
    server, cache, clock = server_with(tmp_path, pods)
    feed(cache, clock.now, (0.0, 256 * MiB), {"pod1": (1, 128 * MiB), "pod2": (3, 128 * MiB)})
    server.training()
    assert len(server.models) == 9 and server.has_synced()
    node_model = server.get_prediction(NODE_UID)
    assert node_model.cpu_milli(0.9) == 25  # 0 cores: the first bucket's end
    assert node_model.memory_bytes(0.9) >= 10 * MiB
    # sys = max(node - all pods, 0) = 0; pods without class ("" by QoS burstable -> koord-prod)
    assert server.get_prediction(node_item_uid("sys")).cpu_milli(0.95) == 25
    prod = server.get_prediction(node_item_uid("koord-prod"))
    assert prod.cpu_milli(0.95) == int(bucket_end(CPU_OPTIONS, 4.0) * 1000)  # pod1 + pod2
    for i in range(2, 101):
        clock.now += 60
        feed(cache, clock.now, (5.0, GiB), {"pod1": (i / 100, 128 * MiB), "pod2": (3, 128 * MiB)})
        server.training()
    p90 = server.get_prediction("pod1").cpu_milli(0.9)
    assert p90 == int(bucket_end(CPU_OPTIONS, 0.90) * 1000), p90  # 90 of 100 samples are <= 0.9
    sys = server.get_prediction(node_item_uid("sys")).cpu_milli(0.95)
    assert 1000 <= sys <= 2050, sys  # 5 - (pod1 + pod2) between 1 and 1.99 cores


def test_pod_without_samples_is_not_trained(tmp_path):
    server, cache, clock = server_with(tmp_path, [pod("quiet", 0, 0)])
    feed(cache, clock.now, (1.0, GiB), {})
    server.training()
    with pytest.raises(PredictionUnavailable):
        server.get_prediction("quiet")
    assert len(server.models) == 7  # node + 5 priority classes + sys


def test_gc_drops_old_models_and_their_files(tmp_path):
    """upstream TestPredictServerGCOldModels."""
    server, cache, clock = server_with(tmp_path, [], model_checkpoint_interval=1.0)
    feed(cache, clock.now, (1.0, GiB), {})
    server.training()
    assert len(server.models) == 7
    server.do_checkpoint()
    assert len(list((tmp_path / "ckpt").iterdir())) == 7
    clock.now += server.config.model_expiration + 60
    server.gc_models()
    assert server.models == {} and list((tmp_path / "ckpt").iterdir()) == []


@pytest.mark.parametrize("case, max_per_step, interval, step, want", [
    ("every model at the first step", 12, 600, 0, 7),
    ("at most max per step", 1, 600, 0, 1),
    ("not again within the interval", 12, 600, 599, 0),
    ("again after the interval", 12, 600, 600, 7),
])
def test_checkpoint_steps(tmp_path, case, max_per_step, interval, step, want):
    """upstream TestDoCheckpoint, _MaxPerStep and _CheckpointInterval."""
    server, cache, clock = server_with(tmp_path, [], model_checkpoint_max_per_step=max_per_step,
                                       model_checkpoint_interval=float(interval))
    feed(cache, clock.now, (1.0, GiB), {})
    server.training()
    if step:
        server.do_checkpoint()
        clock.now += step
    server.do_checkpoint()
    assert sum(m.last_checkpointed == clock.now for m in server.models.values()) == want, case


def test_checkpoints_restore_models_and_drop_unknown_and_broken_files(tmp_path, caplog):
    pods = [pod("p1", 2000, 2 * GiB), pod("p2", 1000, GiB)]
    server, cache, clock = server_with(tmp_path, pods, model_checkpoint_interval=1.0)
    for i in range(30):
        clock.now += 60
        feed(cache, clock.now, (3.0, 4 * GiB), {"p1": (1.0 + i / 100, 1.5 * GiB), "p2": (0.2, 300 * MiB)})
        server.training()
    server.do_checkpoint()
    ckpt = tmp_path / "ckpt"
    doc = json.loads((ckpt / "p1").read_text())
    assert set(doc) == {"UID", "CPU", "Memory", "LastUpdated"} and doc["UID"] == "p1"
    assert not list(ckpt.glob("*.tmp"))
    (ckpt / "gone-pod").write_text((ckpt / "p2").read_text())  # a pod deleted while koordlet was down
    (ckpt / "p2").write_text("{not json")
    (ckpt / "p1.tmp").write_text("half written")
    restarted = PeakPredictServer(server.config, FakeStatesInformer(pods=pods, node=node(8000, 8 * GiB)),
                                  cache, clock=clock)
    restarted.restore()
    assert set(restarted.models) == set(server.models) - {"p2"}
    assert not (ckpt / "gone-pod").exists() and not (ckpt / "p2").exists() and not (ckpt / "p1.tmp").exists()
    for uid in restarted.models:
        for p in (0.9, 0.95, 0.98):
            assert restarted.get_prediction(uid).cpu_milli(p) == server.get_prediction(uid).cpu_milli(p)
            assert restarted.get_prediction(uid).memory_bytes(p) == server.get_prediction(uid).memory_bytes(p)
    assert restarted.models["p1"].last_updated == int(clock.now)
    assert "unreadable" in caplog.text


def test_reporter_status_carries_both_metrics_in_upstream_shape(tmp_path):
    """NodeMetric status: prodReclaimableMetric / prodPeakMetric from pods with samples."""
    p1 = pod("p1", 2000, 2 * GiB)
    silent = pod("silent", 4000, 4 * GiB, age=60)  # no samples in the window: does not count
    server, cache, clock = server_with(tmp_path, [p1], cold_start_duration=HOUR)
    for _ in range(5):
        clock.now = time.time()
        feed(cache, clock.now, (1.5, 3 * GiB), {"p1": (1.0, GiB)})
        server.training()
    the_node = node(8000, 8 * GiB)
    status = build_status(cache, [p1, silent], {"aggregateDurationSeconds": 300, "durations": [],
                                                "nodeMemoryCollectPolicy": "usageWithoutPageCache"},
                          now=time.time(), predictor=ProdReclaimablePredictor(server, the_node, server.config))
    pod_peak = server.get_prediction("p1")
    peak_cpu = int(pod_peak.cpu_milli(0.95) * 1.1)
    # an idle class still predicts its first bucket's end (25m), as upstream's histograms do
    sys_prod_none = sum(server.get_prediction(node_item_uid(item)).cpu_milli(0.95)
                        for item in ("sys", "koord-prod", ""))
    u_cpu = int(sys_prod_none * 1.1)
    want_cpu = min(2000 - peak_cpu, max(2000 - u_cpu, 0))
    got = status["prodReclaimableMetric"]["resource"]["resources"]
    assert 0 < want_cpu < 2000 and got["cpu"] == cpu_quantity(want_cpu)
    assert got["memory"] == "0"  # 2Gi request - 1.1 x p98 of 1Gi > 0, but 1.1 x (sys 2Gi + prod 1Gi) > 2Gi
    assert set(status["prodPeakMetric"]["resource"]["resources"]) == {"cpu", "memory"}
    empty = build_status(cache, [p1], {"aggregateDurationSeconds": 300, "durations": [],
                                       "nodeMemoryCollectPolicy": "usageWithoutPageCache"},
                         now=time.time(), predictor=ProdReclaimablePredictor(server, None, server.config))
    assert empty["prodReclaimableMetric"] == {"resource": {}}  # no Node: upstream's empty metric
    assert "prodPeakMetric" in empty


def test_flags_have_upstream_names_and_defaults():
    a = flags.parse_args([])
    assert PredictionConfig.from_args(a) == PredictionConfig()
    assert (a.prediction_cold_start_duration, a.prediction_training_interval,
            a.prediction_cpu_histogram_decay_halflife, a.prediction_memory_histogram_decay_halflife,
            a.prediction_model_expiration_duration, a.prediction_model_checkpoint_interval,
            a.prediction_model_checkpoint_max_per_step, a.prediction_safety_margin_percent,
            str(a.prediction_checkpoint_filepath)) == (
        86400, 60, 43200, 86400, 1800, 600, 12, 10, "/prediction-checkpoints")
    b = flags.parse_args(["--prediction-cold-start-duration", "0", "--prediction-training-interval", "2s"])
    assert b.prediction_cold_start_duration == 0 and b.prediction_training_interval == 2


@pytest.mark.parametrize("argv", [
    ["--prediction-training-interval", "0"], ["--prediction-safety-margin-percent", "-1"],
    ["--prediction-safety-margin-percent", "ten"], ["--prediction-model-checkpoint-max-per-step", "0"],
    ["--prediction-cold-start-duration", "-1h"],
])
def test_bad_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        flags.parse_args(argv)
    assert exit_info.value.code == 2
    assert argv[0] in capsys.readouterr().err
