"""CPUSetAllocator's metrics, named, typed and labelled as upstream koordlet's:

- ``koordlet_cpuset_share_pool_cpu_cores`` {node}: gauge, cpus in the LS share pools;
- ``koordlet_cpuset_be_share_pool_cpu_cores`` {node}: gauge, cpus in the BE share pools;
- ``koordlet_cpuset_share_pool_info`` {node, cpu}: gauge, 1 per cpu in an LS share pool;
- ``koordlet_cpuset_be_share_pool_info`` {node, cpu}: gauge, 1 per cpu in a BE share pool.

The per-cpu gauges are recorded only with the PerCPUMetric gate (as upstream), and are
cleared before each recording so a cpu that left a pool stops being reported. Cores are
counted per pool, so a cpu listed in two pools counts twice, as upstream counts it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge

from koord.hookapi import parse_cpuset

from .cpusetrule import CPUSharedPool


class CPUSetMetrics:
    def __init__(self, node: str = "", registry: CollectorRegistry | None = None, *, per_cpu: bool = False) -> None:
        self.node = node
        self.per_cpu = per_cpu
        self.registry = registry if registry is not None else CollectorRegistry()
        self.share_cores = Gauge("koordlet_cpuset_share_pool_cpu_cores", "Number of share pool cores",
                                 ["node"], registry=self.registry)
        self.be_share_cores = Gauge("koordlet_cpuset_be_share_pool_cpu_cores", "Number of be share pool cores",
                                    ["node"], registry=self.registry)
        self.share_info = Gauge(
            "koordlet_cpuset_share_pool_info",
            "Indicates whether the CPU ID is currently part of the share pool (1 = in pool)",
            ["node", "cpu"], registry=self.registry)
        self.be_share_info = Gauge(
            "koordlet_cpuset_be_share_pool_info",
            "Indicates whether the CPU ID is currently part of the BE share pool (1 = in pool)",
            ["node", "cpu"], registry=self.registry)

    def record_pools(self, pools: Iterable[CPUSharedPool], be_pools: Iterable[CPUSharedPool]) -> None:
        """Records the pools of newly parsed rules (their cpusets were validated then)."""
        for cores, info, of in ((self.share_cores, self.share_info, pools),
                                (self.be_share_cores, self.be_share_info, be_pools)):
            if self.per_cpu:
                info.clear()
            count = 0
            for pool in of:
                cpus = parse_cpuset(pool.cpuset)
                count += len(cpus)
                if self.per_cpu:
                    for cpu in cpus:
                        info.labels(self.node, str(cpu)).set(1)
            cores.labels(self.node).set(count)
