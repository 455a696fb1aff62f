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


class PodResourceCollector(Collector):
    name = "PodResource"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval)

    def _usage(self, cgroup_dir: str, key: Hashable, now: float) -> tuple[float | None, int, int]:
        """(cores or None on the priming tick, memory bytes, with page cache) of one cgroup."""
        version = self.env.cgroups.version
        ns = self.env.read_cgroup(cgroup_dir, "cpuacct_usage", lambda t: cgroup_cpu_ns(t, version))
        memory, with_cache = self.env.read_cgroup(cgroup_dir, "memory_stat", lambda t: parse_memory_stat(t, version))
        rate = self.rates.rate(key, ns, now)
        return (None if rate is None else rate / 1e9), memory, with_cache

    def collect(self, now: float) -> list[Sample]:
        if not self.env.pods.has_synced():
            return []
        cache_too = self.env.config.enable_pagecache_collector
        samples: list[Sample] = []
        total_cpu = total_mem = 0.0
        for pod in self.env.all_pods():
            if not pod.running or not pod.cgroup_dir:
                continue
            labels = {k.POD_UID: pod.uid}
            try:
                cores, memory, with_cache = self._usage(pod.cgroup_dir, ("pod", pod.uid), now)
            except FileProblem as exc:
                self.pod_problem(pod, None, exc)
                continue
            samples.append(Sample(k.POD_MEMORY_USAGE, labels, now, memory))
            if cache_too:
                samples.append(Sample(k.POD_MEMORY_USAGE_WITH_PAGE_CACHE, labels, now, with_cache))
            total_mem += memory
            if cores is not None:
                samples.append(Sample(k.POD_CPU_USAGE, labels, now, cores))
                total_cpu += cores
            for container in pod.containers:
                if not container.running or not container.id or not container.cgroup_dir:
                    continue
                clabels = {k.CONTAINER_ID: container.id}
                try:
                    ccores, cmem, cwith_cache = self._usage(container.cgroup_dir, ("container", container.id), now)
                except FileProblem as exc:
                    self.pod_problem(pod, container.name, exc)
                    continue
                samples.append(Sample(k.CONTAINER_MEMORY_USAGE, clabels, now, cmem))
                if cache_too:
                    samples.append(Sample(k.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE, clabels, now, cwith_cache))
                if ccores is not None:
                    samples.append(Sample(k.CONTAINER_CPU_USAGE, clabels, now, ccores))
        self.rates.prune(now)
        self.env.shared.set_pods(self.name, Point(total_cpu, total_mem, now))
        return samples
