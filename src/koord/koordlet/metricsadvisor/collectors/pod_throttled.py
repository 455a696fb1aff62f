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
        self.rates = Rates(ttl=20 * self.interval)

    def _ratio(self, cgroup_dir: str, key: tuple[str, str], now: float) -> float | None:
        periods, throttled = self.env.read_cgroup(cgroup_dir, "cpu_stat", parse_throttle)
        diff = self.rates.delta(key, (periods, throttled), now)
        if diff is None:
            return None
        return diff[1] / diff[0] if diff[0] > 0 else 0.0

    def collect(self, now: float) -> list[Sample]:
        if not self.env.pods.has_synced():
            return []
        samples: list[Sample] = []
        for pod in self.env.all_pods():
            if not pod.running or not pod.cgroup_dir:
                continue
            try:
                ratio = self._ratio(pod.cgroup_dir, ("pod", pod.uid), now)
            except FileProblem as exc:
                self.pod_problem(pod, None, exc)
                continue
            if ratio is not None:
                samples.append(Sample(k.POD_CPU_THROTTLED, {k.POD_UID: pod.uid}, now, ratio))
            for c in pod.containers:
                if not c.running or not c.id or not c.cgroup_dir:
                    continue
                try:
                    cratio = self._ratio(c.cgroup_dir, ("container", c.id), now)
                except FileProblem as exc:
                    self.pod_problem(pod, c.name, exc)
                    continue
                if cratio is not None:
                    samples.append(Sample(k.CONTAINER_CPU_THROTTLED, {k.CONTAINER_ID: c.id}, now, cratio))
        self.rates.prune(now)
        return samples
