"""What every QoS strategy is built on: its flags, its context and the Strategy base classes.

A strategy has ``enabled()`` (its feature gate and a positive interval), ``setup(ctx)``
(once, before its first tick) and ``run_once()`` (one tick). This module knows no strategy:
each strategy module imports it, and ``manager.py`` lists the strategies and runs them, so
no import circle forms.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...logonce import LogOnce
from ..features import QOS_FEATURE_GATES
from ..flagtypes import flag_bool
from ..hostpaths import CONTAINERD_SOCKET, PROC_ROOT, SYS_FS_ROOT, SYS_ROOT
from ..metriccache import Aggregation, MetricCache
from ..metricsadvisor.config import AdvisorConfig
from ..resourceexecutor.updater import ResourceExecutor
from ..slo import NodeSLO, ThresholdConfig
from ..statesinformer import NODE_SLO, PODS, StatesInformer
from .evictor import Evictor
from .metrics import QOSMetrics

log = logging.getLogger(__name__)

MAX_CONDITIONS = 2048
"""Complaints ``Context.log_once`` remembers (one per pod or container at most)."""


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a whole number of seconds") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text}: want 0..86400 seconds")
    return value


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Upstream's QoS manager flags, their defaults ``QOSConfig``'s; gates go through
    ``--feature-gates``."""
    d = QOSConfig()
    g = parser.add_argument_group("QoS manager")
    g.add_argument("--cpu-suppress-interval-seconds", type=_seconds, default=d.cpu_suppress_interval, metavar="N",
                   help="BECPUSuppress period; 0 disables (default: %(default)s)")
    g.add_argument("--cpu-evict-interval-seconds", type=_seconds, default=d.cpu_evict_interval, metavar="N",
                   help="BECPUEvict/CPUEvict period; 0 disables (default: %(default)s)")
    g.add_argument("--memory-evict-interval-seconds", type=_seconds, default=d.memory_evict_interval, metavar="N",
                   help="BEMemoryEvict/MemoryEvict period; 0 disables (default: %(default)s)")
    g.add_argument("--memory-evict-cool-time-seconds", type=_seconds, default=d.memory_evict_cool_time, metavar="N",
                   help="no memory eviction this long after the last one (default: %(default)s)")
    g.add_argument("--cpu-evict-cool-time-seconds", type=_seconds, default=d.cpu_evict_cool_time, metavar="N",
                   help="no CPU eviction this long after the last one (default: %(default)s)")
    g.add_argument("--reconcile-interval-seconds", type=_seconds, default=d.reconcile_interval, metavar="N",
                   help="CPUBurst, CgroupReconcile, RdtResctrl and SystemConfig period; 0 disables "
                        "(default: %(default)s)")
    g.add_argument("--only-evict-by-api", type=flag_bool, nargs="?", const=True, default=d.only_evict_by_api,
                   metavar="BOOL",
                   help="evict only through the API server's Eviction subresource, never by "
                   "stopping containers through CRI (default: false)")


@dataclass(frozen=True)
class QOSConfig:
    """The QoS manager's settings. Its own flags' defaults are stated here only (``add_flags``
    gives them to the flags); the others come from where their flags are defined."""

    cpu_suppress_interval: float = 1
    cpu_evict_interval: float = 1
    memory_evict_interval: float = 1
    memory_evict_cool_time: float = 4
    cpu_evict_cool_time: float = 20
    reconcile_interval: float = 1
    only_evict_by_api: bool = False
    collect_interval: float = AdvisorConfig.collect_res_used_interval
    gates: Mapping[str, bool] = field(default_factory=lambda: dict(QOS_FEATURE_GATES))
    cri_endpoint: str = CONTAINERD_SOCKET
    node_name: str = ""
    sys_fs_root: Path = SYS_FS_ROOT
    proc_root: Path = PROC_ROOT
    sys_root: Path = SYS_ROOT

    @classmethod
    def from_args(cls, args: argparse.Namespace, node_name: str = "") -> QOSConfig:
        gates = dict(QOS_FEATURE_GATES)
        gates.update({k: v for k, v in args.feature_gates.items() if k in QOS_FEATURE_GATES})
        return cls(
            cpu_suppress_interval=args.cpu_suppress_interval_seconds,
            cpu_evict_interval=args.cpu_evict_interval_seconds,
            memory_evict_interval=args.memory_evict_interval_seconds,
            memory_evict_cool_time=args.memory_evict_cool_time_seconds,
            cpu_evict_cool_time=args.cpu_evict_cool_time_seconds,
            reconcile_interval=args.reconcile_interval_seconds,
            only_evict_by_api=args.only_evict_by_api,
            collect_interval=args.collect_res_used_interval or cls.collect_interval,
            gates=gates,
            cri_endpoint=args.containerd_endpoint,
            node_name=node_name,
            sys_fs_root=Path(args.sys_fs_root_dir),
            proc_root=Path(args.proc_root_dir),
            sys_root=Path(args.sys_root_dir),
        )


