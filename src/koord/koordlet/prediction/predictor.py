"""The Prod reclaimable predictor: what the Prod tier requests but will not use, and its peak.

Two predictors see the same pods (those with samples in the report window) and the
minimum of their results (the maximum of their peaks) is reported, per resource:

- per pod (koord-prod and unclassed pods): a pod younger than the cold start adds its
  request to ``unpredicted``; a running one adds peak = trunc(p x r) (p95 for cpu, p98 for
  memory, r = (100 + safety margin) / 100) and max(request - peak, 0) to reclaimable;
  result = min(max(allocatable - sum(peak), 0), sum(reclaimable)), peak = sum(peak) +
  unpredicted. A pod without a model yet counts with its request too;
- per priority: U = r x (sys + koord-prod + unclassed predictions), result =
  min(max(allocatable - U, 0), max(sum(request) - U, 0)), peak = U.

Resources are ``{"cpu": milli-cores, "memory": bytes}``. Pods not running (a stopped
sandbox, a finished pod) count neither request nor peak once past their cold start.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from koord.apis.extension import ANNOTATION_RAW_ALLOCATABLE
from koord.hookapi import json_annotation, parse_quantity
from koord.logonce import LogOnce

from ..statesinformer.meta import PodMeta
from ..statesinformer.nodemetric import priority_class_with_default
from .config import PredictionConfig
from .server import SYSTEM_ITEM, PredictionUnavailable, node_item_uid

log = logging.getLogger(__name__)

Resources = dict[str, int]
RESOURCES = ("cpu", "memory")
PROD_RECLAIMABLE_CLASSES = ("koord-prod", "")
CPU_PERCENTILE, MEMORY_PERCENTILE = 0.95, 0.98
RECLAIMABLE, PEAK = "reclaimable", "peak"


class PredictionError(Exception):
    """No result can be given (no Node, no allocatable, a model missing); the message says why."""


class Percentiles(Protocol):
    def cpu_milli(self, p: float) -> int: ...

    def memory_bytes(self, p: float) -> int: ...


class Predictions(Protocol):
    def get_prediction(self, uid: str) -> Percentiles: ...


def zero() -> Resources:
    return {r: 0 for r in RESOURCES}


def pod_request(pod: PodMeta) -> Resources:
    """Sum of the containers' requests (cpu milli, memory bytes)."""
    return {r: sum(max(int(c.requests.get(r, 0)), 0) for c in pod.containers) for r in RESOURCES}


