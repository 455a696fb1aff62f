"""CgroupReconcile: memory QoS from NodeSLO ``resourceQOSStrategy.<class>.memoryQOS`` and
the pod annotation ``koordinator.sh/memoryQOS``, reconciled into memcg files every
``--reconcile-interval-seconds``.

Per container (request/limit: ``memory``, or ``kubernetes.io/batch-memory`` for BE pods):
``memory.min`` = request x minLimitPercent/100, ``memory.low`` = request x lowLimitPercent/100
(at least min), ``memory.high`` = floor((request + (limit - request) x throttlingPercent/100)
/ page) x page, with the node's allocatable memory for a container without a limit and
``max`` when throttlingPercent is 0; plus the Anolis wmark and priority files. Per pod:
min and low of its summed request, no high. Per kube-QoS dir: the sums of its running pods,
the kube dir (``kubepods``, the Guaranteed level) the total, plus the class's OOM priority
and kill-group switches. Values are written top-down widened, then exact bottom-up, so a
parent never holds less protection than its children while they change.

Only files the kernel has are written: cgroup v2 has min, low, high and oom.group; cgroup
v1 has none of them unless the kernel is Anolis. Without any, one line says memory QoS is
unsupported and nothing is written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from koord.apis.extension import BATCH_MEMORY

from ...logonce import LogOnce
from ..features import CGROUP_RECONCILE
from ..resourceexecutor.executor import MEMORY_MAX, PAGE_SIZE
from ..resourceexecutor.updater import Update
from ..runtimehooks.protocol import KubeQoS
from ..slo import SLOError
from ..statesinformer import PodMeta
from .framework import Context, Strategy
from .nodeinfo import NodeInfoError, node_quantity
from .resourceqos import (
    BE,
    KUBE_QOS_CLASS,
    memory_qos,
    merged_pod_memory_qos,
    pod_class,
    pod_memory_qos_config,
)

log = logging.getLogger(__name__)


# NodeSLO field -> executor resource, in upstream's write order.
STATIC_FILES = (
    ("wmarkRatio", "memory_wmark_ratio"),
    ("wmarkScalePermill", "memory_wmark_scale_factor"),
    ("wmarkMinAdj", "memory_wmark_min_adj"),
    ("priority", "memory_priority"),
    ("priorityEnable", "memory_use_priority_oom"),
    ("oomKillGroup", "memory_oom_group"),
)
QOS_LEVEL_FILES = (("priority", "memory_priority"), ("priorityEnable", "memory_use_priority_oom"),
                   ("oomKillGroup", "memory_oom_group"))
RESOURCES = ("memory_min", "memory_low", "memory_high") + tuple(r for _, r in STATIC_FILES)


def _pct(value: int, percent: int) -> int:
    """value x percent / 100 truncated toward zero, as Go's int64 arithmetic does."""
    product = value * percent
    return product // 100 if product >= 0 else -(-product // 100)


@dataclass
class Levels:
    """The updates of one reconcile, by level: kube-QoS dirs, pods, containers."""

    qos: list[Update] = field(default_factory=list)
    pods: list[Update] = field(default_factory=list)
    containers: list[Update] = field(default_factory=list)

    def as_list(self) -> list[list[Update]]:
        return [self.qos, self.pods, self.containers]


def pod_request(pod: PodMeta) -> int:
    """The pod's memory request (BE: batch-memory), unset requests counting zero."""
    key = BATCH_MEMORY if pod.koord_qos == BE else "memory"
    return sum(max(c.requests.get(key, 0), 0) for c in pod.containers)


def _container_values(pod: PodMeta, requests: Mapping[str, int], limits: Mapping[str, int],
                      cfg: Mapping[str, int], allocatable: int) -> dict[str, int]:
    key = BATCH_MEMORY if pod.koord_qos == BE else "memory"
    request = max(requests.get(key, 0), 0)
    limit = limits.get(key, -1)
    min_, low = _pct(request, cfg["minLimitPercent"]), _pct(request, cfg["lowLimitPercent"])
    throttling = cfg["throttlingPercent"]
    if throttling == 0:
        high = MEMORY_MAX
    else:
        top = limit if limit > 0 else allocatable
        high = (request + _pct(top - request, throttling)) // PAGE_SIZE * PAGE_SIZE
    if 0 < low < min_:
        low = min_
    if 0 < high < min_:
        high = min_
    return {"memory_min": min_, "memory_low": low, "memory_high": high}


def _static(cfg: Mapping[str, int], files: Iterable[tuple[str, str]]) -> dict[str, int]:
    return {resource: cfg[key] for key, resource in files}


def _updates(cgroup_dir: str, values: Mapping[str, int], owner: str) -> list[Update]:
    return [Update(cgroup_dir, r, v, owner) for r, v in values.items()]


def memory_qos_classes(node_slo: Mapping | None) -> dict[str, Mapping[str, int]]:
    """Each QoS class's memory QoS config from the NodeSLO; SLOError when it is unusable."""
    return {cls: memory_qos(node_slo, cls).values for cls in ("LSR", "LS", "BE", "SYSTEM")}


