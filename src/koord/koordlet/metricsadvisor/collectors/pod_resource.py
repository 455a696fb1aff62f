"""Pod and container CPU and memory from their cgroups (v1 or v2).

CPU cores = delta(cpuacct.usage, or cpu.stat usage_usec x 1000) / wall delta; the first tick
of a pod or container only primes. Memory = inactive_anon + active_anon + unevictable of
memory.stat (no page cache; v1: the total_ keys); with ``--enable-pagecache-collector`` also
with page cache. The pods' totals go to the shared state for the system collector.
"""

from __future__ import annotations

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
        version = env.cgroups.version
        self._cpu_ns = lambda text: cgroup_cpu_ns(text, version)
        self._memory = lambda text: parse_memory_stat(text, version)

    def collect(self, now: float) -> list[Sample]:
        """Every running pod's and container's samples; a pod whose files cannot be read
        is logged (once) and left out of this tick. The loop runs for every cgroup every
        second, so it calls the reader and the rates directly."""
        if not self.env.pods.has_synced():
            return []
        cache_too = self.env.config.enable_pagecache_collector
        read, rate = self.env.read_cgroup, self.rates.rate
        samples: list[Sample] = []
        total_cpu = total_mem = 0.0
        for pod, container in self.pod_cgroups():
            if container is None:
                (cpu_kind, memory_kind, cache_kind), labels = _POD_KINDS, {k.POD_UID: pod.uid}
                cgroup_dir, key = pod.cgroup_dir, ("pod", pod.uid)
            else:
                (cpu_kind, memory_kind, cache_kind), labels = _CONTAINER_KINDS, {k.CONTAINER_ID: container.id}
                cgroup_dir, key = container.cgroup_dir, ("container", container.id)
            try:
                ns = read(cgroup_dir, "cpuacct_usage", self._cpu_ns)
                memory, with_cache = read(cgroup_dir, "memory_stat", self._memory)
            except FileProblem as exc:
                self.pod_problem(pod, container, exc)
                continue
            ns_per_second = rate(key, ns, now, lambda: f"{self.who(pod, container)}: CPU time")  # noqa: B023
            samples.append(Sample(memory_kind, labels, now, memory))
            if cache_too:
                samples.append(Sample(cache_kind, labels, now, with_cache))
            if ns_per_second is not None:
                samples.append(Sample(cpu_kind, labels, now, ns_per_second / 1e9))
            if container is None:
                total_mem += memory
                total_cpu += 0.0 if ns_per_second is None else ns_per_second / 1e9
        self.rates.prune(now)
        self.env.shared.set_pods(self.name, Point(total_cpu, total_mem, now))
        return samples
