"""CPU topology and NUMA layout into the metric cache's KV, as ``lscpu -e`` would show it.

``node_cpu_info``: {"processors": [{"cpu", "core", "socket", "node", "online"}], "total_cpus"}.
CPUs are those of /proc/cpuinfo plus every ``cpuN`` dir in sysfs (offline ones too); socket
and core come from sysfs topology, else /proc/cpuinfo; ``core`` is renumbered to a logical
index unique across sockets (as lscpu's CORE column), so two sockets' core 0 differ; NUMA
node from ``node*/cpulist`` (0 without NUMA info); online from ``cpu/online``.
``node_numa_info``: {"nodes": [{"id", "cpus", "memory_total_bytes"}]}.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...metriccache import Samples
from ...metriccache import kinds as k
from ..framework import NODE_CPU_INFO, NODE_NUMA_INFO, Collector
from ..parsers import PROC_FILE_BYTES, FileProblem, parse, parse_cpu_list, parse_cpuinfo, parse_int, parse_meminfo

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")
_MAX_ENTRIES = 65536


def _numbered(base: Path, pattern: re.Pattern[str]) -> list[int]:
    try:
        names = [p.name for p in base.iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names[:_MAX_ENTRIES] if (m := pattern.match(n)))


class NodeInfoCollector(Collector):
    name = "NodeInfo"

    @property
    def interval(self) -> float:
        return self.env.config.collect_node_cpu_info_interval

    def _optional(self, path: Path, parser: Any, default: Any) -> Any:
        try:
            return parse(path, parser)
        except FileProblem as exc:
            if not exc.missing:
                self.problems.say(("file", str(path)), "%s; using %r", exc, default)
            return default

    def cpu_info(self) -> dict[str, Any]:
        cpu_base = self.env.sys / "devices/system/cpu"
        node_base = self.env.sys / "devices/system/node"
        from_proc = {p["cpu"]: p for p in parse(self.env.proc / "cpuinfo", parse_cpuinfo, PROC_FILE_BYTES)}
        cpus = sorted(set(from_proc) | set(_numbered(cpu_base, _CPU_DIR)))
        if not cpus:
            raise FileProblem(self.env.proc / "cpuinfo", "no processors listed")
        online = set(self._optional(cpu_base / "online", parse_cpu_list, cpus))
        node_of: dict[int, int] = {}
        for node in _numbered(node_base, _NODE_DIR):
            for cpu in self._optional(node_base / f"node{node}" / "cpulist", parse_cpu_list, []):
                node_of[cpu] = node
        cores: dict[tuple[int, int], int] = {}
        processors = []
        for cpu in cpus:
            proc = from_proc.get(cpu, {})
            topo = cpu_base / f"cpu{cpu}" / "topology"
            socket = self._optional(topo / "physical_package_id", parse_int, proc.get("socket", 0))
            core_id = self._optional(topo / "core_id", parse_int, proc.get("core", cpu))
            core = cores.setdefault((socket, core_id), len(cores))
            processors.append({"cpu": cpu, "core": core, "socket": socket, "node": node_of.get(cpu, 0),
                               "online": cpu in online})
        return {"processors": processors, "total_cpus": len(processors)}

    def numa_info(self, processors: list[dict[str, Any]]) -> dict[str, Any]:
        node_base = self.env.sys / "devices/system/node"
        ids = sorted({p["node"] for p in processors})
        nodes = []
        for node in ids:
            meminfo = self._optional(node_base / f"node{node}" / "meminfo", parse_meminfo, {})
            nodes.append({"id": node, "cpus": [p["cpu"] for p in processors if p["node"] == node],
                          "memory_total_bytes": meminfo.get("MemTotal", 0) * 1024})
        return {"nodes": nodes}

    def collect(self, now: float) -> Samples:
        try:
            info = self.cpu_info()
        except FileProblem:
            self.env.shared.count(NODE_CPU_INFO, False)
            raise
        self.env.cache.set_kv(k.NODE_CPU_INFO, info)
        self.env.shared.count(NODE_CPU_INFO, True)
        self.env.cache.set_kv(k.NODE_NUMA_INFO, self.numa_info(info["processors"]))
        self.env.shared.count(NODE_NUMA_INFO, True)
        return Samples(now)