def calculate(class_cfg: Mapping[str, Mapping], pods: Sequence[PodMeta], allocatable: int,
              qos_dirs: Mapping[KubeQoS, str],
              on_bad_annotation: Callable[[PodMeta, str], None] = lambda p, m: None) -> Levels:
    """Every memory QoS value of the node for the classes' configs (``memory_qos_classes``);
    a pod with a bad annotation gets its class's config and ``on_bad_annotation`` is called."""
    levels = Levels()
    sums = {q: [0, 0] for q in KubeQoS}
    for pod in pods:
        if not pod.running:
            continue
        try:
            annotation = pod_memory_qos_config(pod)
        except SLOError as exc:
            on_bad_annotation(pod, str(exc))
            annotation = None
        cfg = merged_pod_memory_qos(class_cfg[pod_class(pod)], pod, annotation)
        request = pod_request(pod)
        min_, low = _pct(request, cfg["minLimitPercent"]), _pct(request, cfg["lowLimitPercent"])
        kube = KubeQoS(pod.kube_qos)
        sums[kube][0] += min_
        sums[kube][1] += low
        if 0 < low < min_:
            low = min_
        pod_values = {"memory_min": min_, "memory_low": low, **_static(cfg, STATIC_FILES)}
        levels.pods += _updates(pod.cgroup_dir, pod_values, f"pod {pod.key}")
        for c in pod.containers:
            if not c.cgroup_dir:
                continue
            values = {**_container_values(pod, c.requests, c.limits, cfg, allocatable),
                      **_static(cfg, STATIC_FILES)}
            levels.containers += _updates(c.cgroup_dir, values, f"pod {pod.key} container {c.name}")
    # The Guaranteed level is the kube dir itself: the parent of the other two.
    totals = {
        KubeQoS.GUARANTEED: [sum(s[0] for s in sums.values()), sum(s[1] for s in sums.values())],
        KubeQoS.BURSTABLE: sums[KubeQoS.BURSTABLE], KubeQoS.BESTEFFORT: sums[KubeQoS.BESTEFFORT]}
    for kube in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
        values = {"memory_min": totals[kube][0], "memory_low": totals[kube][1],
                  **_static(class_cfg[KUBE_QOS_CLASS[kube]], QOS_LEVEL_FILES)}
        levels.qos += _updates(qos_dirs[kube], values, f"kube QoS {kube.value}")
    return levels


class CgroupReconcile(Strategy):
    name = "CgroupReconcile"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.reconcile_interval, CGROUP_RECONCILE)
        self.last: Levels | None = None
        self._bad_pods = LogOnce(log, max_keys=1024)

    def supported(self) -> tuple[str, list[str]] | None:
        """(the probed kube dir, the memory QoS resources its kernel has); None while the
        kube dir does not exist yet."""
        executor = self.ctx.executor
        top = executor.kube_qos_dir(KubeQoS.GUARANTEED)
        if not executor.path(top, "memory_min").parent.is_dir():
            return None
        return top, [r for r in RESOURCES if executor.supports(top, r)]

    def run_once(self) -> None:
        ctx = self.ctx
        node_slo = ctx.node_slo(self.name)
        if node_slo is None:
            return
        probe = self.supported()
        if probe is None:
            ctx.log_once(self.name, "no kube cgroup dir yet: nothing to do")
            return
        top, supported = probe
        if not supported:
            where = ctx.executor.path(top, "memory_min").parent
            ctx.log_once(self.name + "/unsupported", (
                f"memory QoS is unsupported here: {where} has none of memory.min, memory.low, "
                f"memory.high, memory.oom.group or the Anolis wmark/priority files (cgroup v"
                f"{ctx.executor.version}{' without an Anolis kernel' if ctx.executor.version == 1 else ''}); "
                "nothing is written"), logging.WARNING)
            return
        missing = [r for r in RESOURCES if r not in supported]
        ctx.log_once(self.name + "/partial", f"this kernel has no {', '.join(missing)}: those are not "
                     "written" if missing else None)
        try:
            allocatable = node_quantity(ctx.informer.get_node() or {}, "allocatable", "memory")
            if allocatable is None:
                raise NodeInfoError("Node status.allocatable.memory: missing")
            qos_dirs = {q: ctx.executor.kube_qos_dir(q) for q in KubeQoS}
            levels = calculate(node_slo.section(memory_qos_classes), ctx.informer.get_all_pods(),
                               int(allocatable), qos_dirs,
                               self._bad_annotation)
        except (SLOError, NodeInfoError) as exc:
            ctx.log_once(self.name, f"skipped, nothing written: {exc}", logging.ERROR)
            return
        ctx.log_once(self.name, None)
        wanted = set(supported)
        filtered = [[u for u in level if u.resource in wanted] for level in levels.as_list()]
        self.last = levels
        result = ctx.executor.leveled_update(filtered)
        # A pod's dirs vanish between the pod list and the write when it stops: not news.
        errors = [e for e in result.errors if "missing (cgroup" not in e]
        ctx.log_once(self.name + "/errors", "; ".join(errors[:3]) + (
            f" (and {len(errors) - 3} more)" if len(errors) > 3 else "") if errors else None,
            logging.WARNING)

    def _bad_annotation(self, pod: PodMeta, message: str) -> None:
        self._bad_pods.say(pod.uid, f"{self.name}: {message}; the pod gets its class's memory QoS",
                           level=logging.ERROR)

