"""Node CPU (/proc/stat) and memory (/proc/meminfo), also per NUMA node.

CPU cores = delta(user+nice+system+irq+softirq ticks) / (wall delta x CLK_TCK); the first
tick only primes the counter. Memory = MemTotal - MemAvailable (with page cache:
MemTotal - MemFree). A NUMA node's CPU sums its CPUs' lines; its memory is
MemTotal - (MemFree + Active(file) + Inactive(file) + SReclaimable).
"""

from __future__ import annotations

import os
import re

from ...metriccache import Samples
from ...metriccache import kinds as k
from ..framework import Collector, Env, Point, Rates
from ..parsers import (
    PROC_FILE_BYTES,
    FileProblem,
    node_memory_bytes,
    numa_memory_bytes,
    parse,
    parse_cpu_list,
    parse_meminfo,
    parse_proc_stat,
)

_NODE_DIR = re.compile(r"^node(\d+)$")


class NodeResourceCollector(Collector):
    name = "NodeResource"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.ticks_per_second = os.sysconf("SC_CLK_TCK")
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems)

    def _numa_cpus(self) -> dict[str, list[int]]:
        base = self.env.sys / "devices/system/node"
        out: dict[str, list[int]] = {}
        try:
            entries = sorted(p.name for p in base.iterdir())
        except OSError:
            return out  # no NUMA information: a single-node view only
        for name in entries:
            m = _NODE_DIR.match(name)
            if m:
                try:
                    out[m.group(1)] = parse(base / name / "cpulist", parse_cpu_list)
                except FileProblem as exc:
                    self.problems.say(("numa", str(exc.path)), "%s; no NUMA sample for it", exc)
        return out

    def collect(self, now: float) -> Samples:
        out = Samples(now)
        stat = parse(self.env.proc / "stat", parse_proc_stat, PROC_FILE_BYTES)
        meminfo = parse(self.env.proc / "meminfo", parse_meminfo)
        try:
            memory, with_cache = node_memory_bytes(meminfo)
        except ValueError as exc:
            raise FileProblem(self.env.proc / "meminfo", str(exc)) from None
        out.add(k.NODE_MEMORY_USAGE, {}, memory)
        out.add(k.NODE_MEMORY_USAGE_WITH_PAGE_CACHE, {}, with_cache)
        ticks = self.rates.rate("cpu", stat["cpu"].busy, now, "/proc/stat cpu busy ticks")
        if ticks is not None:
            cores = ticks / self.ticks_per_second
            out.add(k.NODE_CPU_USAGE, {}, cores)
            self.env.shared.set_node(Point(cores, memory, now))
        for node_id, cpus in self._numa_cpus().items():
            labels = {k.NUMA_NODE_ID: node_id}
            busy = sum(stat[f"cpu{c}"].busy for c in cpus if f"cpu{c}" in stat)
            numa_ticks = self.rates.rate(("numa", node_id), busy, now, f"/proc/stat busy ticks of NUMA node {node_id}")
            if numa_ticks is not None:
                out.add(k.NODE_NUMA_CPU_USAGE, labels, numa_ticks / self.ticks_per_second)
            path = self.env.sys / "devices/system/node" / f"node{node_id}" / "meminfo"
            try:
                used = numa_memory_bytes(parse(path, parse_meminfo))
            except ValueError as exc:
                self.problems.say(("numa-mem", str(path)), "%s: %s; no NUMA memory sample", path, exc)
                continue
            except FileProblem as exc:
                self.problems.say(("numa-mem", str(path)), "%s; no NUMA memory sample", exc)
                continue
            out.add(k.NODE_NUMA_MEMORY_USAGE, labels, used)
        return out
