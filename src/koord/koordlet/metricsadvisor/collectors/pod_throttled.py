"""CPU throttling of pods and containers: delta nr_throttled / delta nr_periods of cpu.stat
(0 when no period passed); the first tick only primes."""

from __future__ import annotations

from ...metriccache import Sample
from ...metriccache import kinds as k
from ..framework import Collector, Env, Rates
from ..parsers import FileProblem, parse_throttle


class PodThrottledCollector(Collector):
    name = "PodThrottled"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems)

    def collect(self, now: float) -> list[Sample]:
        """Every running pod's and container's ratio (after its priming tick); the loop
        runs for every cgroup every second, so it calls the reader and the rates directly."""
        if not self.env.pods.has_synced():
            return []
        read, delta = self.env.read_cgroup, self.rates.delta
        samples: list[Sample] = []
        for pod, container in self.pod_cgroups():
            if container is None:
                kind, labels, key = k.POD_CPU_THROTTLED, {k.POD_UID: pod.uid}, ("pod", pod.uid)
                cgroup_dir = pod.cgroup_dir
            else:
                kind, labels = k.CONTAINER_CPU_THROTTLED, {k.CONTAINER_ID: container.id}
                key, cgroup_dir = ("container", container.id), container.cgroup_dir
            try:
                counters = read(cgroup_dir, "cpu_stat", parse_throttle)
            except FileProblem as exc:
                self.pod_problem(pod, container, exc)
                continue
            diff = delta(key, counters, now,
                         lambda: f"{self.who(pod, container)}: cpu.stat periods/throttled")  # noqa: B023
            if diff is not None:
                samples.append(Sample(kind, labels, now, diff[1] / diff[0] if diff[0] > 0 else 0.0))
        self.rates.prune(now)
        return samples
