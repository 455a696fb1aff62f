"""Pressure stall information of pods and containers (gate PSICollector, off by default as
upstream): avg10 of the cpu, memory and io pressure files, "some" and, where the kernel
has it, "full". Off, too, when the pod cgroups have no pressure files (the kernel lacks PSI)."""

from __future__ import annotations

from ...metriccache import Sample
from ...metriccache import kinds as k
from ..framework import Collector
from ..parsers import FileProblem, parse_psi

_RESOURCES = (("cpu", "cpu_pressure"), ("mem", "memory_pressure"), ("io", "io_pressure"))


class PSICollector(Collector):
    name = "PSI"

    @property
    def interval(self) -> float:
        return self.env.config.psi_collector_interval

    def enabled(self) -> bool:
        return self.env.config.psi_collector

    def _samples(self, kind: str, id_label: dict[str, str], cgroup_dir: str, now: float) -> list[Sample]:
        out = []
        for resource, file in _RESOURCES:
            values = self.env.read_cgroup(cgroup_dir, file, parse_psi)
            for degree, avg10 in values.items():
                labels = {**id_label, k.PSI_RESOURCE: resource, k.PSI_PRECISION: "10", k.PSI_DEGREE: degree}
                out.append(Sample(kind, labels, now, avg10))
        return out

    def collect(self, now: float) -> list[Sample]:
        if not self.env.pods.has_synced():
            return []
        samples: list[Sample] = []
        for pod, container in self.pod_cgroups():
            try:
                if container is None:
                    samples += self._samples(k.POD_PSI, {k.POD_UID: pod.uid}, pod.cgroup_dir, now)
                else:
                    samples += self._samples(k.CONTAINER_PSI, {k.CONTAINER_ID: container.id},
                                             container.cgroup_dir, now)
            except FileProblem as exc:
                self.pod_problem(pod, container, exc)
        return samples
