"""Resctrl: per-pod LLC (cache ways) and memory-bandwidth isolation through Linux resctrl.

Pod annotation ``node.koordinator.sh/resctrl`` (upstream's format; keys are matched
case-insensitively because older upstream releases used "LLC"/"MB"):

    {"llc": {"schemata": {"range": [20, 80]},
             "schemataPerCache": [{"cacheID": 1, "range": [0, 50]}]},
     "mb":  {"schemata": {"percent": 20},
             "schemataPerCache": [{"cacheID": 1, "percent": 50}]}}

``range`` is [start%, end%) of the cache ways, turned into a contiguous bit mask of the
root's ``info/L3/cbm_mask`` as upstream does (cbm 0x3ff, [10, 80] -> 0xfe); ``percent`` is
the memory-bandwidth share. ``schemata`` applies to every cache id found in the root
``schemata``; ``schemataPerCache`` overrides single ids.

Lifecycle: PreRunPodSandbox creates group ``koordlet-<podUID>`` and writes its schemata;
PreCreateContainer (re-)ensures the group and names it as the container's RDT class, which
NRI hands to the runtime so the container starts in it (the proxy's protocol has no such
field); PostStartContainer (re-)ensures the group and moves the container's threads into it;
PostStopPodSandbox removes the group. These are file-system side effects by nature: the
group must exist before the container's threads can join it. Each reconciler round (in
Standalone mode too) does the same for every running pod (``reconcile_pods``): the group and
its schemata, the new threads of its containers and of its sandbox; and, when the round
listed every pod, removes the ``koordlet-*`` groups of pods no longer running or no longer
annotated, so groups left by a koordlet that was down when their pods went are removed at
its first round.

Support is decided at first use, as upstream's registration does: a mounted tree is used;
else the CPU must list ``cat_l3`` and ``mba``, and resctrl is mounted
(``resctrlfs.enable``). Where it cannot be, one line says why and nothing is done.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from koord.apis.extension import ANNOTATION_RESCTRL
from koord.hookapi import HookPoint, json_annotation, json_object

from ... import resctrlfs
from ...resourceexecutor.executor import CgroupError
from ..hooks import HookError, Hooks, InvalidInput, RunningPod, RuntimePlugin
from ..protocol import ContainerContext, PodContext

log = logging.getLogger(__name__)

_object = partial(json_object, error=InvalidInput)

GROUP_PREFIX = "koordlet-"


@dataclass(frozen=True)
class ResctrlConfig:
    """Per resource: cache id (None = every id) -> L3 [start%, end%] range or MB percent."""

    llc: dict[int | None, tuple[int, int]] = field(default_factory=dict)
    mb: dict[int | None, int] = field(default_factory=dict)


def _get(obj: dict, key: str) -> object:
    for k, v in obj.items():
        if k.lower() == key.lower():
            return v
    return None


def _range(value: object, where: str) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 0 <= value[0] < value[1] <= 100):
        raise InvalidInput(f"{where}.range={value!r}: want [start, end] with 0 <= start < end <= 100")
    return value[0], value[1]


def _percent(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 100:
        raise InvalidInput(f"{where}.percent={value!r}: want an integer in (0, 100]")
    return value


def parse_resctrl(text: str) -> ResctrlConfig:
    where = f"pod annotation {ANNOTATION_RESCTRL}"
    # The shared reader bounds size and nesting like every other annotation.
    raw = _object(json_annotation({ANNOTATION_RESCTRL: text}, ANNOTATION_RESCTRL, error=InvalidInput), where)
    config = ResctrlConfig()
    _per_cache(raw, "llc", "range", where, config.llc, _range)
    _per_cache(raw, "mb", "percent", where, config.mb, _percent)
    return config


_V = TypeVar("_V")


def _per_cache(raw: dict, key: str, value_key: str, where: str, target: dict[int | None, _V],
               parse: Callable[[object, str], _V]) -> None:
    """One resource's values: ``schemata`` for every cache id (key None), ``schemataPerCache`` per id."""
    section = _object(_get(raw, key), f"{where}: {key}")
    schemata = _object(_get(section, "schemata"), f"{where}: {key}.schemata")
    if _get(schemata, value_key) is not None:
        target[None] = parse(_get(schemata, value_key), f"{where}: {key}.schemata")
    per_cache = _get(section, "schemataPerCache") or []
    if not isinstance(per_cache, list):
        raise InvalidInput(f"{where}: {key}.schemataPerCache: want a list")
    for i, item in enumerate(per_cache):
        at = f"{where}: {key}.schemataPerCache[{i}]"
        item = _object(item, at)
        cache_id = _get(item, "cacheID")
        if isinstance(cache_id, bool) or not isinstance(cache_id, int) or cache_id < 0:
            raise InvalidInput(f"{at}.cacheID={cache_id!r}: want a non-negative integer")
        target[cache_id] = parse(_get(item, value_key), at)


