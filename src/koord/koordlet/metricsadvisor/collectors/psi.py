"""Pressure stall information of pods and containers (gate PSICollector, off by default as
upstream): the cpu, memory and io pressure files, "some" and, where the kernel has it,
"full". The metric cache keeps avg10, as upstream's; each tick's avg10, avg60 and avg300
go to the shared state for upstream's ``koordlet_pod_psi`` and ``koordlet_container_psi``
gauges (``metricsadvisor.gauges``). Off, too, when the pod cgroups have no pressure files
(the kernel lacks PSI)."""

from __future__ import annotations

from ...metriccache import Samples
from ...metriccache import kinds as k
from ..framework import CgroupTarget, Collector, PSIRow
from ..parsers import FileProblem, parse_psi

_RESOURCES = (("cpu", "cpu_pressure"), ("mem", "memory_pressure"), ("io", "io_pressure"))


class PSICollector(Collector):
    name = "PSI"

    @property
    def interval(self) -> float:
        return self.env.config.psi_collector_interval

    def enabled(self) -> bool:
        return self.env.config.psi_collector

    def _add(self, out: Samples, target: CgroupTarget) -> PSIRow:
        """The target's samples, all or (FileProblem) none, and its row for the gauges."""
        kind, id_label = ((k.POD_PSI, {k.POD_UID: target.id}) if target.container is None
                          else (k.CONTAINER_PSI, {k.CONTAINER_ID: target.id}))
        found = tuple((resource, self.env.read_cgroup(target.cgroup_dir, file, parse_psi))
                      for resource, file in _RESOURCES)
        for resource, values in found:
            for degree, averages in values.items():
                out.add(kind, {**id_label, k.PSI_RESOURCE: resource, k.PSI_PRECISION: "10", k.PSI_DEGREE: degree},
                        averages[0])
        return target, found

    def collect(self, now: float) -> Samples:
        out = Samples(now)
        if not self.env.pods.has_synced():
            return out
        rows = []
        for target in self.env.pod_targets():
            try:
                rows.append(self._add(out, target))
            except FileProblem as exc:
                self.target_problem(target, exc)
        self.env.shared.psi = tuple(rows)
        return out
