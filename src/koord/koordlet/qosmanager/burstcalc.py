"""CPUBurst's pure parts: the NodeSLO ``cpuBurstStrategy`` and the pod annotation merged over
it, the static burst value, the node's share-pool state, the quota operation and the
token-bucket limiter. No cgroup or metric access here, so every rule is unit-tested alone.

Upstream's semantics, with its defaults: policy ``none``, ``cpuBurstPercent`` 1000,
``cfsQuotaBurstPercent`` 300, ``cfsQuotaBurstPeriodSeconds`` -1 (no limiter),
``sharePoolThresholdPercent`` 50.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from koord import cgrouplimits
from koord.apis.extension import ANNOTATION_POD_CPU_BURST

FIELD = "spec.cpuBurstStrategy"
CFS_BASE_PERIOD = 100000
INCREASE_STEP, DECREASE_STEP = 1.2, 0.8
COOLING_RATIO = 0.9
"""The share pool is "cooling" from 0.9 x its threshold: quotas stop rising there."""
LIMITER_CONSUME_PERCENT, LIMITER_SAVE_PERCENT = 100, 60
MAX_PERCENT = 100_000
MAX_PERIOD_SECONDS = 86_400 * 366
MAX_ANNOTATION_BYTES = 4096


class BurstError(ValueError):
    """A NodeSLO field or pod annotation CPUBurst cannot use; the message names it."""


class Policy(enum.StrEnum):
    NONE = "none"
    CPU_BURST_ONLY = "cpuBurstOnly"
    CFS_QUOTA_BURST_ONLY = "cfsQuotaBurstOnly"
    AUTO = "auto"

    @property
    def cpu_burst(self) -> bool:
        return self in (Policy.AUTO, Policy.CPU_BURST_ONLY)

    @property
    def cfs_quota_burst(self) -> bool:
        return self in (Policy.AUTO, Policy.CFS_QUOTA_BURST_ONLY)


@dataclass(frozen=True)
class BurstConfig:
    policy: Policy = Policy.NONE
    cpu_burst_percent: int = 1000
    cfs_quota_burst_percent: int = 300
    cfs_quota_burst_period_seconds: int = -1

    @property
    def static(self) -> bool:
        """No quota scaling and no limiter: what a container gets follows from its spec and
        its cgroup files alone, not from usage, throttling, the share pool or time."""
        return not self.policy.cfs_quota_burst and self.cfs_quota_burst_period_seconds < 0


@dataclass(frozen=True)
class BurstStrategy:
    config: BurstConfig = BurstConfig()
    share_pool_threshold_percent: int = 50


_KEYS = {"policy": "policy", "cpuBurstPercent": "cpu_burst_percent",
         "cfsQuotaBurstPercent": "cfs_quota_burst_percent",
         "cfsQuotaBurstPeriodSeconds": "cfs_quota_burst_period_seconds"}
_RANGES = {"cpu_burst_percent": (0, MAX_PERCENT), "cfs_quota_burst_percent": (0, MAX_PERCENT),
           "cfs_quota_burst_period_seconds": (-1, MAX_PERIOD_SECONDS)}


def _merge_config(base: BurstConfig, raw: Any, where: str) -> BurstConfig:
    """``raw`` (JSON fields of upstream's CPUBurstConfig) over ``base``; null keeps the base."""
    if not isinstance(raw, dict):
        raise BurstError(f"{where}: want an object, got {type(raw).__name__}")
    values: dict[str, Any] = {}
    for key, attr in _KEYS.items():
        value = raw.get(key)
        if value is None:
            continue
        if attr == "policy":
            try:
                values[attr] = Policy(value)
            except ValueError:
                raise BurstError(f"{where}.policy={value!r:.40}: want one of "
                                 f"{', '.join(p.value for p in Policy)}") from None
            continue
        lo, hi = _RANGES[attr]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise BurstError(f"{where}.{key}={value!r:.40}: want an integer in [{lo}, {hi}]")
        values[attr] = value
    return replace(base, **values)


def burst_strategy(node_slo: Mapping[str, Any]) -> BurstStrategy:
    """NodeSLO's ``spec.cpuBurstStrategy`` over the defaults."""
    spec = node_slo.get("spec")
    if not isinstance(spec, dict):
        raise BurstError(f"NodeSLO spec: want an object, got {type(spec).__name__}")
    raw = spec.get("cpuBurstStrategy")
    if raw is None:
        return BurstStrategy()
    config = _merge_config(BurstConfig(), raw, FIELD)
    threshold = raw.get("sharePoolThresholdPercent")
    if threshold is None:
        return BurstStrategy(config)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 0 <= threshold <= 100:
        raise BurstError(f"{FIELD}.sharePoolThresholdPercent={threshold!r:.40}: want an integer in [0, 100]")
    return BurstStrategy(config, threshold)


def pod_burst_config(annotations: Mapping[str, str], node: BurstConfig) -> BurstConfig:
    """The pod's ``koordinator.sh/cpuBurst`` annotation merged over the node's config (the
    pod's fields win, absent ones keep the node's), as upstream's genPodBurstConfig."""
    text = annotations.get(ANNOTATION_POD_CPU_BURST)
    if text is None:
        return node
    where = f"pod annotation {ANNOTATION_POD_CPU_BURST}"
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION_BYTES:
        raise BurstError(f"{where}: want a JSON object of at most {MAX_ANNOTATION_BYTES} bytes")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise BurstError(f"{where}: bad JSON: {exc}") from None
    return _merge_config(node, raw, where)


def static_burst_us(limit_milli: int | None, config: BurstConfig) -> int:
    """Upstream's calcStaticCPUBurstVal: limit cores x cpuBurstPercent/100 x 100000 µs;
    0 when the policy has no cpu burst or the container has no cpu limit."""
    if not config.policy.cpu_burst or not limit_milli or limit_milli <= 0:
        return 0
    return min(int(limit_milli / 1000 * config.cpu_burst_percent / 100 * CFS_BASE_PERIOD),
               cgrouplimits.MAX_CFS_QUOTA_US)


def base_quota(limit_milli: int | None) -> int:
    """The quota of the container's cpu limit at the base period; -1 without a limit."""
    if not limit_milli or limit_milli <= 0:
        return -1
    return limit_milli * CFS_BASE_PERIOD // 1000


def clamp_burst(burst: int, quotas: list[int]) -> int:
    """Mainline kernels refuse a burst larger than the cgroup's quota (EINVAL): at most the
    smallest limited quota the cgroup has now or is about to get."""
    limited = [q for q in quotas if q > 0]
    return min([burst, *limited])


class NodeState(enum.Enum):
    OVERLOAD = "overload"
    COOLING = "cooling"
    IDLE = "idle"
    UNKNOWN = "unknown"


def share_pool_state(node_used: float | None, total_cpus: int | None, lsr_requests_milli: int,
                     excluded_used: float, threshold_percent: int) -> tuple[NodeState, float | None]:
    """Upstream's getNodeStateForBurst: (state, share-pool usage ratio).

    The share pool is the node's cpus minus LSE/LSR pods' requests; its usage the node's
    minus LSE/LSR/BE pods' (system usage stays in, to be conservative).
    """
    if node_used is None or not total_cpus:
        return NodeState.UNKNOWN, None
    pool_total = total_cpus - lsr_requests_milli / 1000
    pool_used = node_used - excluded_used
    ratio = pool_used / pool_total if pool_total > 0 else 1.0
    threshold = threshold_percent / 100
    if ratio >= threshold:
        return NodeState.OVERLOAD, ratio
    if ratio >= threshold * COOLING_RATIO:
        return NodeState.COOLING, ratio
    return NodeState.IDLE, ratio


class Operation(enum.Enum):
    UP = "cfsScaleUp"
    DOWN = "cfsScaleDown"
    REMAIN = "cfsRemain"
    RESET = "cfsReset"


def container_operation(config: BurstConfig, allowed_by_limiter: bool,
                        throttled: Callable[[], float | None]) -> Operation:
    """Upstream's genOperationByContainer: reset when the policy has no quota burst, down
    when the limiter forbids, up when the container was throttled, else remain. The last
    throttling is asked for only when it decides, as upstream queries it."""
    if not config.policy.cfs_quota_burst:
        return Operation.RESET
    if not allowed_by_limiter:
        return Operation.DOWN
    last = throttled()
    if last is not None and last > 0:
        return Operation.UP
    return Operation.REMAIN


def operation_by_node(state: NodeState, op: Operation) -> Operation:
    """Upstream's changeOperationByNode: an overloaded share pool turns up/remain into down;
    a cooling or unknown one holds an up."""
    if state is NodeState.OVERLOAD and op in (Operation.UP, Operation.REMAIN):
        return Operation.DOWN
    if state in (NodeState.COOLING, NodeState.UNKNOWN) and op is Operation.UP:
        return Operation.REMAIN
    return op


def target_quota(op: Operation, current: int, base: int, config: BurstConfig) -> int:
    """The container's next quota, within [base, base x cfsQuotaBurstPercent/100].

    Unlike upstream, only a scale-up may raise a quota found below the base (a quota
    another writer shrank, e.g. CPU normalization): reset, down and remain never do.
    """
    ceiling = base
    if config.cfs_quota_burst_percent > 100:
        ceiling = int(base * config.cfs_quota_burst_percent / 100)
    target = current
    if op is Operation.UP:
        target = int(current * INCREASE_STEP)
    elif op is Operation.DOWN:
        target = int(current * DECREASE_STEP)
    elif op is Operation.RESET:
        target = base
    target = max(base, min(target, ceiling))
    if op is not Operation.UP:
        target = min(target, current)
    return min(target, cgrouplimits.MAX_CFS_QUOTA_US)


class BurstLimiter:
    """Upstream's burstLimiter: a token bucket of cfsQuotaBurstPeriodSeconds x
    (cfsQuotaBurstPercent - 100) tokens, drained by (usage% - 100) per second while a
    container runs at or above its limit, refilled by (100 - usage%) per second below 60%;
    started at a random fill in [0, 50%) so containers do not move in step."""

    def __init__(self, period_seconds: int, max_percent: int, now: float,
                 rand: Callable[[], float] = random.random) -> None:
        self._rand = rand
        self.init(period_seconds, max_percent, now)

    def init(self, period_seconds: int, max_percent: int, now: float) -> None:
        self.capacity = period_seconds * (max_percent - 100)
        self.tokens = int(self.capacity * self._rand() / 2)
        self.last = now
        self.expire_seconds = 2 * period_seconds

    def allow(self, now: float, usage_percent: int) -> tuple[bool, int]:
        elapsed = int(now - self.last)
        if usage_percent >= LIMITER_CONSUME_PERCENT:
            self.tokens -= (usage_percent - 100) * elapsed
        elif usage_percent < LIMITER_SAVE_PERCENT:
            self.tokens += (100 - usage_percent) * elapsed
        self.tokens = max(min(self.tokens, self.capacity), -self.capacity)
        self.last = now
        return self.tokens > 0, self.tokens

    def update_if_changed(self, period_seconds: int, max_percent: int, now: float) -> None:
        if self.capacity != period_seconds * (max_percent - 100):
            self.init(period_seconds, max_percent, now)

    def expired(self, now: float) -> bool:
        return now - self.last > self.expire_seconds

