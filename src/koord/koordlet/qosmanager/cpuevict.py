"""BECPUEvict / CPUEvict: evict pods when BE pods are starved of CPU, or when node CPU use
reaches ``cpuEvictThresholdPercent``.

BECPUEvict: over the window (``cpuEvictTimeWindowSeconds``, at least the interval) the
average and the last ``node_be`` usage, request and real limit; when BE pods use at least
``cpuEvictBEUsageThresholdPercent`` (90) of their limit and get at most
``cpuEvictBESatisfactionLowerPercent`` of their requests, release the smaller of the two
amounts that bring satisfaction back to the upper percent. CPUEvict: the node's average
CPU use over the window against the threshold, down to the lower percent. After an
eviction (and after start) nothing is evicted for ``--cpu-evict-cool-time-seconds``.
"""

from __future__ import annotations

import logging

from ..features import BE_CPU_EVICT, CPU_ALLOCATABLE_EVICT, CPU_EVICT
from ..metriccache import (
    BE_ALLOCATION,
    BE_ALLOCATION_REAL_LIMIT,
    BE_ALLOCATION_REQUEST,
    BE_ALLOCATION_USAGE,
    BE_RESOURCE,
    BE_RESOURCE_CPU,
    NODE_BE,
    NODE_CPU_USAGE,
    POD_CPU_USAGE,
    POD_UID,
    Aggregation,
)
from ..slo import EVICT_BY_ALLOCATABLE, ThresholdConfig
from ..statesinformer import PodMeta
from .allocatable import evict_by_allocatable
from .evictcalc import (
    BATCH_CPU,
    BEUsage,
    be_cpu_victims,
    labelled_victims,
    release_by_be_satisfaction,
    release_by_used_threshold,
)
from .framework import Context, EvictStrategy
from .nodeinfo import NodeInfoError, capacity_milli_cpu, node_quantity

log = logging.getLogger(__name__)

BE_REASON = "EvictPodByBECPUSatisfaction"
NODE_REASON = "EvictPodByNodeCPUUsage"


