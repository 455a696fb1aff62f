"""Eviction arithmetic: how much to release, and which pods to evict in which order.

Pure functions over plain numbers and PodMeta, tested as tables. Amounts are milli-cores
for CPU and bytes for memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cmp_to_key

from koord.apis.extension import (
    ANNOTATION_EVICTION_POLICY,
    ANNOTATION_EVICTION_PRIORITY,
    BATCH_CPU,
    BATCH_MEMORY,
    LABEL_POD_EVICTION_ENABLED,
    LABEL_POD_PRIORITY,
    LABEL_POD_PRIORITY_CLASS,
    MID_CPU,
    MID_MEMORY,
)

from ..resources import KoordQoS
from ..statesinformer import PodMeta


@dataclass(frozen=True)
class BEUsage:
    """node_be samples (milli-cores): BE usage, batch-cpu requests, BE real limit."""

    used: float
    request: float
    limit: float


def be_usage_high(used: float, limit: float, threshold_percent: int) -> bool:
    """BE pods use (nearly) all they are allowed: a tiny limit counts as saturated."""
    if limit <= 0:
        return False
    if limit < 1000:
        return True
    return used / limit >= threshold_percent / 100


def release_by_be_satisfaction(usage: BEUsage, lower_percent: int, upper_percent: int,
                               usage_threshold_percent: int) -> int:
    """Milli-cores to release when BE pods get too little of what they requested.

    satisfaction = limit / request; at or below ``lower``%, release enough requests to
    bring it back to ``upper``% (release = request x (upper% - satisfaction)).
    """
    if usage.request <= 0 or not be_usage_high(usage.used, usage.limit, usage_threshold_percent):
        return 0
    satisfaction = usage.limit / usage.request
    if satisfaction > lower_percent / 100:
        return 0
    return int(usage.request * (upper_percent / 100 - satisfaction))


def release_by_used_threshold(used_cores: float, capacity_milli: int, threshold_percent: int,
                              lower_percent: int) -> int:
    """Milli-cores to release when the node's CPU use reaches ``threshold``%: down to ``lower``%."""
    if capacity_milli <= 0:
        return 0
    percent = int(used_cores * 1000) * 100 // capacity_milli
    if percent < threshold_percent:
        return 0
    return capacity_milli * (percent - lower_percent) // 100


def release_memory(used_bytes: float, capacity_bytes: int, threshold_percent: int,
                   lower_percent: int) -> int:
    """Bytes to release when node memory use reaches ``threshold``%: down to ``lower``%."""
    if capacity_bytes <= 0:
        return 0
    percent = int(used_bytes) * 100 // capacity_bytes
    if percent < threshold_percent:
        return 0
    return capacity_bytes * (percent - lower_percent) // 100


def eviction_allowed(pod: PodMeta, feature: str) -> bool:
    """``koordinator.sh/eviction-policy`` lists the features allowed to evict the pod
    (absent: all). A malformed value allows none: evicting on a typo would be worse."""
    text = pod.annotations.get(ANNOTATION_EVICTION_POLICY)
    if not text:
        return True
    try:
        allowed = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(allowed, list) and feature in allowed


