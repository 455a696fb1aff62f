"""Pod and container CPU and memory from their cgroups (v1 or v2).

CPU cores = delta(cpuacct.usage, or cpu.stat usage_usec x 1000) / wall delta; the first tick
of a pod or container only primes. Memory = inactive_anon + active_anon + unevictable of
memory.stat (no page cache; v1: the total_ keys); with ``--enable-pagecache-collector`` also
with page cache. The pods' totals go to the shared state for the system collector.
"""

from __future__ import annotations

from ...metriccache import Samples, SeriesKey, series_key
from ...metriccache import kinds as k
from ..framework import CgroupTarget, Collector, Env, PerTarget, Point, Rates
from ..parsers import FileProblem, cgroup_cpu_ns, parse_memory_stat

_POD_KINDS = (k.POD_CPU_USAGE, k.POD_MEMORY_USAGE, k.POD_MEMORY_USAGE_WITH_PAGE_CACHE)
_CONTAINER_KINDS = (k.CONTAINER_CPU_USAGE, k.CONTAINER_MEMORY_USAGE, k.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE)


def _keys(target: CgroupTarget) -> tuple[SeriesKey, SeriesKey, SeriesKey]:
    """The target's (CPU, memory, memory with page cache) series."""
    if target.container is None:
        kinds, labels = _POD_KINDS, {k.POD_UID: target.id}
    else:
        kinds, labels = _CONTAINER_KINDS, {k.CONTAINER_ID: target.id}
    cpu, memory, with_cache = (series_key(kind, labels) for kind in kinds)
    return cpu, memory, with_cache


class PodResourceCollector(Collector):
    name = "PodResource"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems, counter="CPU time")
        self._keys = PerTarget(_keys)

    def collect(self, now: float) -> Samples:
        """Every running pod's and container's samples; a pod whose files cannot be read
        is logged (once) and left out of this tick. The loop runs for every cgroup every
        second: the files are read in two calls, and each target's series keys are made
        once per pod list."""
        out = Samples(now)
        if not self.env.pods.has_synced():
            return out
        env, version = self.env, self.env.cgroups.version
        cache_too = env.config.enable_pagecache_collector
        targets = env.pod_targets()
        cpus = env.parse_cgroups(targets, "cpuacct_usage", lambda data: cgroup_cpu_ns(data, version))
        memories = env.parse_cgroups(targets, "memory_stat", lambda data: parse_memory_stat(data, version))
        rate, add = self.rates.rate, out.add_keyed
        total_cpu = total_mem = 0.0
        for target, (cpu_key, memory_key, cache_key), ns, memory in zip(targets, self._keys(targets), cpus,
                                                                         memories, strict=True):
            if isinstance(ns, FileProblem):
                self.target_problem(target, ns)
                continue
            if isinstance(memory, FileProblem):
                self.target_problem(target, memory)
                continue
            ns_per_second = rate(target.id, ns, now, target.who)
            add(memory_key, float(memory[0]))
            if cache_too:
                add(cache_key, float(memory[1]))
            if ns_per_second is not None:
                add(cpu_key, ns_per_second / 1e9)
            if target.container is None:
                total_mem += memory[0]
                total_cpu += 0.0 if ns_per_second is None else ns_per_second / 1e9
        self.rates.prune(now)
        env.shared.set_pods(self.name, Point(total_cpu, total_mem, now))
        return out
