"""ResctrlReconcile (gate RdtResctrl, on by default as upstream): class-level LLC and
memory-bandwidth isolation from NodeSLO ``resourceQOSStrategy.<class>.resctrlQOS``.

Three resctrl groups, ``LSR`` (LSE and LSR pods), ``LS`` and ``BE``, each with an L3 mask
per cache id from [catRangeStartPercent, catRangeEndPercent) of the root's ``cbm_mask``
and an MB value from ``mbaPercent``; a disabled class gets the full mask and 100. Every
tick the thread ids of the running pods of enabled classes that are not yet in their
class's group are appended to its ``tasks`` (pods with the per-pod
``node.koordinator.sh/resctrl`` annotation are left to the Resctrl runtime hook).
As upstream, nothing is done unless ``/proc/cpuinfo`` lists both ``cat_l3`` and ``mba``.

Everything is computed and checked before the first write: a mask the kernel would refuse,
or too few free CLOSIDs for the three groups, is an error and nothing is created or written.
Unlike upstream, the mask is computed from ``info/L3/cbm_mask`` and the cache ids from the
root ``schemata`` (upstream reads both through the node CPU info in the metric cache).
As upstream, a resctrl file system not mounted is mounted (``resctrlfs.enable``) when the
CPU lists both flags.

A pod's thread ids are those of its containers' cgroups and its sandbox's. The sandbox's
cgroup is named by its id where the pods come from CRI; from kubelet's ``/pods`` (no sandbox
id) it is the pod cgroup's one child that is none of its containers', as upstream finds it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koord.apis.extension import ANNOTATION_RESCTRL

from ..cgrouplayout import container_cgroup_dir, driver_of_cgroup_parent
from ..features import RDT_RESCTRL
from ..resctrlfs import (
    CPUInfo,
    Info,
    Mount,
    ResctrlError,
    ResctrlFS,
    check_l3,
    check_mb,
    cpu_info,
    enable,
    l3_mask,
    mb_value,
    mount_resctrl,
)
from ..resourceexecutor.executor import CgroupError
from ..slo import SLOError
from ..statesinformer import PodMeta
from .framework import Context, Strategy
from .resourceqos import BE, LS, LSR, ClassQOS, pod_class, resctrl_qos

log = logging.getLogger(__name__)

GROUPS = (LSR, LS, BE)


def resctrl_classes(node_slo: Mapping | None) -> dict[str, ClassQOS]:
    """Each group's resctrl QoS from the NodeSLO; SLOError when one is unusable."""
    return {g: resctrl_qos(node_slo, g) for g in GROUPS}
"""Group name = NodeSLO class whose resctrlQOS it takes."""


@dataclass(frozen=True)
class GroupPlan:
    name: str
    enable: bool
    l3: dict[int, str]
    mb: dict[int, str]


def plan_groups(configs: Mapping[str, ClassQOS], info: Info, cpu: CPUInfo) -> list[GroupPlan]:
    """Every group's schemata, checked as the kernel checks them; ResctrlError otherwise."""
    plans = []
    for group in GROUPS:
        values = configs[group].values
        mask = l3_mask(info.cbm, values["catRangeStartPercent"], values["catRangeEndPercent"])
        l3 = {i: mask for i in info.l3_ids}
        mb_v = mb_value(values["mbaPercent"], cpu.amd, info.mb_granularity)
        mb = {i: str(mb_v) for i in info.mb_ids}
        for i, m in l3.items():
            check_l3(m, info, f"group {group} L3 cache {i}")
        if mb:
            check_mb(mb_v, info, cpu.amd, f"group {group} MB")
        plans.append(GroupPlan(group, configs[group].enable, l3, mb))
    return plans


def pod_group(pod: PodMeta) -> str | None:
    """The group a pod's tasks belong to; None for SYSTEM pods (upstream leaves them)."""
    cls = pod_class(pod)
    return cls if cls in GROUPS else None