def _object(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def node_allocatable(node: dict | None) -> Resources:
    """The Node's raw allocatable annotation when set (the amplification's original), else
    ``status.allocatable``; PredictionError naming what is missing or malformed."""
    if node is None:
        raise PredictionError("no Node object")
    meta = _object(node.get("metadata"))
    annotations = {k: v for k, v in _object(meta.get("annotations")).items() if isinstance(v, str)}
    try:
        raw = json_annotation(annotations, ANNOTATION_RAW_ALLOCATABLE, owner="node")
    except ValueError as exc:
        log.warning("%s; using status.allocatable", exc)
        raw = None
    where = f"node annotation {ANNOTATION_RAW_ALLOCATABLE}"
    if raw is None:
        raw = _object(node.get("status")).get("allocatable")
        where = "Node status.allocatable"
    if not isinstance(raw, dict):
        raise PredictionError(f"{where}: missing")
    out = zero()
    for name, scale in (("cpu", 1000), ("memory", 1)):
        if raw.get(name) is None:
            continue
        try:
            out[name] = max(math.ceil(parse_quantity(raw[name]) * scale), 0)  # Quantity.MilliValue/Value round up
        except ValueError as exc:
            raise PredictionError(f"{where}.{name}: {exc}") from None
    return out


def _add(a: Resources, b: Resources) -> Resources:
    return {r: a[r] + b[r] for r in RESOURCES}


def _sub_non_negative(a: Resources, b: Resources) -> Resources:
    return {r: max(a[r] - b[r], 0) for r in RESOURCES}


def _min(a: Resources, b: Resources) -> Resources:
    return {r: min(a[r], b[r]) for r in RESOURCES}


def _max(a: Resources, b: Resources) -> Resources:
    return {r: max(a[r], b[r]) for r in RESOURCES}


def _peak_of(prediction: Percentiles, ratio: float) -> Resources:
    """p95 cpu and p98 memory with the safety margin, truncated as upstream multiplies."""
    return {"cpu": int(prediction.cpu_milli(CPU_PERCENTILE) * ratio),
            "memory": int(prediction.memory_bytes(MEMORY_PERCENTILE) * ratio)}


class PodReclaimablePredictor:
    name = "podReclaimablePredictor"

    def __init__(self, server: Predictions, node: dict | None, config: PredictionConfig,
                 now: float) -> None:
        self.server, self.node, self.config, self.now = server, node, config, now
        self.reclaimable, self.unreclaimable, self.unpredicted = zero(), zero(), zero()
        self._pods: set[str] = set()

    def add_pod(self, pod: PodMeta) -> None:
        """PredictionError when the pod has no model (its request then counts into the peak)."""
        if priority_class_with_default(pod) not in PROD_RECLAIMABLE_CLASSES:
            return
        if pod.uid in self._pods:
            raise PredictionError(f"pod {pod.key} already added to the pod reclaimable predictor")
        self._pods.add(pod.uid)
        # A pod of unknown age is treated as young: its request, never a guess, is its peak.
        if pod.created is None or self.now - pod.created <= self.config.cold_start_duration:
            self.unpredicted = _add(self.unpredicted, pod_request(pod))
            return
        if not pod.running:
            return
        try:
            prediction = self.server.get_prediction(pod.uid)
        except PredictionUnavailable as exc:
            self.unpredicted = _add(self.unpredicted, pod_request(pod))
            raise PredictionError(f"pod {pod.key}: {exc}") from None
        peak = _peak_of(prediction, self.config.safety_ratio)
        request = pod_request(pod)
        self.unreclaimable = _add(self.unreclaimable, peak)
        self.reclaimable = _add(self.reclaimable, _sub_non_negative(request, peak))

    def result(self) -> Resources:
        allocatable = node_allocatable(self.node)
        return _min(_sub_non_negative(allocatable, self.unreclaimable), self.reclaimable)

    def peak(self) -> Resources:
        return _add(self.unreclaimable, self.unpredicted)


class PriorityReclaimablePredictor:
    name = "priorityReclaimablePredictor"

    def __init__(self, server: Predictions, node: dict | None, config: PredictionConfig) -> None:
        self.server, self.node, self.config = server, node, config
        self.request = zero()

    def add_pod(self, pod: PodMeta) -> None:
        if priority_class_with_default(pod) not in PROD_RECLAIMABLE_CLASSES or not pod.running:
            return
        self.request = _add(self.request, pod_request(pod))

    def _unreclaimable(self) -> Resources:
        total = {"cpu": 0, "memory": 0}
        for item in (SYSTEM_ITEM, *PROD_RECLAIMABLE_CLASSES):
            try:
                prediction = self.server.get_prediction(node_item_uid(item))
            except PredictionUnavailable as exc:
                raise PredictionError(f"prediction of {item or 'unclassed pods'}: {exc}") from None
            total["cpu"] += prediction.cpu_milli(CPU_PERCENTILE)
            total["memory"] += prediction.memory_bytes(MEMORY_PERCENTILE)
        ratio = self.config.safety_ratio
        return {"cpu": int(total["cpu"] * ratio), "memory": int(total["memory"] * ratio)}

    def result(self) -> Resources:
        allocatable = node_allocatable(self.node)
        unreclaimable = self._unreclaimable()
        return _min(_sub_non_negative(allocatable, unreclaimable),
                    _sub_non_negative(self.request, unreclaimable))

    def peak(self) -> Resources:
        return self._unreclaimable()


Observe = Callable[[str, str, Resources], None]
"""Told each result (``reclaimable``) and ``peak`` as computed: (which, predictor name, resources)."""


def report_problems() -> LogOnce:
    """What reports could not predict: a model stays missing for many report intervals, so
    hold one of these across reports (a predictor is built per report) to say it once."""
    return LogOnce(log)


class ProdReclaimablePredictor:
    """The minimum of both results, the maximum of both peaks (upstream's ``minPredictor``).
    ``observe`` is told each predictor's result and peak, then the minimum and maximum, as
    each is computed, as upstream records its ``koordlet_node_predicted_resource_*`` gauges.
    ``said`` (from :func:`report_problems`) is where :meth:`report` says what it cannot predict."""

    name = "minPredictor"

    def __init__(self, server: Predictions, node: dict | None, config: PredictionConfig,
                 now: float | None = None, observe: Observe | None = None,
                 said: LogOnce | None = None) -> None:
        now = time.time() if now is None else now
        self.said = report_problems() if said is None else said
        self.predictors: tuple[PodReclaimablePredictor, PriorityReclaimablePredictor] = (
            PodReclaimablePredictor(server, node, config, now),
            PriorityReclaimablePredictor(server, node, config))
        self.observe = observe

    def add_pod(self, pod: PodMeta) -> None:
        """As upstream, a pod the first predictor refuses is not shown to the second."""
        for predictor in self.predictors:
            predictor.add_pod(pod)

    def _observed(self, kind: str, name: str, resources: Resources) -> Resources:
        if self.observe is not None:
            self.observe(kind, name, resources)
        return resources

    def result(self) -> Resources:
        pod, priority = (self._observed(RECLAIMABLE, p.name, p.result()) for p in self.predictors)
        return self._observed(RECLAIMABLE, self.name, _min(pod, priority))

    def peak(self) -> Resources:
        pod, priority = (self._observed(PEAK, p.name, p.peak()) for p in self.predictors)
        return self._observed(PEAK, self.name, _max(pod, priority))

    def report(self) -> tuple[Resources | None, Resources | None]:
        """(result, peak) for the NodeMetric; None for what cannot be predicted (said once
        per problem, until it changes or clears)."""
        out: list[Resources | None] = []
        for what, fn in (("prodReclaimable", self.result), ("prodPeak", self.peak)):
            try:
                out.append(fn())
            except PredictionError as exc:
                self.said.say(what, f"NodeMetric: no {what} prediction: {exc}")
                out.append(None)
                continue
            if self.said.clear(what):
                log.info("NodeMetric: %s predicted again", what)
        return out[0], out[1]

