"""CPU throttling of pods and containers: delta nr_throttled / delta nr_periods of cpu.stat
(0 when no period passed); the first tick only primes."""

from __future__ import annotations

from ...metriccache import Samples, SeriesKey, series_key
from ...metriccache import kinds as k
from ..framework import CgroupTarget, Collector, Env, Rates
from ..parsers import parse_throttle


def _key(target: CgroupTarget) -> SeriesKey:
    if target.container is None:
        return series_key(k.POD_CPU_THROTTLED, {k.POD_UID: target.id})
    return series_key(k.CONTAINER_CPU_THROTTLED, {k.CONTAINER_ID: target.id})


class PodThrottledCollector(Collector):
    name = "PodThrottled"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems, counter="cpu.stat periods/throttled")
        self._keys: tuple[list[CgroupTarget], list[SeriesKey]] = ([], [])

    def collect(self, now: float) -> Samples:
        """Every running pod's and container's ratio (after its priming tick); the loop
        runs for every cgroup every second, so the files are read in one call and each
        target's series key is made once per pod list."""
        out = Samples(now)
        if not self.env.pods.has_synced():
            return out
        targets = self.env.pod_targets()
        if self._keys[0] is not targets:
            self._keys = (targets, [_key(t) for t in targets])
        delta, add = self.rates.delta, out.add_keyed
        for target, key, data in zip(targets, self._keys[1], self.env.read_cgroups(targets, "cpu_stat"), strict=True):
            if type(data) is not bytes:
                self.target_problem(target, data)  # type: ignore[arg-type]
                continue
            try:
                counters = parse_throttle(data)
            except ValueError as exc:
                self.target_problem(target, self.env.parse_problem(target, "cpu_stat", exc))
                continue
            diff = delta(target.id, counters, now, target.who)
            if diff is not None:
                add(key, diff[1] / diff[0] if diff[0] > 0 else 0.0)
        self.rates.prune(now)
        return out
