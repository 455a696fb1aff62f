"""The NodeSLO as every koordlet module reads it: ``NodeSLO``, frozen typed sections the
states informer parses once per accepted version (``parse_node_slo``), so the QoS
strategies and the collectors, which tick every second, never re-merge or re-check the
object, and every module reads one version the same way.

Typed here: ``spec.resourceUsedThresholdWithBE`` (``ThresholdConfig``) and
``spec.hostApplications`` (``HostApp``). Each parser refuses a value no reader can use (a
percent outside its range, a lower bound above its threshold, an unknown policy, a cgroup
path leaving the tree) with an SLOError naming the field, so the states informer refuses
the whole version and every reader keeps the last good one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .resources import KubeQoS

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
    cpu_allocatable_evict_threshold_percent: int | None = None
    cpu_allocatable_evict_lower_percent: int | None = None
    memory_allocatable_evict_threshold_percent: int | None = None
    memory_allocatable_evict_lower_percent: int | None = None
    allocatable_evict_priority_threshold: int | None = None

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

_ALLOCATABLE_PERCENT_FIELDS = {
    "cpuAllocatableEvictThresholdPercent": "cpu_allocatable_evict_threshold_percent",
    "cpuAllocatableEvictLowerPercent": "cpu_allocatable_evict_lower_percent",
    "memoryAllocatableEvictThresholdPercent": "memory_allocatable_evict_threshold_percent",
    "memoryAllocatableEvictLowerPercent": "memory_allocatable_evict_lower_percent",
}


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SLOError(f"{FIELD}.{where}={value!r:.40}: want an integer in [{lo}, {hi}]")
    return value


def threshold_config(node_slo: dict) -> ThresholdConfig:
    """The merged NodeSLO object -> its checked thresholds."""
    spec = node_slo.get("spec")
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
    for key, attr in _ALLOCATABLE_PERCENT_FIELDS.items():
        # Requests may be meant to exceed allocatable (110% is upstream's example).
        if raw.get(key) is not None:
            values[attr] = _int(raw[key], key, 0, 10000)
    if raw.get("allocatableEvictPriorityThreshold") is not None:
        values["allocatable_evict_priority_threshold"] = _int(
            raw["allocatableEvictPriorityThreshold"], "allocatableEvictPriorityThreshold", -2**31, 7999)
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


MAX_HOST_APPS = 256
_HOST_APP_BASES: dict[str, KubeQoS | None] = {
    "CgroupRoot": None, "Kubepods": KubeQoS.GUARANTEED,
    "KubepodsBurstable": KubeQoS.BURSTABLE, "KubepodsBesteffort": KubeQoS.BESTEFFORT}
_LS_CLASSES = ("LSE", "LSR", "LS")


@dataclass(frozen=True)
class HostApp:
    """One ``spec.hostApplications`` entry: a process outside Kubernetes in a cgroup of its own.

    Its dir follows upstream's GetHostAppCgroupRelativePath: ``cgroupPath`` (its ``base`` —
    the cgroup root, or kubelet's guaranteed, burstable or besteffort dir — then
    ``parentDir`` and ``relativePath``) when given, else ``host-latency-sensitive/<name>``
    for LSE/LSR/LS, ``host-best-effort/<name>`` for BE, ``<name>`` at the root otherwise.
    """

    name: str
    qos: str
    base: KubeQoS | None
    """kubelet's dir of this kube QoS class holds ``rel``; None: the cgroup root does."""
    rel: str
    priority: str = ""

    @property
    def is_be(self) -> bool:
        """BE for CPU suppression only when it is BE *and* lives under the besteffort dir
        (upstream counts any other host application as latency-sensitive usage)."""
        return self.qos == "BE" and self.base is KubeQoS.BESTEFFORT


