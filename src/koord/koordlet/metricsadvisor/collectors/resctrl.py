"""LLC occupancy and memory bandwidth of the class-level resctrl groups (gate
ResctrlCollector and ``--enable-resctrl-collector``, both off by default as upstream).

Every ``--resctrl-collector-interval`` (10s) each of the ``LSR``, ``LS`` and ``BE`` groups'
``mon_data/mon_L3_<id>`` gives ``resctrl_resource_llc`` {qos, cache_id} (``llc_occupancy``,
bytes) and ``resctrl_resource_mb`` {qos, cache_id, resctrl_mb_type} (the ``mbm_local_bytes``
and ``mbm_total_bytes`` counters as the kernel reports them, as upstream stores them).
Nothing is collected unless ``/proc/cpuinfo`` has the monitoring flags and resctrl is mounted.
``ResctrlPrometheus`` serves the newest samples as upstream's
``koordlet_resctrl_llc_occupancy`` and ``koordlet_resctrl_memory_bandwidth`` gauges.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from ...metriccache import Aggregation, MetricCache, Samples
from ...metriccache import kinds as k
from ...resctrlfs import ResctrlError, ResctrlFS, cpu_info
from ..framework import Collector

GROUPS = ("LSR", "LS", "BE")
MONITORING_FLAGS = ("cqm_llc", "cqm_occup_llc", "cqm_mbm_total", "cqm_mbm_local")
MB_FILES = ("mbm_local_bytes", "mbm_total_bytes")


class ResctrlCollector(Collector):
    name = "Resctrl"

    @property
    def interval(self) -> float:
        return self.env.config.resctrl_collector_interval

    def enabled(self) -> bool:
        return self.env.config.resctrl_collector

    def collect(self, now: float) -> Samples:
        out = Samples(now)
        fs = ResctrlFS(self.env.config.sys_fs_root)
        try:
            flags = cpu_info(self.env.proc).flags
        except ResctrlError as exc:
            self.problems.say("cpuinfo", "resctrl collector: %s", exc)
            return out
        missing = [f for f in MONITORING_FLAGS if f not in flags]
        if missing or not fs.mounted():
            why = f"CPU flags lack {', '.join(missing)}" if missing else f"{fs.root} not mounted"
            self.problems.say("unsupported", "resctrl collector: %s; nothing collected", why)
            return out
        for group in GROUPS:
            try:
                data = fs.mon_data(group)
            except ResctrlError as exc:
                self.problems.say(("group", group), "resctrl collector: group %s: %s", group, exc)
                continue
            self.problems.clear(("group", group))
            for cache_id, values in data.items():
                labels = {k.QOS: group, k.CACHE_ID: str(cache_id)}
                if "llc_occupancy" in values:
                    out.add(k.RESCTRL_LLC, labels, float(values["llc_occupancy"]))
                for mb_type in MB_FILES:
                    if mb_type in values:
                        out.add(k.RESCTRL_MB, {**labels, k.RESCTRL_MB_TYPE: mb_type}, float(values[mb_type]))
        return out


class ResctrlPrometheus(PromCollector):
    """Upstream's resctrl gauges, read from the metric cache's newest samples at scrape time."""

    def __init__(self, cache: MetricCache, node: str = "", window: float = 60.0) -> None:
        self.cache, self.node, self.window = cache, node, window

    @staticmethod
    def describe() -> Iterator[GaugeMetricFamily]:
        """Both families, empty (no cache read)."""
        yield GaugeMetricFamily("koordlet_resctrl_llc_occupancy",
                                "resctrl default qos(LSR, LS, BE) llc occupancy collected by koordlet",
                                labels=["node", "cache_id", "qos"])
        yield GaugeMetricFamily("koordlet_resctrl_memory_bandwidth",
                                "resctrl default qos(LSR, LS, BE) memory bandwidth collected by koordlet",
                                labels=["node", "cache_id", "qos", "mb_type"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.time()
        llc, mb = self.describe()
        for group in GROUPS:
            for cache_id in self._cache_ids(group):
                labels = {k.QOS: group, k.CACHE_ID: cache_id}
                v = self.cache.aggregate(k.RESCTRL_LLC, now - self.window, now, Aggregation.LAST, labels)
                if v is not None:
                    llc.add_metric([self.node, cache_id, group], v)
                for mb_type in MB_FILES:
                    v = self.cache.aggregate(k.RESCTRL_MB, now - self.window, now, Aggregation.LAST,
                                             {**labels, k.RESCTRL_MB_TYPE: mb_type})
                    if v is not None:
                        mb.add_metric([self.node, cache_id, group, mb_type], v)
        yield llc
        yield mb

    def _cache_ids(self, group: str) -> list[str]:
        ids: set[str] = set()
        for kind in (k.RESCTRL_LLC, k.RESCTRL_MB):
            ids.update(labels[k.CACHE_ID] for labels in self.cache.series_labels(kind)
                       if labels.get(k.QOS) == group)
        return sorted(ids, key=int)
