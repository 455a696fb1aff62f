"""BEMemoryEvict / MemoryEvict: evict pods when node memory use reaches NodeSLO's
``memoryEvictThresholdPercent``, until it would be back at ``memoryEvictLowerPercent``
(threshold - 2 by default).

BEMemoryEvict picks BE pods (lower priority first, then larger use); MemoryEvict picks
pods labelled ``koordinator.sh/eviction-enabled=true`` under the priority threshold. After
an eviction (and after start) nothing is evicted for ``--memory-evict-cool-time-seconds``.
Pod memory counts in bytes: upstream's MemoryEvict multiplies it by 1000 (a copy of the
CPU code's milli-cores), which makes the first victim look like enough every time.
"""

from __future__ import annotations

import logging

from ..features import BE_MEMORY_EVICT, MEMORY_EVICT
from ..metriccache import NODE_MEMORY_USAGE, POD_MEMORY_USAGE, POD_UID
from ..slo import ThresholdConfig
from .evictcalc import be_memory_victims, labelled_victims, release_memory
from .framework import Context, EvictStrategy
from .nodeinfo import NodeInfoError, capacity_memory

log = logging.getLogger(__name__)

REASON = "EvictPodByNodeMemoryUsage"
GI = 1 << 30


class MemoryEvict(EvictStrategy):
    name = "MemoryEvict"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.memory_evict_interval, (BE_MEMORY_EVICT, MEMORY_EVICT),
                         ctx.config.memory_evict_cool_time)

    def evict(self, cfg: ThresholdConfig, now: float) -> int:
        ctx = self.ctx
        node = ctx.informer.get_node()
        used = ctx.last(NODE_MEMORY_USAGE)
        if node is None or used is None:
            return 0
        try:
            capacity = capacity_memory(node)
        except NodeInfoError as exc:
            self.ctx.log_once(self.name + "/node", f"skipped: {exc}", logging.ERROR)
            return 0
        self.ctx.log_once(self.name + "/node", None)
        threshold, lower = cfg.memory_evict_threshold_percent, cfg.memory_lower_percent
        release = release_memory(used, capacity, threshold, lower)
        if release <= 0:
            return 0
        pods = ctx.informer.get_all_pods()
        pod_used = {p.uid: v for p in pods
                    if (v := ctx.last(POD_MEMORY_USAGE, {POD_UID: p.uid})) is not None}
        if ctx.config.gates.get(BE_MEMORY_EVICT):
            feature, victims = BE_MEMORY_EVICT, be_memory_victims(pods, pod_used, BE_MEMORY_EVICT)
        else:
            feature, victims = MEMORY_EVICT, labelled_victims(
                pods, pod_used, MEMORY_EVICT, cfg.evict_enabled_priority_threshold)
        percent = int(used) * 100 // capacity
        log.warning("%s: node memory %.2f GiB of %.2f GiB (%d%%) >= threshold %d%%: releasing "
                    "%.2f GiB down to %d%% from %d candidate pod(s)", feature, used / GI,
                    capacity / GI, percent, threshold, release / GI, lower, len(victims))
        return ctx.evictor.evict_until(
            victims, release, lambda p: pod_used.get(p.uid, 0.0), REASON,
            lambda p: (f"{feature}: node memory {percent}% >= {threshold}%, release "
                       f"{release} bytes; pod uses {int(pod_used.get(p.uid, 0))} bytes"))
