"""CPUAllocatableEvict / MemoryAllocatableEvict: evict pods when the requests of pods at or
under NodeSLO's ``allocatableEvictPriorityThreshold`` exceed ``<res>AllocatableEvictThresholdPercent``
of the node's allocatable of their currency (``kubernetes.io/batch-cpu`` for koord-batch pods,
``mid-cpu`` for koord-mid, ...), down to ``<res>AllocatableEvictLowerPercent``.

As upstream only batch and mid currencies are released, victims are pods labelled
``koordinator.sh/eviction-enabled=true`` with a usage sample, ordered by eviction-priority
annotation, priority and priority label, larger requests first; they run inside the CPU and
memory eviction strategies (after BECPUEvict / BEMemoryEvict, before CPUEvict / MemoryEvict),
through the same evictor and cool-down.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from koord.apis.extension import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY

from ..metriccache import POD_CPU_USAGE, POD_MEMORY_USAGE, POD_UID
from ..slo import ThresholdConfig
from ..statesinformer import PodMeta
from .evictcalc import (
    PRIORITY_MID_MAX,
    allocatable_release,
    allocatable_victims,
    class_request,
)
from .framework import EvictStrategy
from .nodeinfo import NodeInfoError, node_quantity

log = logging.getLogger(__name__)

RELEASABLE = {"cpu": (BATCH_CPU, MID_CPU),
              "memory": (BATCH_MEMORY, MID_MEMORY)}


def _allocatable(node: dict, resource: str) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for name in (resource, *RELEASABLE[resource]):
        q = node_quantity(node, "allocatable", name)
        out[name] = None if q is None else math.floor(q * 1000 if name == "cpu" else q)
    return out


def _explain(head: str, request: Callable[[PodMeta], float]) -> Callable[[PodMeta], str]:
    return lambda p: f"{head}; pod requests {int(request(p))}"


def evict_by_allocatable(strategy: EvictStrategy, cfg: ThresholdConfig, resource: str, feature: str) -> int:
    """One check of ``feature`` for ``resource`` ("cpu" or "memory"); how many pods were evicted."""
    ctx = strategy.ctx
    if resource == "cpu":
        threshold, lower = cfg.cpu_allocatable_evict_threshold_percent, cfg.cpu_allocatable_evict_lower_percent
    else:
        threshold, lower = (cfg.memory_allocatable_evict_threshold_percent,
                            cfg.memory_allocatable_evict_lower_percent)
    priority = cfg.allocatable_evict_priority_threshold
    key = f"{strategy.name}/{feature}-config"
    if threshold is None or lower is None or priority is None or lower >= threshold:
        ctx.log_once(key, f"{feature} needs {resource}AllocatableEvictThresholdPercent, a lower "
                     f"{resource}AllocatableEvictLowerPercent and allocatableEvictPriorityThreshold "
                     f"(<= {PRIORITY_MID_MAX}); got {threshold}, {lower}, {priority}", logging.WARNING)
        return 0
    ctx.log_once(key, None)
    node = ctx.informer.get_node()
    if node is None:
        return 0
    try:
        allocatable = _allocatable(node, resource)
    except NodeInfoError as exc:
        ctx.log_once(f"{strategy.name}/{feature}-node", f"skipped: {exc}", logging.ERROR)
        return 0
    ctx.log_once(f"{strategy.name}/{feature}-node", None)
    release = allocatable_release(ctx.informer.get_all_pods(), allocatable, resource, threshold, lower, priority)
    targets = {n: r for n, r in release.items() if n in RELEASABLE[resource] and r > 0}
    if not targets:
        return 0
    kind = POD_CPU_USAGE if resource == "cpu" else POD_MEMORY_USAGE
    pods = ctx.informer.get_all_pods()
    used = {p.uid: v for p in pods if (v := ctx.last(kind, {POD_UID: p.uid})) is not None}
    victims = allocatable_victims(pods, used, feature, priority, resource)
    reason = f"trigger by koordlet feature {feature}"

    def request(p: PodMeta) -> float:
        return class_request(p, resource)[1]

    evicted = 0
    for name, amount in sorted(targets.items()):
        mine = [p for p in victims if class_request(p, resource)[0] == name]
        log.warning("%s: %s requests exceed %d%% of allocatable: releasing %d of %s from %d candidate "
                    "pod(s)", feature, name, threshold, amount, name, len(mine))
        evicted += ctx.evictor.evict_until(mine, amount, request, reason, _explain(
            f"{feature}: {name} requests above {threshold}% of allocatable, release {amount}", request))
    return evicted
