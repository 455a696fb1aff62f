"""Pod and container CPU and memory from their cgroups (v1 or v2).

CPU cores = delta(cpuacct.usage, or cpu.stat usage_usec x 1000) / wall delta; the first tick
of a pod or container only primes. Memory = inactive_anon + active_anon + unevictable of
memory.stat (no page cache; v1: the total_ keys); with ``--enable-pagecache-collector`` also
with page cache. The pods' totals go to the shared state for the system collector.
"""

from __future__ import annotations

from collections.abc import Hashable

from ...metriccache import Sample
from ...metriccache import kinds as k
from ..framework import Collector, Env, Point, Rates
from ..parsers import FileProblem, cgroup_cpu_ns, parse_memory_stat

_POD_KINDS = (k.POD_CPU_USAGE, k.POD_MEMORY_USAGE, k.POD_MEMORY_USAGE_WITH_PAGE_CACHE)
_CONTAINER_KINDS = (k.CONTAINER_CPU_USAGE, k.CONTAINER_MEMORY_USAGE, k.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE)


class PodResourceCollector(Collector):
    name = "PodResource"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems)

    def _usage(self, cgroup_dir: str, key: Hashable, now: float, who: str) -> tuple[float | None, int, int]:
        """(cores or None on the priming tick, memory bytes, with page cache) of one cgroup."""
        version = self.env.cgroups.version
        ns = self.env.read_cgroup(cgroup_dir, "cpuacct_usage", lambda t: cgroup_cpu_ns(t, version))
        memory, with_cache = self.env.read_cgroup(cgroup_dir, "memory_stat", lambda t: parse_memory_stat(t, version))
        rate = self.rates.rate(key, ns, now, f"{who}: CPU time")
        return (None if rate is None else rate / 1e9), memory, with_cache

    def collect(self, now: float) -> list[Sample]:
        if not self.env.pods.has_synced():
            return []
        cache_too = self.env.config.enable_pagecache_collector
        samples: list[Sample] = []
        total_cpu = total_mem = 0.0
        for pod, container in self.pod_cgroups():
            if container is None:
                kinds, labels = _POD_KINDS, {k.POD_UID: pod.uid}
                cgroup_dir, key = pod.cgroup_dir, ("pod", pod.uid)
            else:
                kinds, labels = _CONTAINER_KINDS, {k.CONTAINER_ID: container.id}
                cgroup_dir, key = container.cgroup_dir, ("container", container.id)
            try:
                cores, memory, with_cache = self._usage(cgroup_dir, key, now, self.who(pod, container))
            except FileProblem as exc:
                self.pod_problem(pod, container, exc)
                continue
            cpu_kind, memory_kind, cache_kind = kinds
            samples.append(Sample(memory_kind, labels, now, memory))
            if cache_too:
                samples.append(Sample(cache_kind, labels, now, with_cache))
            if cores is not None:
                samples.append(Sample(cpu_kind, labels, now, cores))
            if container is None:
                total_mem += memory
                total_cpu += cores or 0.0
        self.rates.prune(now)
        self.env.shared.set_pods(self.name, Point(total_cpu, total_mem, now))
        return samples