class ResctrlReconcile(Strategy):
    name = "ResctrlReconcile"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.reconcile_interval, RDT_RESCTRL)
        self.fs = ResctrlFS(ctx.config.sys_fs_root)
        self.mount: Mount = mount_resctrl
        self.last: list[GroupPlan] | None = None
        self._cpu: CPUInfo | None = None

    def supported(self) -> CPUInfo | None:
        """The CPU's RDT flags (read once: they do not change) and the mount, tried when the
        tree is not mounted (``resctrlfs.enable``), every tick."""
        ctx = self.ctx
        ok, why = enable(self.fs, ctx.config.proc_root, self.mount)
        if not ok:
            ctx.log_once(self.name + "/support", f"resctrl unavailable: {why}; nothing is done")
            return None
        if why:
            log.info("%s: %s", self.name, why)
        try:
            cpu = self._cpu = self._cpu or cpu_info(ctx.config.proc_root)
        except ResctrlError as exc:
            ctx.log_once(self.name + "/support", f"cannot tell whether the CPU has RDT: {exc}",
                         logging.WARNING)
            return None
        missing = [f for f in ("cat_l3", "mba") if f not in cpu.flags]
        if missing:
            ctx.log_once(self.name + "/support", f"resctrl unsupported: the CPU flags in "
                         f"{ctx.config.proc_root}/cpuinfo lack {' and '.join(missing)}; nothing is done")
            return None
        ctx.log_once(self.name + "/support", None)
        return cpu

    def run_once(self) -> None:
        ctx = self.ctx
        node_slo = ctx.node_slo(self.name)
        if node_slo is None:
            return
        cpu = self.supported()
        if cpu is None:
            return
        try:
            configs = node_slo.section(resctrl_classes)
            info = self.fs.info()
            plans = plan_groups(configs, info, cpu)
            created = self.fs.ensure_groups(GROUPS, info)
        except (SLOError, ResctrlError) as exc:
            ctx.log_once(self.name, f"skipped, nothing written: {exc}", logging.ERROR)
            return
        ctx.log_once(self.name, None)
        if created:
            log.info("%s: created resctrl groups %s under %s", self.name, ", ".join(created), self.fs.root)
        self.last = plans
        for plan in plans:
            lines = {"L3": plan.l3, **({"MB": plan.mb} if plan.mb else {})}
            try:
                if self.fs.write_schemata(plan.name, lines):
                    log.info("%s: group %s schemata %s", self.name, plan.name,
                             " ".join(f"{r}:{v}" for r, v in lines.items()))
            except ResctrlError as exc:
                ctx.log_once(self.name + "/write/" + plan.name, str(exc), logging.ERROR)
        self.add_tasks([p for p in plans if p.enable], ctx.informer.get_all_pods())

    def add_tasks(self, plans: Sequence[GroupPlan], pods: Sequence[PodMeta]) -> None:
        enabled = {p.name for p in plans}
        current: dict[str, set[int]] = {}
        for pod in pods:
            group = pod_group(pod)
            if not pod.running or group not in enabled or ANNOTATION_RESCTRL in pod.annotations:
                continue
            assert group is not None
            if group not in current:
                try:
                    current[group] = self.fs.tasks(group)
                except ResctrlError as exc:
                    self.ctx.log_once(self.name + "/tasks/" + group, str(exc), logging.ERROR)
                    continue
            new = [t for t in self.pod_tids(pod) if t not in current[group]]
            if not new:
                continue
            try:
                moved = self.fs.add_tasks(group, new)
            except OSError as exc:
                log.warning("%s: pod %s: adding %d tasks to group %s failed: %s", self.name, pod.key,
                            len(new), group, exc.strerror or exc)
                continue
            current[group].update(new)
            log.info("%s: pod %s: %d new tasks into group %s", self.name, pod.key, moved, group)

    def pod_tids(self, pod: PodMeta) -> list[int]:
        """Thread ids in the pod's container cgroups and its sandbox's (upstream reads the
        sandbox too, for VM-based runtimes). A cgroup gone meanwhile has none."""
        executor = self.ctx.executor
        dirs = [c.cgroup_dir for c in pod.containers if c.cgroup_dir]
        dirs += self.sandbox_dirs(pod)
        tids: list[int] = []
        for d in dirs:
            try:
                tids += [int(t) for t in executor.read(d, "tasks").split() if t.isdigit()]
            except CgroupError:
                continue
        return tids

    def sandbox_dirs(self, pod: PodMeta) -> list[str]:
        """The sandbox's cgroup: by its id when known; else, once every container has an id
        (before, a child could be a container's), the pod cgroup's children that are none of
        its containers'."""
        if not pod.cgroup_dir:
            return []
        if pod.sandbox_id:
            return [container_cgroup_dir(pod.cgroup_dir, pod.sandbox_id, driver_of_cgroup_parent(pod.cgroup_dir))]
        if not pod.containers or not all(c.cgroup_dir for c in pod.containers):
            return []
        known = {c.cgroup_dir.rstrip("/").rsplit("/", 1)[-1] for c in pod.containers}
        try:
            pod_path = self.ctx.executor.path(pod.cgroup_dir, "tasks", keep=False).parent
            children = [e.name for e in os.scandir(pod_path) if e.is_dir(follow_symlinks=False)]
        except (CgroupError, OSError):
            return []
        return [f"{pod.cgroup_dir.rstrip('/')}/{name}" for name in sorted(children) if name not in known]
