"""The metrics advisor: runs every enabled collector in its own thread on its own interval
and stores what it returns in the metric cache.

A collector's thread never dies: an exception in a tick is logged (once per cause, with the
collector's name) and the next tick runs as usual. Nothing waits for the states informer:
pod collectors simply find no pods until it has synced, so a missing NodeSLO or API server
cannot stall the modules started after the advisor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..metriccache import MetricCache, MetricCacheError
from .collectors import all_collectors
from .config import AdvisorConfig
from .framework import Collector, Env, PodSource
from .parsers import FileProblem

log = logging.getLogger("koordlet.metricsadvisor")


class MetricsAdvisor:
    def __init__(self, config: AdvisorConfig, states_informer: PodSource, metric_cache: MetricCache,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.env = Env(config, states_informer, metric_cache, clock)
        self.collectors = [c for c in all_collectors(self.env) if c.enabled()]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self.config.collect_res_used_interval < 1.0:
            # Upstream's rule: an interval below one second turns the advisor off.
            log.warning("--collect-res-used-interval %.3fs is below 1s: metrics advisor disabled",
                        self.config.collect_res_used_interval)
            return
        log.info("metrics advisor: cgroup v%d at %s, collectors %s", self.env.cgroups.version,
                 self.config.cgroup_root, ", ".join(c.name for c in self.collectors))
        for collector in self.collectors:
            thread = threading.Thread(target=self._run, args=(collector,), daemon=True,
                                      name=f"collector-{collector.name}")
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()

    def tick(self, collector: Collector) -> None:
        """One collection and store; raises nothing."""
        try:
            samples = list(collector.collect(self.env.clock()))
            if samples:
                self.env.cache.append(samples)
            collector.problems.clear("tick")
        except FileProblem as exc:
            collector.problems.report("tick", "collector %s: %s; no samples this tick", collector.name, exc)
        except MetricCacheError as exc:
            collector.problems.report("tick", "collector %s: metric cache: %s", collector.name, exc)
        except Exception as exc:  # noqa: BLE001 - a collector bug must not end its thread
            collector.problems.report(("bug", type(exc).__name__, str(exc)),
                                      "collector %s failed: %r; it keeps running", collector.name, exc,
                                      level=logging.ERROR, exc_info=True)

    def _run(self, collector: Collector) -> None:
        interval = collector.interval
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.tick(collector)
            # Fixed rate, not fixed delay: a slow tick does not shift every later one.
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)
