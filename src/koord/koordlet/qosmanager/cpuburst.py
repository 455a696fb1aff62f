"""CPUBurst: lets latency-sensitive containers with a cpu limit run above it for short spells.

Two mechanisms, chosen by NodeSLO ``spec.cpuBurstStrategy.policy`` (overridden per pod by the
``koordinator.sh/cpuBurst`` annotation): ``cpuBurstOnly`` sets the kernel's burst file
(``cpu.cfs_burst_us`` on v1, ``cpu.max.burst`` on v2) of each container to limit x
cpuBurstPercent and of the pod to the sum; ``cfsQuotaBurstOnly`` raises a throttled
container's quota by 1.2x a tick while the node's share pool is idle and lowers it by 0.8x
when the pool is overloaded, within [limit, limit x cfsQuotaBurstPercent]; ``auto`` does
both, ``none`` neither (and undoes both). Pods of QoS LSR, LSE and BE are left alone.

Every write goes through the resource executor. Mainline kernels refuse a burst above the
cgroup's own quota (EINVAL) and a quota below its burst: bursts are clamped to the quota
(said once per container), and before a quota is lowered its burst is lowered with it.

A pod whose config is static (no quota scaling, no limiter) and whose last pass wrote
nothing is not passed over again while the pod list, its cgroup dirs and the NodeSLO stay
the same and this process wrote none of its files (``settled``), for at most
REREAD_ROUNDS rounds: a quota changed outside this process is noticed within that many
rounds (a burst, as before, once the executor's cache of its last write expires).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from ...logonce import LogOnce
from ..features import CPU_BURST
from ..metriccache import (
    CONTAINER_CPU_THROTTLED,
    CONTAINER_CPU_USAGE,
    CONTAINER_ID,
    NODE_CPU_INFO,
    NODE_CPU_USAGE,
    POD_CPU_USAGE,
    POD_UID,
    Aggregation,
)
from ..resourceexecutor.executor import CgroupError
from ..resourceexecutor.updater import Update, quota_value
from ..resources import KoordQoS
from ..statesinformer import PodMeta
from ..statesinformer.meta import ContainerMeta
from .burstcalc import (
    BurstConfig,
    BurstError,
    BurstLimiter,
    NodeState,
    base_quota,
    burst_strategy,
    clamp_burst,
    container_operation,
    operation_by_node,
    pod_burst_config,
    share_pool_state,
    static_burst_us,
    target_quota,
)
from .framework import Context, Strategy
from .nodeinfo import NodeInfoError, processors
from .settled import SettledPods

log = logging.getLogger(__name__)

NOT_BURSTABLE = (KoordQoS.LSR, KoordQoS.LSE, KoordQoS.BE)
SHARE_POOL_EXCLUDED = (KoordQoS.LSR, KoordQoS.LSE, KoordQoS.BE)
MAX_STATE_WINDOW = 10.0
REREAD_ROUNDS = 30
"""A settled pod's cgroup files are read again after at most this many rounds: at the
default 1 s interval, half the minute the resource executor trusts its own writes for.
The pass that reads them costs about as much as ten settled rounds."""


@dataclass(frozen=True)
class _Kept:
    """What a skipped pod still contributes to a round: its containers (alive, so their
    clamp notes stay) and the burst gauge series its last pass set."""

    ids: tuple[str, ...]
    burst_series: tuple[tuple[str, ...], ...]


class _ContainerMetrics:
    """Every container's newest throttling and usage, each asked of the metric cache once a
    round at its first need: one pass over the series, not one query per container."""

    def __init__(self, ctx: Context, pods: list[PodMeta]) -> None:
        self._ctx = ctx
        self._pods = pods
        self._found: dict[str, dict[str, float]] = {}

    def last(self, kind: str, container_id: str) -> float | None:
        found = self._found.get(kind)
        if found is None:
            ids = (c.id for p in self._pods for c in p.containers)
            found = self._found[kind] = self._ctx.last_by(kind, CONTAINER_ID, ids)
        return found.get(container_id)


class CPUBurst(Strategy):
    name = CPU_BURST

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.reconcile_interval, CPU_BURST)
        self.limiters: dict[str, BurstLimiter] = {}
        self.clamped = LogOnce(log)
        """Per container id, the burst it wanted when it was last clamped (said once)."""
        self.last_state: NodeState = NodeState.UNKNOWN
        self.has_burst_file = False
        """A cgroup showed the kernel's burst file: the kernel has it, for every cgroup (not
        asked again per container and tick; a cgroup that went away fails its write)."""
        self.settled: SettledPods[_Kept] = SettledPods(ctx.executor, REREAD_ROUNDS)

    def run_once(self) -> None:
        self.ctx.metrics.begin_cpu_burst()
        try:
            self._run_once()
        finally:
            self.ctx.metrics.end_cpu_burst()

    def _run_once(self) -> None:
        ctx = self.ctx
        changes = ctx.changes  # before the pods: a change after this shows next round
        node_slo = ctx.node_slo(self.name)
        if node_slo is None:
            return
        try:
            strategy = node_slo.section(burst_strategy)
        except BurstError as exc:
            ctx.log_once(self.name, f"NodeSLO rejected, nothing done until it is fixed: {exc}", logging.ERROR)
            return
        pods = ctx.informer.get_all_pods()
        state = self.node_state(strategy.share_pool_threshold_percent, pods)
        self.settled.begin((changes, strategy))
        metrics = _ContainerMetrics(ctx, pods)
        live: set[str] = set()
        for pod in pods:
            if pod.koord_qos in NOT_BURSTABLE or not pod.running:
                continue
            settled = self.settled.get(pod.uid)
            if settled is not None:
                live.update(settled.kept.ids)
                ctx.metrics.container_scaled_cfs_burst.keep(settled.kept.burst_series)
                continue
            try:
                config = pod_burst_config(pod.annotations, strategy.config)
                ctx.log_once(f"{self.name}/pod/{pod.uid}", None)
            except BurstError as exc:
                ctx.log_once(f"{self.name}/pod/{pod.uid}", f"pod {pod.key}: {exc}; using the node's config",
                             logging.WARNING)
                config = strategy.config
            live.update(c.id for c in pod.containers)
            self.apply_pod(pod, config, state, metrics)
        self.recycle(live)

    # ---- node state -----------------------------------------------------------------------

    def node_state(self, threshold_percent: int, pods: list[PodMeta]) -> NodeState:
        """The share pool's state from the node's and the excluded pods' average usage over
        min(5 intervals, 10 s)."""
        ctx = self.ctx
        now = ctx.clock()
        start = now - min(5 * self.interval, MAX_STATE_WINDOW)
        node_used = ctx.metric_cache.aggregate(NODE_CPU_USAGE, start, now, Aggregation.AVG)
        try:
            total = len(processors(ctx.metric_cache.get_kv(NODE_CPU_INFO))) or None
        except NodeInfoError:
            total = None
        excluded = [p for p in pods if p.koord_qos in SHARE_POOL_EXCLUDED]
        excluded_requests = sum(c.requests.get("cpu", 0) for p in excluded
                                if p.koord_qos in (KoordQoS.LSR, KoordQoS.LSE) for c in p.containers)
        excluded_used = 0.0
        for used in self._averages(POD_CPU_USAGE, [p.uid for p in excluded], len(pods), start, now):
            excluded_used += used
        state, ratio = share_pool_state(node_used, total, excluded_requests, excluded_used, threshold_percent)
        if ratio is not None:
            ctx.metrics.cpu_burst_share_pool.labels(ctx.metrics.node).set(ratio)
        if state is not self.last_state:
            log.info("%s: share pool %s (usage ratio %s, threshold %d%%)", self.name, state.value,
                     "unknown" if ratio is None else f"{ratio:.3f}", threshold_percent)
            self.last_state = state
        return state

    def _averages(self, kind: str, uids: list[str], pods: int, start: float, end: float) -> list[float]:
        """Each pod's average usage over [start, end] (0 without samples). A lookup naming a
        pod's uid finds its one series; one pass over every pod's series costs about as
        much as 40 such lookups at 100 pods (and touches every series), so it is taken only
        when more than half the pods are asked for. Both average with fsum: the same numbers."""
        cache = self.ctx.metric_cache
        if 2 * len(uids) > pods:
            found = cache.aggregate_by(kind, POD_UID, start, end, (Aggregation.AVG,))
            return [found.get(uid, {}).get(Aggregation.AVG, 0.0) for uid in uids]
        return [cache.aggregate(kind, start, end, Aggregation.AVG, {POD_UID: uid}) or 0.0 for uid in uids]

    # ---- one pod --------------------------------------------------------------------------

    def apply_pod(self, pod: PodMeta, config: BurstConfig, state: NodeState,
                  metrics: _ContainerMetrics | None = None) -> None:
        """Every container, then the pod's burst; a static pass that wrote nothing and
        failed nowhere settles the pod. ``metrics``: the round's (the pod's own otherwise)."""
        ex, m = self.ctx.executor, self.ctx.metrics
        if metrics is None:
            metrics = _ContainerMetrics(self.ctx, [pod])
        seq = ex.write_seq
        failed = False
        pod_burst = 0
        series: list[tuple[str, ...]] = []
        for c in pod.containers:
            if not c.id:
                continue
            try:
                burst = self.apply_container(pod, c, config, state, metrics)
            except CgroupError as exc:  # gone: the container is leaving, as upstream not a warning
                self.ctx.log_once(f"{self.name}/container/{c.id}", f"pod {pod.key} container {c.name}: {exc}",
                                  logging.DEBUG if self.ctx.executor.gone(exc) else logging.WARNING)
                failed = True
                continue
            self.ctx.log_once(f"{self.name}/container/{c.id}", None)
            if burst is not None:
                labels = (m.node, pod.namespace, pod.name, c.id, c.name)
                m.container_scaled_cfs_burst.set(labels, burst)
                series.append(labels)
                pod_burst += burst
        try:
            self.write_burst(pod.cgroup_dir, pod_burst, f"pod {pod.key}")
        except CgroupError as exc:
            self.ctx.log_once(f"{self.name}/pod-burst/{pod.uid}", f"pod {pod.key}: {exc}",
                              logging.DEBUG if self.ctx.executor.gone(exc) else logging.WARNING)
            failed = True
        if config.static and not failed and ex.write_seq == seq:
            dirs = [pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers if c.id)]
            paths = tuple(ex.path(d, r) for d in dirs for r in ("cpu_quota", "cpu_burst"))
            self.settled.settle(pod.uid, seq, paths, _Kept(tuple(c.id for c in pod.containers), tuple(series)))

    def apply_container(self, pod: PodMeta, c: ContainerMeta, config: BurstConfig, state: NodeState,
                        metrics: _ContainerMetrics) -> int | None:
        """Scales the container's quota (and its pod's by the same delta), then sets its
        burst; returns the burst written (None when the kernel has no burst file)."""
        ex = self.ctx.executor
        who = f"pod {pod.key} container {c.name}"
        limit = c.limits.get("cpu")
        current = quota_value(ex.read(c.cgroup_dir, "cpu_quota"))
        read = current
        base = base_quota(limit)
        if c.running and base > 0 and current > 0:
            allowed = self.allowed_by_limiter(c, config, limit or 0, metrics)
            op = operation_by_node(state, container_operation(
                config, allowed, lambda: metrics.last(CONTAINER_CPU_THROTTLED, c.id)))
            target = target_quota(op, current, base, config)
            if target != current:
                self.scale_quota(pod, c, current, target)
                m = self.ctx.metrics
                m.container_scaled_cfs_quota.set((m.node, pod.namespace, pod.name, c.id, c.name), target)
                log.info("%s: %s: cfs quota %d -> %d (%s, share pool %s)", self.name, who, current, target,
                         op.value, state.value)
                current = target
        wanted = static_burst_us(limit, config)
        burst = clamp_burst(wanted, [current])
        if burst < wanted:
            self.clamped.say(c.id, f"%s: %s: cpu burst {wanted} us is above the container's quota %d: clamped "
                             "to it (the kernel refuses a burst larger than the quota)", self.name, who, current)
        # The quota just read is still the file's unless it was scaled (then read it back).
        if self.write_burst(c.cgroup_dir, burst, who, quota=read if current == read else None):
            return burst
        return None

    def write_burst(self, cgroup_dir: str, burst: int, who: str, quota: int | None = None) -> bool:
        """False when this kernel has no burst file (said once). ``quota``: the cgroup's
        quota when the caller has just read or written it (read here otherwise)."""
        ex = self.ctx.executor
        if not self.has_burst_file:
            self.has_burst_file = ex.supports(cgroup_dir, "cpu_burst")
        if not self.has_burst_file:
            name = ex.path(cgroup_dir, "cpu_burst").name
            self.ctx.log_once(f"{self.name}/no-burst-file", f"this kernel has no {name}: cpu burst is "
                              "not set, cfs quota burst still works")
            return False
        if quota is None:
            quota = quota_value(ex.read(cgroup_dir, "cpu_quota"))
        ex.update(Update(cgroup_dir, "cpu_burst", clamp_burst(burst, [quota]), owner=f"{self.name} {who}"))
        return True

    def scale_quota(self, pod: PodMeta, c: ContainerMeta, current: int, target: int) -> None:
        """Container and pod quota by the same delta: pod first when raising (a child may not
        exceed its parent on v1), container first when lowering. An unlimited pod stays so."""
        ex = self.ctx.executor
        delta = target - current
        pod_quota = quota_value(ex.read(pod.cgroup_dir, "cpu_quota"))
        steps = [(c.cgroup_dir, target)]
        if pod_quota > 0:
            pod_step = (pod.cgroup_dir, pod_quota + delta)
            steps = [pod_step, *steps] if delta > 0 else [*steps, pod_step]
        for cgroup_dir, quota in steps:
            self.set_quota(cgroup_dir, quota, f"pod {pod.key} container {c.name}")

    def set_quota(self, cgroup_dir: str, quota: int, who: str) -> None:
        """Lowers the dir's burst first when it would exceed the new quota (EINVAL otherwise)."""
        ex = self.ctx.executor
        if ex.supports(cgroup_dir, "cpu_burst"):
            burst = int(ex.read(cgroup_dir, "cpu_burst"))
            if burst > quota:
                ex.update(Update(cgroup_dir, "cpu_burst", quota, owner=f"{self.name} {who}"), cacheable=False)
        ex.update(Update(cgroup_dir, "cpu_quota", quota, owner=f"{self.name} {who}"), cacheable=False)

    # ---- inputs -----------------------------------------------------------------------------

    def allowed_by_limiter(self, c: ContainerMeta, config: BurstConfig, limit_milli: int,
                           metrics: _ContainerMetrics) -> bool:
        """Upstream's cfsBurstAllowedByLimiter: no limiter while cfsQuotaBurstPeriodSeconds < 0."""
        if config.cfs_quota_burst_period_seconds < 0:
            return True
        if config.cfs_quota_burst_percent < 100 or limit_milli <= 0:
            return False
        limit = limit_milli / 1000
        usage = metrics.last(CONTAINER_CPU_USAGE, c.id)
        usage = limit if usage is None else usage
        now = self.ctx.clock()
        limiter = self.limiters.get(c.id)
        if limiter is None:
            limiter = self.limiters[c.id] = BurstLimiter(
                config.cfs_quota_burst_period_seconds, config.cfs_quota_burst_percent, now)
        else:
            limiter.update_if_changed(config.cfs_quota_burst_period_seconds, config.cfs_quota_burst_percent, now)
        allowed, _ = limiter.allow(now, math.floor(usage / limit * 100))
        return allowed

    def recycle(self, live: set[str]) -> None:
        now = self.ctx.clock()
        for cid in [k for k, lim in self.limiters.items() if lim.expired(now)]:
            del self.limiters[cid]
        self.clamped.keep_only(live)