def _int_or(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _by_priority_then(value: Callable[[PodMeta], float]) -> Callable[[PodMeta, PodMeta], int]:
    """Lower spec priority first when both pods have one and they differ, else larger value first."""
    def cmp(a: PodMeta, b: PodMeta) -> int:
        if a.priority is not None and b.priority is not None and a.priority != b.priority:
            return -1 if a.priority < b.priority else 1
        va, vb = value(a), value(b)
        return -1 if va > vb else (1 if va < vb else 0)
    return cmp


def be_memory_victims(pods: Sequence[PodMeta], used: Mapping[str, float], feature: str) -> list[PodMeta]:
    """BE pods in eviction order: lower spec priority first (when both pods have one), then
    larger memory use; pods without a sample last, by name descending."""
    candidates = [p for p in pods if p.koord_qos is KoordQoS.BE and p.running and eviction_allowed(p, feature)]
    with_sample = sorted((p for p in candidates if p.uid in used),
                         key=cmp_to_key(_by_priority_then(lambda p: used[p.uid])))
    without = sorted((p for p in candidates if p.uid not in used), key=lambda p: p.name, reverse=True)
    return with_sample + without


def be_cpu_victims(pods: Sequence[PodMeta], used: Mapping[str, float], feature: str) -> list[PodMeta]:
    """BE pods for BECPUEvict: lower spec priority first when both have one, then higher
    usage per batch-cpu request."""
    def ratio(p: PodMeta) -> float:
        request = sum(c.requests.get(BATCH_CPU, 0) for c in p.containers)
        return used.get(p.uid, 0.0) * 1000 / request if request > 0 else used.get(p.uid, 0.0)

    candidates = [p for p in pods if p.koord_qos is KoordQoS.BE and p.running and eviction_allowed(p, feature)]
    return sorted(candidates, key=cmp_to_key(_by_priority_then(ratio)))


def labelled_victims(pods: Sequence[PodMeta], used: Mapping[str, float], feature: str,
                     priority_threshold: int | None) -> list[PodMeta]:
    """CPUEvict / MemoryEvict: running pods with priority <= the NodeSLO threshold, label
    ``koordinator.sh/eviction-enabled=true``, allowed by their policy and with a sample;
    ordered by eviction-priority annotation, spec priority, priority label (ascending),
    then usage descending."""
    candidates = [
        p for p in pods
        if p.running and p.uid in used and eviction_allowed(p, feature)
        and p.labels.get(LABEL_POD_EVICTION_ENABLED) == "true"
        and (priority_threshold is None or (p.priority or 0) <= priority_threshold)
    ]
    candidates.sort(key=lambda p: (
        _int_or(p.annotations.get(ANNOTATION_EVICTION_PRIORITY), 0), p.priority or 0,
        _int_or(p.labels.get(LABEL_POD_PRIORITY), 0), -used[p.uid]))
    return candidates


def pick_until_released(victims: Sequence[PodMeta], release: float,
                        amount: Callable[[PodMeta], float]) -> list[PodMeta]:
    """Victims in order until their amounts cover ``release``."""
    picked: list[PodMeta] = []
    released = 0.0
    for pod in victims:
        if released >= release:
            break
        picked.append(pod)
        released += amount(pod)
    return picked


# ---- allocatable evictions (CPUAllocatableEvict, MemoryAllocatableEvict) -------------------

PROD, MID, BATCH, FREE, NONE = "koord-prod", "koord-mid", "koord-batch", "koord-free", ""
_PRIORITY_RANGES = {PROD: (9000, 9999), MID: (7000, 7999), BATCH: (5000, 5999), FREE: (3000, 3999)}
_PRIORITY_DEFAULTS = {PROD: 9500, MID: 7500, BATCH: 5500, FREE: 3500, NONE: 0}
PRIORITY_MID_MAX = 7999
"""An allocatable eviction never reaches koord-prod pods: its priority threshold stays below."""
_CLASS_RESOURCES = {MID: (MID_CPU, MID_MEMORY),
                    BATCH: (BATCH_CPU, BATCH_MEMORY)}


def priority_class(pod: PodMeta) -> str:
    """Koordinator's priority class: the label, else by spec priority, else by QoS class
    (LS-like classes prod, BE batch)."""
    label = pod.labels.get(LABEL_POD_PRIORITY_CLASS)
    if label is not None:
        return label if label in _PRIORITY_RANGES else NONE
    if pod.priority is not None:
        for cls, (lo, hi) in _PRIORITY_RANGES.items():
            if lo <= pod.priority <= hi:
                return cls
        return NONE
    if pod.koord_qos in (KoordQoS.SYSTEM, KoordQoS.LSE, KoordQoS.LSR, KoordQoS.LS):
        return PROD
    if pod.koord_qos is KoordQoS.BE:
        return BATCH
    return NONE


def priority_value(pod: PodMeta) -> int:
    """spec.priority when non-zero, else the default of the pod's priority class."""
    if pod.priority:
        return pod.priority
    return _PRIORITY_DEFAULTS[priority_class(pod)]


def class_request(pod: PodMeta, resource: str) -> tuple[str, int]:
    """(resource name, amount) the pod requests of ``resource`` ("cpu" or "memory") in its
    priority class's currency: mid-* or batch-* for those classes, else cpu / memory.
    CPU amounts are milli-cores, memory bytes; unset or negative requests count zero."""
    names = _CLASS_RESOURCES.get(priority_class(pod))
    name = (names[0] if resource == "cpu" else names[1]) if names else resource
    return name, sum(max(c.requests.get(name, 0), 0) for c in pod.containers)


def allocatable_release(pods: Sequence[PodMeta], allocatable: Mapping[str, int | None], resource: str,
                        threshold_percent: int, lower_percent: int, priority_threshold: int) -> dict[str, int]:
    """Per resource name, what to release: the requests of pods at or under the priority
    threshold, summed by currency; where they exceed ``threshold``% of the node's
    allocatable, the excess over ``lower``% of it (all of it when the node has none)."""
    requested: dict[str, int] = {}
    for p in pods:
        if not p.running or priority_value(p) > priority_threshold:
            continue
        name, amount = class_request(p, resource)
        requested[name] = requested.get(name, 0) + amount
    release: dict[str, int] = {}
    for name, amount in requested.items():
        total = allocatable.get(name)
        if not total:
            if amount > 0:
                release[name] = amount
            continue
        if amount / total > threshold_percent / 100:
            release[name] = int(amount - lower_percent / 100 * total)
    return release


def allocatable_victims(pods: Sequence[PodMeta], used: Mapping[str, float], feature: str,
                        priority_threshold: int, resource: str) -> list[PodMeta]:
    """Running pods at or under the priority threshold, labelled
    ``koordinator.sh/eviction-enabled=true``, allowed by their policy, with a usage sample;
    by eviction-priority annotation, priority, priority label (ascending), then larger
    request first."""
    candidates = [
        p for p in pods
        if p.running and p.uid in used and eviction_allowed(p, feature)
        and p.labels.get(LABEL_POD_EVICTION_ENABLED) == "true" and priority_value(p) <= priority_threshold
    ]
    candidates.sort(key=lambda p: (
        _int_or(p.annotations.get(ANNOTATION_EVICTION_PRIORITY), 0), priority_value(p),
        _int_or(p.labels.get(LABEL_POD_PRIORITY), priority_value(p)), -class_request(p, resource)[1]))
    return candidates
