"""BECPUSuppress: keeps BE pods to what latency-sensitive pods leave of the node's CPU.

Each tick: the suppress amount from the formula in ``suppresscalc``; then, by NodeSLO
``cpuSuppressPolicy``, either the besteffort dir's cfs quota (``cfsQuota``) or the cpusets
of the besteffort, BE pod and container dirs (``cpuset``, the default). Each policy resets
the other's knob: quota -1 under ``cpuset``, cpusets back to the BE pool under
``cfsQuota``. ``enable: false`` resets both. Under kubelet's static CPU manager policy
only container cpusets are narrowed (kubelet owns the pod level and a parent narrower
than a child breaks container starts).

Bad input (an invalid NodeSLO, a malformed Node or pod annotation, an unusable CPU
topology) skips the tick with one error naming it: nothing is written from it.

The besteffort tree is walked again only when the pods or their cgroup directories
changed (``Context.changes``: the pod list, PLEG), after a failed write, and every
TREE_REWALK_ROUNDS rounds for a directory neither reported.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from koord.hookapi import format_cpuset, parse_cpuset

from ..features import BE_CPU_SUPPRESS
from ..metriccache import (
    HOST_APP_NAME,
    HOST_APPLICATION_CPU_USAGE,
    NODE_CPU_INFO,
    NODE_CPU_USAGE,
    POD_CPU_USAGE,
    POD_UID,
)
from ..resourceexecutor.executor import CgroupError
from ..resourceexecutor.updater import BatchResult, Update, quota_value
from ..resources import KoordQoS, KubeQoS
from ..slo import CFS_QUOTA_POLICY, CPUSET_POLICY, HostApp, ThresholdConfig
from ..statesinformer import PodMeta
from .framework import Context, Strategy
from .nodeinfo import (
    NodeInfoError,
    Processor,
    capacity_milli_cpu,
    kubelet_static_policy,
    pod_allocated_cpus,
    processors,
    reserved_cpus,
    reserved_milli_cpu,
    system_qos_exclusive_cpus,
)
from .suppresscalc import (
    UNLIMITED,
    Suppress,
    be_pool,
    calculate_suppress,
    cfs_quota_target,
    cpuset_target,
)

log = logging.getLogger(__name__)

USING, RECOVERED = "using", "recovered"
POD_DEPTH, CONTAINER_DEPTH = 1, 2
TREE_REWALK_ROUNDS = 10


class CPUSuppress(Strategy):
    name = BE_CPU_SUPPRESS

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.cpu_suppress_interval, BE_CPU_SUPPRESS)
        self.status: dict[str, str] = {}
        self.last_suppress: Suppress | None = None
        self.round = 0
        self._tree: tuple[int, int, list[list[str]]] | None = None
        """(``ctx.changes``, round) of the last walk of the besteffort tree, and its dirs."""
        self._tree_updates: tuple[object, str, int, list[list[Update]]] | None = None
        """(walk, cpus, depth) and the updates of that walk's dirs: the same every round
        while the tree and the cpus stay (building a hundred anew cost more than checking
        them against the executor's cache)."""

    @property
    def be_dir(self) -> str:
        return self.ctx.executor.kube_qos_dir(KubeQoS.BESTEFFORT)

    def run_once(self) -> None:
        self.round += 1
        node_slo = self.ctx.node_slo(self.name)
        if node_slo is None:
            return
        cfg = node_slo.thresholds
        try:
            if not cfg.enable:
                self.recover_quota()
                self.recover_cpuset(CONTAINER_DEPTH)
                return
            suppress = self.calculate(node_slo.host_apps, cfg)
            if suppress is None:
                return
            if cfg.cpu_suppress_policy == CFS_QUOTA_POLICY:
                self.adjust_by_cfs_quota(suppress)
                self.recover_cpuset(CONTAINER_DEPTH)
            else:
                self.adjust_by_cpuset(suppress)
                self.recover_quota()
        except NodeInfoError as exc:
            self.ctx.log_once(self.name + "/input", f"skipped, nothing written: {exc}", logging.ERROR)
            return
        self.ctx.log_once(self.name + "/input", None)

    # ---- the formula ----------------------------------------------------------------------

    def calculate(self, apps: Sequence[HostApp], cfg: ThresholdConfig) -> Suppress | None:
        """The suppress formula over this round's node, pods and usage; None (said once) while
        one of them is missing. ``apps``, ``cfg``: the round's NodeSLO host applications and
        thresholds."""
        ctx = self.ctx
        node = ctx.informer.get_node()
        pods = ctx.informer.get_all_pods()
        if node is None or not pods:
            self.ctx.log_once(self.name + "/data", "waiting for the Node object and a non-empty pod list")
            return None
        node_used = ctx.last(NODE_CPU_USAGE)
        if node_used is None:
            self.ctx.log_once(self.name + "/data", "no recent node_cpu_usage sample: not suppressing")
            return None
        self.ctx.log_once(self.name + "/data", None)
        pod_used = ctx.last_by(POD_CPU_USAGE, POD_UID, (p.uid for p in pods))
        app_used = ctx.last_by(HOST_APPLICATION_CPU_USAGE, HOST_APP_NAME, (a.name for a in apps)) if apps else {}
        suppress = calculate_suppress(
            capacity_milli=capacity_milli_cpu(node), reserved_milli=reserved_milli_cpu(node),
            node_used=node_used, pod_used=pod_used, pods=pods, host_apps=apps,
            host_app_used=app_used, threshold_percent=cfg.cpu_suppress_threshold_percent,
            min_percent=cfg.cpu_suppress_min_percent)
        m = ctx.metrics
        m.be_suppress_ls_used.labels(m.node).set(suppress.non_be_pods)
        m.be_suppress_be_used.labels(m.node).set(suppress.be_pods)
        m.be_suppress_target.labels(m.node).set(suppress.milli / 1000)
        if log.isEnabledFor(logging.DEBUG):  # explain() formats every term: not every second for nothing
            log.debug("%s: %s", self.name, suppress.explain())
        self.last_suppress = suppress
        return suppress

    # ---- cfsQuota -------------------------------------------------------------------------

    def _be_dir_exists(self, resource: str) -> bool:
        """No besteffort cgroup yet (no BE pod ever ran): nothing to suppress or restore."""
        if self.ctx.executor.supports(self.be_dir, resource):
            self.ctx.log_once(self.name + "/dir-" + resource, None)
            return True
        self.ctx.log_once(self.name + "/dir-" + resource, f"{self.be_dir} has no {resource} file yet: "
                  "waiting for kubelet to create it")
        return False

    def adjust_by_cfs_quota(self, suppress: Suppress) -> None:
        ex = self.ctx.executor
        if not self._be_dir_exists("cpu_quota"):
            return
        try:
            current = quota_value(ex.read(self.be_dir, "cpu_quota"))
        except (CgroupError, ValueError) as exc:
            log.warning("%s: cannot read the besteffort quota: %s", self.name, exc)
            return
        capacity_cores = math.ceil(suppress.capacity_milli / 1000)
        target = cfs_quota_target(suppress.milli, capacity_cores, current)
        self.status[CFS_QUOTA_POLICY] = USING
        if target is None:
            return
        try:
            written = ex.update(Update(self.be_dir, "cpu_quota", target, owner=self.name), cacheable=False)
        except CgroupError as exc:
            log.error("%s: writing the besteffort quota %d failed: %s", self.name, target, exc)
            return
        m = self.ctx.metrics
        m.be_suppress_cores.labels(m.node, CFS_QUOTA_POLICY).set(target / 100000)
        if written:
            log.info("%s: besteffort cfs quota %d -> %d (%s)", self.name, current, target,
                     suppress.explain())

    def recover_quota(self) -> None:
        if self.status.get(CFS_QUOTA_POLICY) == RECOVERED or not self._be_dir_exists("cpu_quota"):
            return
        try:
            if self.ctx.executor.update(Update(self.be_dir, "cpu_quota", UNLIMITED, owner=self.name),
                                        cacheable=False):
                log.info("%s: besteffort cfs quota restored to -1", self.name)
        except CgroupError as exc:
            log.error("%s: restoring the besteffort quota failed: %s", self.name, exc)
            return
        self.status[CFS_QUOTA_POLICY] = RECOVERED

    # ---- cpuset ---------------------------------------------------------------------------

    def _topology(self) -> tuple[list[Processor], set[int], list[PodMeta]] | None:
        """Online processors, cpus BE may never get (reserved, exclusive system-QoS), pods."""
        info = self.ctx.metric_cache.get_kv(NODE_CPU_INFO)
        if info is None:
            self.ctx.log_once(self.name + "/topology", "no node_cpu_info yet: cpusets untouched")
            return None
        self.ctx.log_once(self.name + "/topology", None)
        node = self.ctx.informer.get_node() or {}
        excluded = reserved_cpus(node) | system_qos_exclusive_cpus(node)
        return processors(info), excluded, self.ctx.informer.get_all_pods()

    def _old_cpus(self, procs: Sequence[Processor]) -> set[int]:
        text = self.ctx.executor.read(self.be_dir, "cpuset_cpus")
        if not text.strip() and self.ctx.executor.version == 2:
            return {p.cpu for p in procs}  # v2: empty means the parent's, i.e. all
        return set(parse_cpuset(text))

    def adjust_by_cpuset(self, suppress: Suppress) -> None:
        topo = self._topology()
        if topo is None or not self._be_dir_exists("cpuset_cpus"):
            return
        procs, excluded, pods = topo
        lse: set[int] = set()
        lsr: set[int] = set()
        for pod in pods:
            allocated = pod_allocated_cpus(pod)
            if pod.koord_qos is KoordQoS.LSE:
                lse |= allocated
            elif pod.koord_qos is KoordQoS.LSR:
                lsr |= allocated
        try:
            old = self._old_cpus(procs)
        except (CgroupError, ValueError) as exc:
            log.warning("%s: cannot read the besteffort cpuset: %s", self.name, exc)
            return
        target = cpuset_target(suppress.milli, procs, old, excluded, lse, lsr)
        self.status[CPUSET_POLICY] = USING
        if not target:
            self.ctx.log_once(self.name + "/cpuset", "not enough cpus for BE: cpusets unchanged",
                      logging.WARNING)
            return
        self.ctx.log_once(self.name + "/cpuset", None)
        cpus = format_cpuset(target)
        # the kubelet policy as koordlet's NodeResourceTopology holds it (the Node's without one)
        holder = self.ctx.informer.get_node_topo() or self.ctx.informer.get_node() or {}
        if kubelet_static_policy(holder):
            self._write_pool(POD_DEPTH)
            levels = self._levels(CONTAINER_DEPTH)
            containers = levels[CONTAINER_DEPTH] if len(levels) > CONTAINER_DEPTH else []
            result = self._check(self.ctx.executor.update_batch(
                [Update(d, "cpuset_cpus", cpus, owner=self.name) for d in containers]))
        else:
            result = self._write_levels(cpus, CONTAINER_DEPTH)
        for error in result.errors:
            log.error("%s: %s", self.name, error)
        m = self.ctx.metrics
        m.be_suppress_cores.labels(m.node, CPUSET_POLICY).set(len(target))
        if result.written:
            log.info("%s: BE cpuset %s -> %s (%s)", self.name, format_cpuset(old), cpus,
                     suppress.explain())

    def _levels(self, depth: int) -> list[list[str]]:
        """The besteffort dir and its descendants with a cpuset file, by level, down to
        ``depth``: the last walk's while it holds (see the module's docstring)."""
        changes, held = self.ctx.changes, self._tree
        if held is None or held[0] != changes or self.round - held[1] >= TREE_REWALK_ROUNDS:
            held = self._tree = (changes, self.round,
                                 self.ctx.executor.subtree(self.be_dir, "cpuset_cpus", CONTAINER_DEPTH))
        return held[2][:depth + 1]

    def _check(self, result: BatchResult) -> BatchResult:
        """A failed write may be a dir gone since the walk: walk again next time."""
        if result.errors:
            self._tree = None
        return result

    def _write_levels(self, cpus: str, depth: int) -> BatchResult:
        levels = self._levels(depth)
        held = self._tree_updates
        if held is None or held[0] is not self._tree or held[1:3] != (cpus, depth):
            held = self._tree_updates = (self._tree, cpus, depth, [
                [Update(d, "cpuset_cpus", cpus, owner=self.name) for d in level] for level in levels])
        return self._check(self.ctx.executor.leveled_update(held[3]))

    def recover_cpuset(self, depth: int) -> None:
        """BE dirs (down to ``depth``) back to the BE pool once after the cpuset policy stops
        (or at start): afterwards the runtime hooks own new BE pods' cpusets, and rewriting
        them every tick would fight their values."""
        if self.status.get(CPUSET_POLICY) == RECOVERED:
            return
        if self._write_pool(depth):
            self.status[CPUSET_POLICY] = RECOVERED

    def _write_pool(self, depth: int) -> bool:
        """The BE pool (all cpus but reserved, exclusive system-QoS and LSE ones) written to
        the BE dirs down to ``depth``; True when every dir holds it."""
        topo = self._topology()
        if topo is None or not self._be_dir_exists("cpuset_cpus"):
            return False
        procs, excluded, pods = topo
        lse: set[int] = set()
        for pod in pods:
            if pod.koord_qos is KoordQoS.LSE:
                lse |= pod_allocated_cpus(pod)
        pool = be_pool(procs, excluded, lse)
        if not pool:
            self.ctx.log_once(self.name + "/pool", "BE pool is empty (all cpus reserved or LSE): "
                              "cpusets untouched", logging.WARNING)
            return False
        self.ctx.log_once(self.name + "/pool", None)
        result = self._write_levels(format_cpuset(pool), depth)
        for error in result.errors:
            log.error("%s: restoring BE cpusets: %s", self.name, error)
        if result.written:
            log.info("%s: BE cpusets restored to the BE pool %s", self.name, format_cpuset(pool))
        return not result.errors
