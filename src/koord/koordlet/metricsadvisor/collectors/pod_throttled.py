"""CPU throttling of pods and containers: delta nr_throttled / delta nr_periods of cpu.stat
(0 when no period passed); the first tick only primes."""

from __future__ import annotations

from ...metriccache import Samples, SeriesKey, series_key
from ...metriccache import kinds as k
from ..framework import CgroupTarget, Collector, Env, PerTarget, Rates
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
        self._keys = PerTarget(_key)

    def collect(self, now: float) -> Samples:
        """Every running pod's and container's ratio (after its priming tick); this runs
        for every cgroup every second, so the files are read and parsed in one call, the
        differences computed in one, and each target's series key is made once per pod list."""
        out = Samples(now)
        if not self.env.pods.has_synced():
            return out
        targets = self.env.pod_targets()
        targets, keys, counters = self.readable(targets, self._keys(targets),
                                                self.env.parse_cgroups(targets, "cpu_stat", parse_throttle))
        add = out.add_keyed
        diffs = self.rates.deltas([t.id for t in targets], counters, now, [t.who for t in targets])
        for key, diff in zip(keys, diffs, strict=True):
            if diff is not None:
                add(key, diff[1] / diff[0] if diff[0] > 0 else 0.0)
        self.rates.prune(now)
        return out
