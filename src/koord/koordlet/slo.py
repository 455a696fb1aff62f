"""NodeSLO ``spec.resourceUsedThresholdWithBE``, checked once into a frozen value: read by the
QoS manager's strategies and by the runtime hooks' BatchResource rule, so both read one
NodeSLO the same way.

The states informer already merged the spec over upstream's defaults; this module refuses
values no strategy can use (a percent outside its range, a lower bound above its
threshold, an unknown policy) with an error naming the field, so a bad NodeSLO makes the
strategies skip their tick instead of writing a cgroup from nonsense.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CPUSET_POLICY = "cpuset"
CFS_QUOTA_POLICY = "cfsQuota"
EVICT_BY_REAL_LIMIT = "evictByRealLimit"
EVICT_BY_ALLOCATABLE = "evictByAllocatable"
FIELD = "spec.resourceUsedThresholdWithBE"
DEFAULT_BE_USAGE_THRESHOLD_PERCENT = 90


class SLOError(ValueError):
    """The NodeSLO holds a value the QoS manager cannot use; the message names the field."""


@dataclass(frozen=True)
class ThresholdConfig:
    enable: bool = False
    cpu_suppress_threshold_percent: int = 65
    cpu_suppress_min_percent: int | None = None
    cpu_suppress_policy: str = CPUSET_POLICY
    cpu_evict_be_satisfaction_lower_percent: int | None = None
    cpu_evict_be_satisfaction_upper_percent: int | None = None
    cpu_evict_be_usage_threshold_percent: int = DEFAULT_BE_USAGE_THRESHOLD_PERCENT
    cpu_evict_time_window_seconds: int | None = None
    cpu_evict_threshold_percent: int | None = None
    cpu_evict_lower_percent: int | None = None
    memory_evict_threshold_percent: int = 70
    memory_evict_lower_percent: int | None = None
    cpu_evict_policy: str = EVICT_BY_REAL_LIMIT
    evict_enabled_priority_threshold: int | None = None

    @property
    def memory_lower_percent(self) -> int:
        """Evict down to this; upstream's default is two points below the threshold."""
        if self.memory_evict_lower_percent is not None:
            return self.memory_evict_lower_percent
        return self.memory_evict_threshold_percent - 2

    @property
    def cpu_lower_percent(self) -> int | None:
        if self.cpu_evict_threshold_percent is None:
            return None
        if self.cpu_evict_lower_percent is not None:
            return self.cpu_evict_lower_percent
        return self.cpu_evict_threshold_percent - 2


_PERCENT_FIELDS = {
    "cpuSuppressThresholdPercent": "cpu_suppress_threshold_percent",
    "cpuSuppressMinPercent": "cpu_suppress_min_percent",
    "cpuEvictBESatisfactionLowerPercent": "cpu_evict_be_satisfaction_lower_percent",
    "cpuEvictBESatisfactionUpperPercent": "cpu_evict_be_satisfaction_upper_percent",
    "cpuEvictBEUsageThresholdPercent": "cpu_evict_be_usage_threshold_percent",
    "cpuEvictThresholdPercent": "cpu_evict_threshold_percent",
    "cpuEvictLowerPercent": "cpu_evict_lower_percent",
    "memoryEvictThresholdPercent": "memory_evict_threshold_percent",
    "memoryEvictLowerPercent": "memory_evict_lower_percent",
}


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SLOError(f"{FIELD}.{where}={value!r:.40}: want an integer in [{lo}, {hi}]")
    return value


def threshold_config(node_slo: dict | None) -> ThresholdConfig | None:
    """The merged NodeSLO object (or None: no NodeSLO yet) -> its checked thresholds."""
    if node_slo is None:
        return None
    spec = node_slo.get("spec") if isinstance(node_slo, dict) else None
    if not isinstance(spec, dict):
        raise SLOError(f"NodeSLO spec: want an object, got {type(spec).__name__}")
    raw = spec.get("resourceUsedThresholdWithBE")
    if raw is None:
        return ThresholdConfig()
    if not isinstance(raw, dict):
        raise SLOError(f"{FIELD}: want an object, got {type(raw).__name__}")
    values: dict[str, Any] = {}
    enable = raw.get("enable", False)
    if enable is not None and not isinstance(enable, bool):
        raise SLOError(f"{FIELD}.enable={enable!r:.40}: want true or false")
    values["enable"] = bool(enable)
    for key, attr in _PERCENT_FIELDS.items():
        if raw.get(key) is not None:
            values[attr] = _int(raw[key], key, 0, 100)
    policy = raw.get("cpuSuppressPolicy")
    if policy is not None:
        if policy not in (CPUSET_POLICY, CFS_QUOTA_POLICY):
            raise SLOError(f"{FIELD}.cpuSuppressPolicy={policy!r:.40}: want "
                           f"{CPUSET_POLICY} or {CFS_QUOTA_POLICY}")
        values["cpu_suppress_policy"] = policy
    evict_policy = raw.get("cpuEvictPolicy")
    if evict_policy is not None:
        if evict_policy not in (EVICT_BY_REAL_LIMIT, EVICT_BY_ALLOCATABLE):
            raise SLOError(f"{FIELD}.cpuEvictPolicy={evict_policy!r:.40}: want "
                           f"{EVICT_BY_REAL_LIMIT} or {EVICT_BY_ALLOCATABLE}")
        values["cpu_evict_policy"] = evict_policy
    if raw.get("cpuEvictTimeWindowSeconds") is not None:
        values["cpu_evict_time_window_seconds"] = _int(
            raw["cpuEvictTimeWindowSeconds"], "cpuEvictTimeWindowSeconds", 1, 86400)
    if raw.get("evictEnabledPriorityThreshold") is not None:
        values["evict_enabled_priority_threshold"] = _int(
            raw["evictEnabledPriorityThreshold"], "evictEnabledPriorityThreshold", -2**31, 2**31 - 1)
    config = ThresholdConfig(**values)
    if config.memory_lower_percent > config.memory_evict_threshold_percent:
        raise SLOError(f"{FIELD}.memoryEvictLowerPercent={config.memory_lower_percent} is above "
                       f"memoryEvictThresholdPercent={config.memory_evict_threshold_percent}")
    lower = config.cpu_lower_percent
    if lower is not None and config.cpu_evict_threshold_percent is not None \
            and lower > config.cpu_evict_threshold_percent:
        raise SLOError(f"{FIELD}.cpuEvictLowerPercent={lower} is above "
                       f"cpuEvictThresholdPercent={config.cpu_evict_threshold_percent}")
    return config
