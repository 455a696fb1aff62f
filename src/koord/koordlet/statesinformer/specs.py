"""NodeSLO and NodeMetric specs merged over upstream's defaults.

Upstream unmarshals the JSON of each received spec section over a copy of the default
section, so fields the manager leaves out keep their defaults; ``merge_over`` does the
same: mappings merge key by key, anything else (lists, scalars, null) replaces.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from koord.hookapi import parse_duration

from ..slo import ThresholdConfig

_THRESHOLD = ThresholdConfig()
_BE_THRESHOLD = {
    "enable": _THRESHOLD.enable,
    "cpuSuppressThresholdPercent": _THRESHOLD.cpu_suppress_threshold_percent,
    "cpuSuppressPolicy": _THRESHOLD.cpu_suppress_policy,
    "memoryEvictThresholdPercent": _THRESHOLD.memory_evict_threshold_percent,
    "cpuEvictPolicy": _THRESHOLD.cpu_evict_policy,
}
"""Upstream's default ``resourceUsedThresholdWithBE``: its values are ``ThresholdConfig``'s."""


def _class_qos(group_identity: int, core_expeller: bool, cat_end: int) -> dict[str, Any]:
    """A QoS class's CPU QoS (upstream's DefaultCPUQOS) and resctrl QoS defaults."""
    return {"cpuQOS": {"enable": False, "groupIdentity": group_identity, "schedIdle": 0,
                       "coreExpeller": core_expeller},
            "resctrlQOS": {"enable": False, "catRangeStartPercent": 0,
                           "catRangeEndPercent": cat_end, "mbaPercent": 100}}


DEFAULT_NODE_SLO_SPEC: dict[str, Any] = {
    "resourceUsedThresholdWithBE": _BE_THRESHOLD,
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "groupIdentity"},
        "lsrClass": _class_qos(2, True, 100), "lsClass": _class_qos(2, True, 100),
        "beClass": _class_qos(-1, False, 30), "systemClass": _class_qos(0, False, 100),
    },
}

MEMORY_POLICIES = ("usageWithoutPageCache", "usageWithPageCache", "usageWithHotPageCache")
DEFAULT_DURATIONS = (300.0, 600.0, 1800.0)
DEFAULT_NODE_METRIC_SPEC: dict[str, Any] = {
    "metricCollectPolicy": {
        "aggregateDurationSeconds": 300,
        "reportIntervalSeconds": 60,
        "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s", "30m0s"]},
        "nodeMemoryCollectPolicy": "usageWithoutPageCache",
    },
}


def merge_over(default: Any, received: Any) -> Any:
    """``received`` unmarshalled over a copy of ``default`` (Go json.Unmarshal semantics)."""
    if isinstance(default, dict) and isinstance(received, dict):
        merged = copy.deepcopy(default)
        for key, value in received.items():
            merged[key] = merge_over(default.get(key), value) if key in default else copy.deepcopy(value)
        return merged
    return copy.deepcopy(received)


def merged_node_slo(node_slo: dict) -> dict:
    """The NodeSLO object with its spec merged per section over the defaults."""
    merged = copy.deepcopy(node_slo)
    spec = node_slo.get("spec")
    merged["spec"] = merge_over(DEFAULT_NODE_SLO_SPEC, spec if isinstance(spec, dict) else {})
    return merged


def format_go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()`` for whole or sub-second durations: 300 -> "5m0s"."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms" if ms >= 1 else f"{seconds * 1e6:g}µs"
    whole = int(seconds)
    frac = seconds - whole
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    sec = f"{s + frac:g}s"
    if h:
        return f"{h}h{m}m{sec}"
    if m:
        return f"{m}m{sec}"
    return sec


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0 or value != int(value):
        raise ValueError(f"{where}: want a positive whole number of seconds, got {value!r}")
    return int(value)


def node_metric_collect_policy(node_metric: dict | None) -> dict[str, Any]:
    """``spec.metricCollectPolicy`` merged over the defaults and checked.

    Returns ``aggregateDurationSeconds`` and ``reportIntervalSeconds`` as ints,
    ``durations`` as seconds, ``nodeMemoryCollectPolicy``; ValueError names the bad field.
    Intervals below upstream's minimums (60 s, 30 s) are accepted so tests can be short.
    """
    spec = (node_metric or {}).get("spec")
    merged = merge_over(DEFAULT_NODE_METRIC_SPEC, spec if isinstance(spec, dict) else {})
    policy = merged.get("metricCollectPolicy")
    if not isinstance(policy, dict):
        raise ValueError(f"spec.metricCollectPolicy: want an object, got {policy!r}")
    where = "spec.metricCollectPolicy."
    defaults = DEFAULT_NODE_METRIC_SPEC["metricCollectPolicy"]
    aggregate = policy.get("aggregateDurationSeconds")
    report = policy.get("reportIntervalSeconds")
    out: dict[str, Any] = {
        "aggregateDurationSeconds": _positive_int(
            defaults["aggregateDurationSeconds"] if aggregate is None else aggregate,
            where + "aggregateDurationSeconds"),
        "reportIntervalSeconds": _positive_int(
            defaults["reportIntervalSeconds"] if report is None else report,
            where + "reportIntervalSeconds"),
    }
    agg_policy = policy.get("nodeAggregatePolicy")
    agg_policy = {} if agg_policy is None else agg_policy
    if not isinstance(agg_policy, dict):
        raise ValueError(f"{where}nodeAggregatePolicy: want an object, got {agg_policy!r}")
    raw = agg_policy.get("durations")
    if raw is None:
        raw = defaults["nodeAggregatePolicy"]["durations"]
    if not isinstance(raw, list) or len(raw) > 16:
        raise ValueError(f"{where}nodeAggregatePolicy.durations: want a list of at most 16 "
                         f"durations, got {raw!r:.80}")
    durations = []
    for i, text in enumerate(raw):
        try:
            seconds = parse_duration(text) if isinstance(text, str) else float("nan")
        except ValueError:
            seconds = float("nan")
        if not seconds > 0 or not math.isfinite(seconds):
            raise ValueError(f"{where}nodeAggregatePolicy.durations[{i}]: want a Go duration "
                             f"like 5m0s, got {text!r:.40}")
        durations.append(seconds)
    out["durations"] = durations
    memory = policy.get("nodeMemoryCollectPolicy")
    memory = defaults["nodeMemoryCollectPolicy"] if memory is None else memory
    if memory not in MEMORY_POLICIES:
        raise ValueError(f"{where}nodeMemoryCollectPolicy: want one of {', '.join(MEMORY_POLICIES)}, "
                         f"got {memory!r:.40}")
    out["nodeMemoryCollectPolicy"] = memory
    return out