class CPUEvict(EvictStrategy):
    name = "CPUEvict"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.cpu_evict_interval, (BE_CPU_EVICT, CPU_ALLOCATABLE_EVICT, CPU_EVICT),
                         ctx.config.cpu_evict_cool_time)

    def window(self, cfg: ThresholdConfig) -> float:
        return max(self.interval, cfg.cpu_evict_time_window_seconds or 0)

    def evict(self, cfg: ThresholdConfig, now: float) -> int:
        ctx = self.ctx
        evicted = 0
        try:
            if ctx.config.gates.get(BE_CPU_EVICT):
                evicted += self.evict_by_be_satisfaction(cfg, now)
            if ctx.config.gates.get(CPU_ALLOCATABLE_EVICT):
                evicted += evict_by_allocatable(self, cfg, "cpu", CPU_ALLOCATABLE_EVICT)
            if ctx.config.gates.get(CPU_EVICT):
                evicted += self.evict_by_node_usage(cfg, now)
        except NodeInfoError as exc:
            self.ctx.log_once(self.name + "/node", f"skipped: {exc}", logging.ERROR)
            return evicted
        self.ctx.log_once(self.name + "/node", None)
        return evicted

    def _be(self, allocation: str, start: float, now: float, agg: Aggregation) -> float | None:
        return self.ctx.metric_cache.aggregate(
            NODE_BE, start, now, agg, {BE_RESOURCE: BE_RESOURCE_CPU, BE_ALLOCATION: allocation})

    def evict_by_be_satisfaction(self, cfg: ThresholdConfig, now: float) -> int:
        lower = cfg.cpu_evict_be_satisfaction_lower_percent
        upper = cfg.cpu_evict_be_satisfaction_upper_percent
        if lower is None or upper is None or not 0 < lower <= 60 or not 0 < upper < 100 or upper < lower:
            self.ctx.log_once(self.name + "/be-config", "BECPUEvict needs cpuEvictBESatisfactionLowerPercent "
                      f"in (0, 60] and an upper percent in [lower, 100); got {lower}, {upper}",
                      logging.WARNING)
            return 0
        self.ctx.log_once(self.name + "/be-config", None)
        ctx = self.ctx
        window = self.window(cfg)
        start = now - window
        count = ctx.metric_cache.aggregate(NODE_BE, start, now, Aggregation.COUNT,
                                           {BE_RESOURCE: BE_RESOURCE_CPU, BE_ALLOCATION: BE_ALLOCATION_USAGE})
        if not count or count * ctx.config.collect_interval < window / 3:
            return 0
        allocatable_limit = None
        if cfg.cpu_evict_policy == EVICT_BY_ALLOCATABLE:
            q = node_quantity(ctx.informer.get_node() or {}, "allocatable", BATCH_CPU)
            allocatable_limit = max(float(q or 0), 1.0)
        releases = []
        for agg in (Aggregation.AVG, Aggregation.LAST):
            used = self._be(BE_ALLOCATION_USAGE, start, now, agg)
            request = self._be(BE_ALLOCATION_REQUEST, start, now, agg)
            limit = allocatable_limit or self._be(BE_ALLOCATION_REAL_LIMIT, start, now, agg)
            if used is None or request is None or limit is None:
                return 0
            releases.append(release_by_be_satisfaction(
                BEUsage(used, request, limit), lower, upper, cfg.cpu_evict_be_usage_threshold_percent))
        release = min(releases)
        if release <= 0:
            return 0
        pods = ctx.informer.get_all_pods()
        used_by = ctx.last_by(POD_CPU_USAGE, POD_UID, (p.uid for p in pods))
        victims = be_cpu_victims(pods, used_by, BE_CPU_EVICT)

        def batch_request(p: PodMeta) -> float:
            return float(sum(c.requests.get(BATCH_CPU, 0) for c in p.containers))

        log.warning("%s: BE satisfaction at or below %d%%: releasing %dm of batch-cpu requests",
                    BE_CPU_EVICT, lower, release)
        return ctx.evictor.evict_until(
            victims, release, batch_request, BE_REASON,
            lambda p: f"{BE_CPU_EVICT}: BE satisfaction <= {lower}%, release {release}m; "
                      f"pod requests {int(batch_request(p))}m batch-cpu")

    def evict_by_node_usage(self, cfg: ThresholdConfig, now: float) -> int:
        threshold, lower = cfg.cpu_evict_threshold_percent, cfg.cpu_lower_percent
        if threshold is None or lower is None:
            return 0
        ctx = self.ctx
        node = ctx.informer.get_node()
        if node is None:
            return 0
        start = now - self.window(cfg)
        used = ctx.metric_cache.aggregate(NODE_CPU_USAGE, start, now, Aggregation.AVG)
        if used is None:
            return 0
        capacity = capacity_milli_cpu(node)
        release = release_by_used_threshold(used, capacity, threshold, lower)
        if release <= 0:
            return 0
        pods = ctx.informer.get_all_pods()
        used_by = {p.uid: v for p in pods
                   if (v := ctx.metric_cache.aggregate(POD_CPU_USAGE, start, now, Aggregation.AVG,
                                                      {POD_UID: p.uid})) is not None}
        victims = labelled_victims(pods, used_by, CPU_EVICT, cfg.evict_enabled_priority_threshold)
        log.warning("%s: node CPU %.2f of %dm cores >= %d%%: releasing %dm", CPU_EVICT, used,
                    capacity, threshold, release)
        return ctx.evictor.evict_until(
            victims, release, lambda p: used_by.get(p.uid, 0.0) * 1000, NODE_REASON,
            lambda p: f"{CPU_EVICT}: node CPU {used:.2f} cores >= {threshold}%, release "
                      f"{release}m; pod uses {used_by.get(p.uid, 0.0) * 1000:.0f}m")
