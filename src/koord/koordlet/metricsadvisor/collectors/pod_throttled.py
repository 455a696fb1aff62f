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

    def _ratio(self, cgroup_dir: str, key: tuple[str, str], now: float, who: str) -> float | None:
        periods, throttled = self.env.read_cgroup(cgroup_dir, "cpu_stat", parse_throttle)
        diff = self.rates.delta(key, (periods, throttled), now, f"{who}: cpu.stat periods/throttled")
        if diff is None:
            return None
        return diff[1] / diff[0] if diff[0] > 0 else 0.0

    def collect(self, now: float) -> list[Sample]:
        if not self.env.pods.has_synced():
            return []
        samples: list[Sample] = []
        for pod, container in self.pod_cgroups():
            if container is None:
                kind, labels, key = k.POD_CPU_THROTTLED, {k.POD_UID: pod.uid}, ("pod", pod.uid)
            else:
                kind, labels = k.CONTAINER_CPU_THROTTLED, {k.CONTAINER_ID: container.id}
                key = ("container", container.id)
            try:
                ratio = self._ratio(container.cgroup_dir if container else pod.cgroup_dir, key, now,
                                    self.who(pod, container))
            except FileProblem as exc:
                self.pod_problem(pod, container, exc)
                continue
            if ratio is not None:
                samples.append(Sample(kind, labels, now, ratio))
        self.rates.prune(now)
        return samples
