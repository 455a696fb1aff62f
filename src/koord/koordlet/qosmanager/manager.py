"""The QoS Manager: the strategies, each on its own interval in its own thread.

The manager starts one thread per enabled strategy; an exception in a tick is logged with
its traceback and counted, and the next tick runs as usual, so no strategy dies silently.
NodeSLO is read afresh on every tick, so a change takes effect on the next one.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from ..metriccache import MetricCache
from ..resourceexecutor.updater import ResourceExecutor
from ..statesinformer import StatesInformer
from .cpuburst import CPUBurst
from .cpuevict import CPUEvict
from .cpusuppress import CPUSuppress
from .evictor import Evictor
from .framework import Context, QOSConfig, Strategy
from .memoryevict import MemoryEvict
from .memoryqos import CgroupReconcile
from .metrics import QOSMetrics
from .resctrl import ResctrlReconcile
from .sysconfig import SystemConfig

log = logging.getLogger(__name__)

STRATEGIES: tuple[Callable[[Context], Strategy], ...] = (
    CPUSuppress, CPUEvict, MemoryEvict, CPUBurst, CgroupReconcile, ResctrlReconcile, SystemConfig)
"""Every strategy, in start order; each runs only when its gate and interval enable it."""


class QOSManager:
    """``QOSManager(config, states_informer, metric_cache, executor).start()/stop()``.

    ``config`` is the parsed flags (``add_flags``) or a QOSConfig; ``api_client`` (a
    ``kubernetes.client.ApiClient``) receives the eviction Events and, with
    ``only_evict_by_api``, the evictions themselves.
    """

    def __init__(self, config: argparse.Namespace | QOSConfig, states_informer: StatesInformer,
                 metric_cache: MetricCache, executor: ResourceExecutor, *,
                 registry: CollectorRegistry | None = None, evictor: Evictor | None = None,
                 api_client: object = None, clock: Callable[[], float] = time.time) -> None:
        cfg = config if isinstance(config, QOSConfig) else QOSConfig.from_args(config)
        metrics = QOSMetrics(cfg.node_name, registry)
        if evictor is None:
            evictor = Evictor(cfg.cri_endpoint, only_by_api=cfg.only_evict_by_api, api_client=api_client,
                              metrics=metrics)
        if isinstance(evictor, Evictor) and evictor.metrics is None:
            evictor.metrics = metrics
        self.ctx = Context(cfg, states_informer, metric_cache, executor, metrics, evictor, clock)
        self.strategies: list[Strategy] = [cls(self.ctx) for cls in STRATEGIES]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        for s in self.strategies:
            if not s.enabled():
                log.info("QoS strategy %s disabled (gate %s=%s, interval %ss)", s.name, s.gate,
                         self.ctx.config.gates.get(s.gate), s.interval)
                continue
            t = threading.Thread(target=self._loop, args=(s,), name=f"qos-{s.name}", daemon=True)
            t.start()
            self._threads.append(t)
            log.info("QoS strategy %s started: every %ss", s.name, s.interval)

    def _loop(self, strategy: Strategy) -> None:
        try:
            strategy.setup()
        except Exception:
            log.exception("QoS strategy %s: setup failed; its ticks run anyway", strategy.name)
        while not self._stop.is_set():
            try:
                strategy.run_once()
            except Exception:
                self.ctx.metrics.strategy_errors.labels(self.ctx.metrics.node, strategy.name).inc()
                log.exception("QoS strategy %s: tick failed; next tick in %ss",
                              strategy.name, strategy.interval)
            self._stop.wait(strategy.interval)
        try:
            strategy.teardown()
        except Exception:
            log.exception("QoS strategy %s: teardown failed", strategy.name)

    def cgroups_changed(self) -> None:
        """PLEG saw a pod or container cgroup directory come or go."""
        self.ctx.note_change()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        self.ctx.evictor.close()
