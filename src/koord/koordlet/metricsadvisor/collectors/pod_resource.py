"""Pod and container CPU and memory from their cgroups (v1 or v2).

CPU cores = delta(cpuacct.usage, or cpu.stat usage_usec x 1000) / wall delta; the first tick
of a pod or container only primes. Memory = inactive_anon + active_anon + unevictable of
memory.stat (no page cache; v1: the total_ keys); with ``--enable-pagecache-collector`` also
with page cache. The pods' totals go to the shared state for the system collector.
"""

from __future__ import annotations

from collections.abc import Callable

from ...metriccache import Samples, SeriesKey, series_key
from ...metriccache import kinds as k
from ..framework import CgroupTarget, Collector, Env, PerTarget, Point, Rates
from ..parsers import cgroup_cpu_ns, parse_memory_stat

_POD_KINDS = (k.POD_CPU_USAGE, k.POD_MEMORY_USAGE, k.POD_MEMORY_USAGE_WITH_PAGE_CACHE)
_CONTAINER_KINDS = (k.CONTAINER_CPU_USAGE, k.CONTAINER_MEMORY_USAGE, k.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE)


def _keys(target: CgroupTarget) -> tuple[SeriesKey, SeriesKey, SeriesKey, bool]:
    """The target's (CPU, memory, memory with page cache) series, and whether it is a pod."""
    if target.container is None:
        kinds, labels = _POD_KINDS, {k.POD_UID: target.id}
    else:
        kinds, labels = _CONTAINER_KINDS, {k.CONTAINER_ID: target.id}
    cpu, memory, with_cache = (series_key(kind, labels) for kind in kinds)
    return cpu, memory, with_cache, target.container is None


class PodResourceCollector(Collector):
    name = "PodResource"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems, counter="CPU time")
        self._keys = PerTarget(_keys)
        version = env.cgroups.version
        self._cpu_ns: Callable[[bytes], int] = lambda data: cgroup_cpu_ns(data, version)
        self._memory: Callable[[bytes], tuple[int, int]] = lambda data: parse_memory_stat(data, version)

    def collect(self, now: float) -> Samples:
        """Every running pod's and container's samples; a pod whose files cannot be read
        is logged (once) and left out of this tick. This runs for every cgroup every
        second: each file of every target is read and parsed in one call, the CPU rates
        computed in one, and each target's series keys are made once per pod list."""
        out = Samples(now)
        if not self.env.pods.has_synced():
            return out
        env = self.env
        cache_too = env.config.enable_pagecache_collector
        targets = env.pod_targets()
        targets, keys, cpus, memories = self.readable(
            targets, self._keys(targets), env.parse_cgroups(targets, "cpuacct_usage", self._cpu_ns),
            env.parse_cgroups(targets, "memory_stat", self._memory))
        add = out.add_keyed
        total_cpu = total_mem = 0.0
        for (cpu_key, memory_key, cache_key, is_pod), ns_per_second, memory in zip(
                keys, self.rates.rates([t.id for t in targets], cpus, now, [t.who for t in targets]), memories,
                strict=True):
            add(memory_key, float(memory[0]))
            if cache_too:
                add(cache_key, float(memory[1]))
            if ns_per_second is not None:
                add(cpu_key, ns_per_second / 1e9)
            if is_pod:
                total_mem += memory[0]
                total_cpu += 0.0 if ns_per_second is None else ns_per_second / 1e9
        self.rates.prune(now)
        env.shared.set_pods(self.name, Point(total_cpu, total_mem, now))
        return out