@dataclass
class Context:
    """What every strategy reads and writes through."""

    config: QOSConfig
    informer: StatesInformer
    metric_cache: MetricCache
    executor: ResourceExecutor
    metrics: QOSMetrics
    evictor: Evictor
    clock: Callable[[], float] = time.time
    _said: LogOnce = field(default_factory=lambda: LogOnce(log, max_keys=MAX_CONDITIONS))
    changes: int = 0
    """Moves whenever the node's pods, their cgroup directories or the NodeSLO change (the
    states informer's callbacks, PLEG): a strategy that keeps what it derived from them
    compares the value it derived it at with this one. Read it before reading what it
    covers: a change in between then shows as a move next time."""
    _change_counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        for kind in (PODS, NODE_SLO):
            self.informer.register_callback(kind, self.note_change)

    def note_change(self) -> None:
        """Called back by the states informer and PLEG, on their threads (``next`` on a
        counter is atomic, so two concurrent calls still move ``changes``)."""
        self.changes = next(self._change_counter)

    def log_once(self, key: str, message: str | None, level: int = logging.INFO) -> None:
        """Every tick would repeat the same complaint: say it when it starts or changes;
        ``None`` marks the condition over, and it is forgotten. The strategy named before the
        key's first ``/`` prefixes the line."""
        if message is None:
            self._said.clear(key)
        else:
            self._said.say(key, f"{key.split('/')[0]}: {message}", level=level)

    def last(self, kind: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The newest sample within two collect intervals: older means the collector stalled."""
        now = self.clock()
        return self.metric_cache.aggregate(kind, now - 2 * self.config.collect_interval, now,
                                           Aggregation.LAST, labels)

    def last_by(self, kind: str, label: str, values: Iterable[str]) -> dict[str, float]:
        """``last(kind, {label: value})`` for each of ``values`` that has one, in one pass over
        the series (one query per pod would scan every pod's series each time)."""
        now = self.clock()
        return self.metric_cache.last_by(kind, label, values, now - 2 * self.config.collect_interval, now)

    def node_slo(self, strategy: str) -> NodeSLO | None:
        """The NodeSLO's typed sections (the states informer parsed and checked them once,
        when it took the version: shared, read-only), or None (logged once) before there is
        one: the strategy then does nothing this tick."""
        node_slo = self.informer.get_node_slo()
        if node_slo is None:
            self.log_once(strategy, "no NodeSLO yet: nothing to do", logging.WARNING)
        else:
            self.log_once(strategy, None)
        return node_slo

    def thresholds(self, strategy: str) -> ThresholdConfig | None:
        """``node_slo(strategy).thresholds``, or None (logged once) before there is a NodeSLO."""
        node_slo = self.node_slo(strategy)
        return None if node_slo is None else node_slo.thresholds


class Strategy:
    """One QoS strategy. Subclasses set ``name`` and implement ``run_once``."""

    name = ""

    def __init__(self, ctx: Context, interval: float, gate: str) -> None:
        self.ctx = ctx
        self.interval = interval
        self.gate = gate

    def enabled(self) -> bool:
        return bool(self.ctx.config.gates.get(self.gate)) and self.interval > 0

    def setup(self) -> None:
        """Runs once before the first tick."""

    def run_once(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Runs once after the last tick, when the manager stops."""


class EvictStrategy(Strategy):
    """An eviction strategy: on when any of its gates is, and quiet for ``cool_time`` after
    an eviction and after start (the evicted pods' usage takes that long to leave the node's)."""

    def __init__(self, ctx: Context, interval: float, gates: tuple[str, ...], cool_time: float) -> None:
        super().__init__(ctx, interval, gates[0])
        self.gates = gates
        self.cool_time = cool_time
        self.cool_until = 0.0

    def enabled(self) -> bool:
        return any(self.ctx.config.gates.get(g) for g in self.gates) and self.interval > 0

    def setup(self) -> None:
        self.cool_until = self.ctx.clock() + self.cool_time

    def run_once(self) -> None:
        self.ctx.metrics.expire_eviction_detail()
        now = self.ctx.clock()
        if now < self.cool_until:
            return
        cfg = self.ctx.thresholds(self.name)
        if cfg is None or not cfg.enable:
            return
        if self.evict(cfg, now):
            self.cool_until = now + self.cool_time

    def evict(self, cfg: ThresholdConfig, now: float) -> int:
        """One check with valid, enabled thresholds; returns how many pods were evicted."""
        raise NotImplementedError