def l3_mask(cbm: int, start: int, end: int) -> str:
    """The shared way-mask calculation, its refusals as this plugin's errors."""
    try:
        return resctrlfs.l3_mask(cbm, start, end)
    except resctrlfs.ResctrlError as exc:
        raise HookError(str(exc)) from None


def _root_ids(schemata: str, resource: str) -> list[int]:
    """Cache/domain ids of one resource line of the root schemata ("L3:0=fff;1=fff")."""
    try:
        return sorted(resctrlfs.parse_schemata(schemata).get(resource, {}))
    except resctrlfs.ResctrlError as exc:
        raise HookError(f"root schemata: {exc}") from None


class Resctrl(RuntimePlugin):
    name = "Resctrl"

    _support: bool | None = None
    mount: resctrlfs.Mount = staticmethod(resctrlfs.mount_resctrl)

    @property
    def root(self) -> Path:
        return self.env.sys_fs_root / "resctrl"

    def group_dir(self, pod_uid: str) -> Path:
        if not pod_uid or "/" in pod_uid or pod_uid.startswith("."):
            raise HookError(f"bad pod uid {pod_uid!r} for a resctrl group")
        return self.root / f"{GROUP_PREFIX}{pod_uid}"

    def register(self, hooks: Hooks) -> None:
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "create pod resctrl group", self.create_group)
        hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, self.name,
                                 "name pod resctrl group as the container's RDT class", self.set_rdt_class)
        hooks.register_container(HookPoint.POST_START_CONTAINER, self.name,
                                 "add container tasks to pod resctrl group", self.add_tasks)
        hooks.register_pod(HookPoint.POST_STOP_POD_SANDBOX, self.name, "remove pod resctrl group", self.remove_group)

    def supported(self) -> bool:
        """Decided once (mounting it if need be); a tree that went away later is unsupported."""
        if self._support is None:
            ok, why = resctrlfs.enable(resctrlfs.ResctrlFS(self.env.sys_fs_root), self.env.proc_root, self.mount)
            self._support = ok
            if ok and why:
                log.info("plugin %s: %s", self.name, why)
            elif not ok:
                log.info("plugin %s: resctrl unavailable: %s; doing nothing", self.name, why)
        return self._support and (self.root / "schemata").is_file()

    def schemata_lines(self, config: ResctrlConfig) -> list[str]:
        root_schemata = (self.root / "schemata").read_text()
        lines = []
        if config.llc:
            cbm_path = self.root / "info" / "L3" / "cbm_mask"
            try:
                cbm = int(cbm_path.read_text().strip(), 16)
            except (OSError, ValueError) as exc:
                raise HookError(f"LLC isolation asked for but {cbm_path} is unusable: {exc}") from None
            ids = _root_ids(root_schemata, "L3")
            masks = {i: l3_mask(cbm, *config.llc[i if i in config.llc else None])
                     for i in ids if i in config.llc or None in config.llc}
            if masks:
                lines.append("L3:" + ";".join(f"{i}={m}" for i, m in sorted(masks.items())))
        if config.mb:
            ids = _root_ids(root_schemata, "MB")
            percents = {i: config.mb[i if i in config.mb else None]
                        for i in ids if i in config.mb or None in config.mb}
            if percents:
                lines.append("MB:" + ";".join(f"{i}={p}" for i, p in sorted(percents.items())))
        return lines

    def ensure_group(self, pod_uid: str, annotation: str, who: str) -> Path:
        config = parse_resctrl(annotation)
        group = self.group_dir(pod_uid)
        lines = self.schemata_lines(config)
        created = not group.is_dir()
        group.mkdir(exist_ok=True)
        if lines:
            # The kernel parses each line of one write; unnamed resources keep the root values.
            (group / "schemata").write_text("\n".join(lines) + "\n")
        log.log(logging.INFO if created else logging.DEBUG, "plugin %s: %s: resctrl group %s schemata %s",
                self.name, who, group.name, lines)
        return group

    def create_group(self, ctx: PodContext) -> None:
        req = ctx.request
        annotation = req.annotations.get(ANNOTATION_RESCTRL)
        if not annotation or not self.supported():
            return
        try:
            self.ensure_group(req.meta.uid, annotation, f"pod {req.meta}")
        except OSError as exc:
            raise HookError(f"resctrl group of pod uid {req.meta.uid}: {exc}") from None

    def set_rdt_class(self, ctx: ContainerContext) -> None:
        """The group must exist before the runtime can put the container in it."""
        req = ctx.request
        annotation = req.pod_annotations.get(ANNOTATION_RESCTRL)
        if not annotation or not self.supported():
            return
        who = f"pod {req.pod_meta} container {req.container_name}"
        try:
            group = self.ensure_group(req.pod_meta.uid, annotation, who)
        except OSError as exc:
            raise HookError(f"resctrl group of pod uid {req.pod_meta.uid}: {exc}") from None
        ctx.response.rdt_class = group.name

    def add_tasks(self, ctx: ContainerContext) -> None:
        req = ctx.request
        annotation = req.pod_annotations.get(ANNOTATION_RESCTRL)
        if not annotation or not self.supported():
            return
        who = f"pod {req.pod_meta} container {req.container_name}"
        executor = self.env.executor
        try:
            group = self.ensure_group(req.pod_meta.uid, annotation, who)
            cgroup = executor.container_dir(req.pod_cgroup_parent, req.container_id)
            tids = executor.read(cgroup, "tasks").split()
            moved = resctrlfs.write_tasks(group / "tasks", tids)
        except (CgroupError, OSError) as exc:
            raise HookError(f"resctrl tasks of container {req.container_id}: {exc}") from None
        log.info("plugin %s: %s: moved %d of %d tasks into %s", self.name, who, moved, len(tids), group.name)

    def remove_group(self, ctx: PodContext) -> None:
        req = ctx.request
        group = self.group_dir(req.meta.uid)
        if group.is_dir():
            self._remove(group)
            log.info("plugin %s: pod %s: removed resctrl group %s", self.name, req.meta, group.name)

    @staticmethod
    def _remove(group: Path) -> None:
        try:
            os.rmdir(group)
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise HookError(f"remove {group}: {exc.strerror}") from None
            # The kernel's resctrl rmdir drops its control files itself; a plain directory
            # (a tree not mounted as resctrl) needs them removed first.
            for child in group.iterdir():
                child.unlink()
            os.rmdir(group)

    def reconcile_pods(self, pods: list[RunningPod], complete: bool) -> list[str]:
        """Groups and tasks of the running annotated pods (containers' and sandbox's threads,
        as upstream's pod-level task reconciler); with a complete list, the groups of pods
        gone removed."""
        annotated = [p for p in pods if p.annotations.get(ANNOTATION_RESCTRL)]
        if not (annotated or complete) or not self.supported():
            return []
        problems = []
        for pod in annotated:
            who = f"pod {pod.meta}"
            try:
                group = self.ensure_group(pod.meta.uid, pod.annotations[ANNOTATION_RESCTRL], who)
                self._move_pod_tasks(group, pod, who)
            except (HookError, OSError, resctrlfs.ResctrlError) as exc:
                problems.append(f"{who}: resctrl group: {exc}")
        if complete:
            problems += self._remove_orphans({p.meta.uid for p in annotated})
        return problems

    def _move_pod_tasks(self, group: Path, pod: RunningPod, who: str) -> None:
        executor = self.env.executor
        present = resctrlfs.ResctrlFS(self.env.sys_fs_root).tasks(group.name)
        new: list[str] = []
        for cid in (*pod.container_ids, pod.sandbox_id):
            try:
                tids = executor.read(executor.container_dir(pod.cgroup_parent, cid), "tasks").split()
            except CgroupError as exc:
                if executor.gone(exc):
                    continue  # exited since the list
                raise HookError(f"tasks of {cid[:12]}: {exc}") from None
            new += [t for t in tids if t.isdigit() and int(t) not in present]
        if new:
            moved = resctrlfs.write_tasks(group / "tasks", new)
            log.info("plugin %s: %s: moved %d new tasks of its containers and sandbox into %s",
                     self.name, who, moved, group.name)

    def _remove_orphans(self, keep: set[str]) -> list[str]:
        problems = []
        for entry in sorted(self.root.iterdir()):
            uid = entry.name.removeprefix(GROUP_PREFIX)
            if entry.name == uid or uid in keep or not entry.is_dir() or entry.is_symlink():
                continue
            try:
                self._remove(entry)
            except (HookError, OSError) as exc:
                problems.append(f"pod uid {uid}: remove resctrl group: {exc}")
                continue
            log.info("plugin %s: removed resctrl group %s: pod uid %s is not running with %s",
                     self.name, entry.name, uid, ANNOTATION_RESCTRL)
        return problems