def parse_host_apps(spec: Mapping[str, Any]) -> tuple[HostApp, ...]:
    """``spec.hostApplications`` of a NodeSLO spec; SLOError naming the entry and field."""
    apps = spec.get("hostApplications")
    if apps is None:
        return ()
    where = "NodeSLO spec.hostApplications"
    if not isinstance(apps, list) or len(apps) > MAX_HOST_APPS:
        raise SLOError(f"{where}: want a list of at most {MAX_HOST_APPS} objects")
    return tuple(_host_app(app, f"{where}[{i}]") for i, app in enumerate(apps))


def _segment(value: Any, where: str, *, many: bool) -> str:
    """A path inside the cgroup tree: no ``..``, no NUL; one name unless ``many``."""
    if not isinstance(value, str) or len(value) > 1024 or "\x00" in value:
        raise SLOError(f"{where}={value!r:.60}: want a cgroup path")
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") for p in parts) or (not many and len(parts) != 1):
        raise SLOError(f"{where}={value!r:.60}: want {'a relative path' if many else 'one name'} "
                       "inside the cgroup tree")
    return "/".join(parts)


def _host_app(app: Any, where: str) -> HostApp:
    if not isinstance(app, dict):
        raise SLOError(f"{where}: want an object")
    name = _segment(app.get("name"), f"{where}.name", many=False)
    qos = app.get("qos") or ""
    if not isinstance(qos, str):
        raise SLOError(f"{where}.qos={qos!r:.40}: want a QoS class name")
    priority = app.get("priority") or ""
    if not isinstance(priority, str):
        raise SLOError(f"{where}.priority={priority!r:.40}: want a priority class name")
    path = app.get("cgroupPath")
    if path is None:
        top = "host-latency-sensitive" if qos in _LS_CLASSES else "host-best-effort" if qos == "BE" else ""
        return HostApp(name, qos, None, f"{top}/{name}" if top else name, priority)
    if not isinstance(path, dict):
        raise SLOError(f"{where}.cgroupPath: want an object")
    base = path.get("base") or "CgroupRoot"
    if base not in _HOST_APP_BASES:
        raise SLOError(f"{where}.cgroupPath.base={base!r:.40}: want one of {', '.join(_HOST_APP_BASES)}")
    parts = [_segment(path.get(key) or "", f"{where}.cgroupPath.{key}", many=True)
             for key in ("parentDir", "relativePath")]
    rel = "/".join(p for p in parts if p)
    if not rel and _HOST_APP_BASES[base] is None:
        raise SLOError(f"{where}.cgroupPath names the cgroup root itself")
    return HostApp(name, qos, _HOST_APP_BASES[base], rel, priority)


S = TypeVar("S")


@dataclass(frozen=True)
class NodeSLO:
    """One accepted NodeSLO version, parsed once; shared by every reader, so read-only."""

    merged: dict[str, Any]
    """The object with its spec merged per section over upstream's defaults, for the
    sections not typed here: the runtime hooks' rules, the system strategy, and what a
    strategy types through ``section`` (resource QoS classes, CPU burst). Shared by every
    reader: never changed."""
    thresholds: ThresholdConfig
    host_apps: tuple[HostApp, ...]
    _sections: dict[Callable[[dict[str, Any]], Any], tuple[bool, Any]] = field(
        default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def section(self, parse: Callable[[dict[str, Any]], S]) -> S:
        """``parse(merged)``, run once for this version and handed out after (its error
        raised again each time): a strategy types its own section with its own parser, kept
        in its package, and parses it once per NodeSLO version, not once per tick. ``parse``
        must be a module-level function (it is the key) and its result read-only."""
        with self._lock:
            held = self._sections.get(parse)
        if held is None:
            try:
                held = (True, parse(self.merged))
            except ValueError as exc:
                held = (False, exc)
            with self._lock:
                held = self._sections.setdefault(parse, held)
        ok, value = held
        if not ok:
            raise value.with_traceback(None)  # not a traceback longer at every tick
        return value


def parse_node_slo(merged: dict) -> NodeSLO:
    """The typed sections of ``merged`` (the NodeSLO with its spec merged over the
    defaults); SLOError naming the field when one is unusable."""
    return NodeSLO(merged, threshold_config(merged), parse_host_apps(merged["spec"]))
