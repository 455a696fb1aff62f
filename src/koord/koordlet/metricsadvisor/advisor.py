"""The metrics advisor: runs the enabled collectors, one thread per interval (the collectors
sharing an interval one after the other), and stores what a tick returns in the metric
cache in one batch (one transaction a second, not one per collector).

A collectors' thread never dies: an exception in a tick is logged (once per cause, with the
collector's name) and the next tick runs as usual. Nothing waits for the states informer:
pod collectors simply find no pods until it has synced, so a missing NodeSLO or API server
cannot stall the modules started after the advisor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..metriccache import MetricCache, MetricCacheError, Samples
from ..resourceexecutor.executor import CgroupExecutor
from .collectors import all_collectors
from .config import AdvisorConfig
from .framework import Collector, Env, PodSource, collector_problems
from .parsers import FileProblem

log = logging.getLogger("koordlet.metricsadvisor")


class MetricsAdvisor:
    def __init__(self, config: AdvisorConfig, states_informer: PodSource, metric_cache: MetricCache,
                 cgroups: CgroupExecutor, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.env = Env(config, states_informer, metric_cache, cgroups, clock)
        self.collectors = [c for c in all_collectors(self.env) if c.enabled()]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._problems = collector_problems(log)

    def start(self) -> None:
        if self.config.collect_res_used_interval < 1.0:
            # Upstream's rule: an interval below one second turns the advisor off.
            log.warning("--collect-res-used-interval %.3fs is below 1s: metrics advisor disabled",
                        self.config.collect_res_used_interval)
            return
        log.info("metrics advisor: cgroup v%d at %s, collectors %s", self.env.cgroups.version,
                 self.env.cgroups.root, ", ".join(c.name for c in self.collectors))
        groups: dict[float, list[Collector]] = {}
        for collector in self.collectors:
            groups.setdefault(collector.interval, []).append(collector)
        for interval, group in groups.items():
            thread = threading.Thread(target=self._run, args=(interval, group), daemon=True,
                                      name=f"collectors-{interval:g}s")
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()
        self.env.files.close()

    def tick(self, collectors: list[Collector]) -> None:
        """One collection by each of ``collectors`` in order (the system collector after the
        node and pod ones it subtracts) and one store of all their samples; raises nothing.
        When the store refuses the batch, each collector's part is stored on its own, so
        one collector's bad sample cannot cost the others their tick."""
        self.env.begin_tick()
        try:
            parts = [(c, self._collect(c)) for c in collectors]
        finally:
            self.env.end_tick()
        ticks = [samples for _, samples in parts if samples]
        if not ticks:
            return
        try:
            self.env.cache.append_ticks(ticks)
            return
        except MetricCacheError:
            pass
        for collector, samples in parts:
            try:
                if samples:
                    self.env.cache.append_ticks([samples])
                collector.problems.clear("store")
            except MetricCacheError as exc:
                collector.problems.say("store", "collector %s: %s", collector.name, exc)

    def _collect(self, collector: Collector) -> Samples | None:
        try:
            samples = collector.collect(self.env.clock())
            collector.problems.clear("tick")
            return samples
        except FileProblem as exc:
            collector.problems.say("tick", "collector %s: %s; no samples this tick", collector.name, exc)
        except Exception as exc:  # noqa: BLE001 - a collector bug must not end its thread
            collector.problems.say(("bug", type(exc).__name__, str(exc)),
                                      "collector %s failed: %r; it keeps running", collector.name, exc,
                                      level=logging.ERROR, exc_info=True)
        return None

    def _run(self, interval: float, collectors: list[Collector]) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick(collectors)
            except Exception as exc:  # noqa: BLE001 - a bug in storing a tick must not end the thread
                self._problems.say(("bug", type(exc).__name__, str(exc)),
                                      "collectors' tick failed: %r; the next one runs as usual", exc,
                                      level=logging.ERROR, exc_info=True)
            # Fixed rate, not fixed delay: a slow tick does not shift every later one.
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)
