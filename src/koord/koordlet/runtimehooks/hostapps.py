"""NodeSLO's host applications (``spec.hostApplications``) as the runtime hooks see them:
processes outside Kubernetes in cgroups of their own, which plugins may give values to as
they give pods (upstream's host-application reconciler; CPUSetAllocator: the share pools).

The cgroup dir follows upstream: ``cgroupPath`` (its ``base`` — the cgroup root, or
kubelet's guaranteed, burstable or besteffort dir — then ``parentDir`` and
``relativePath``) when given, else ``host-latency-sensitive/<name>`` for LSE/LSR/LS,
``host-best-effort/<name>`` for BE, ``<name>`` at the root for any other class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..resourceexecutor.executor import CgroupExecutor, cgroup_dir_exists
from ..resources import KubeQoS, Resources
from .protocol import CgroupUpdate
from .rule import Rule, RuleError, Source

log = logging.getLogger(__name__)

MAX_HOST_APPS = 256
_BASES: dict[str, KubeQoS | None] = {"CgroupRoot": None, "Kubepods": KubeQoS.GUARANTEED,
                                     "KubepodsBurstable": KubeQoS.BURSTABLE,
                                     "KubepodsBesteffort": KubeQoS.BESTEFFORT}
_LS_CLASSES = ("LSE", "LSR", "LS")


class HostAppError(ValueError):
    """A NodeSLO host application entry is malformed; names the entry and field."""


@dataclass(frozen=True)
class HostApp:
    name: str
    qos: str
    base: KubeQoS | None
    """kubelet's dir of this kube QoS class holds ``rel``; None: the cgroup root does."""
    rel: str


def parse_host_apps(node_slo: dict | None) -> tuple[HostApp, ...]:
    """The NodeSLO's host applications; HostAppError naming the entry and field when malformed."""
    if not isinstance(node_slo, dict):
        return ()
    spec = node_slo.get("spec", node_slo)
    apps = spec.get("hostApplications") if isinstance(spec, dict) else None
    if apps is None:
        return ()
    where = "NodeSLO spec.hostApplications"
    if not isinstance(apps, list) or len(apps) > MAX_HOST_APPS:
        raise HostAppError(f"{where}: want a list of at most {MAX_HOST_APPS} objects")
    return tuple(_host_app(app, f"{where}[{i}]") for i, app in enumerate(apps))


def _host_apps_rule(spec: dict[str, Any]) -> tuple[HostApp, ...]:
    try:
        return parse_host_apps(spec)
    except HostAppError as exc:
        raise RuleError(str(exc)) from None


HOST_APPS: Rule[tuple[HostApp, ...]] = Rule("hostApplications", Source.NODE_SLO, _host_apps_rule, absent=())
"""NodeSLO's ``hostApplications``: read by the reconciler, so parsed whatever plugins run."""


def _segment(value: Any, where: str, *, many: bool) -> str:
    """A path inside the cgroup tree: no ``..``, no NUL; one name unless ``many``."""
    if not isinstance(value, str) or len(value) > 1024 or "\x00" in value:
        raise HostAppError(f"{where}={value!r:.60}: want a cgroup path")
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") for p in parts) or (not many and len(parts) != 1):
        raise HostAppError(f"{where}={value!r:.60}: want {'a relative path' if many else 'one name'} "
                        "inside the cgroup tree")
    return "/".join(parts)


def _host_app(app: Any, where: str) -> HostApp:
    if not isinstance(app, dict):
        raise HostAppError(f"{where}: want an object")
    name = _segment(app.get("name"), f"{where}.name", many=False)
    qos = app.get("qos") or ""
    if not isinstance(qos, str):
        raise HostAppError(f"{where}.qos={qos!r:.40}: want a QoS class name")
    path = app.get("cgroupPath")
    if path is None:
        top = "host-latency-sensitive" if qos in _LS_CLASSES else "host-best-effort" if qos == "BE" else ""
        return HostApp(name, qos, None, f"{top}/{name}" if top else name)
    if not isinstance(path, dict):
        raise HostAppError(f"{where}.cgroupPath: want an object")
    base = path.get("base") or "CgroupRoot"
    if base not in _BASES:
        raise HostAppError(f"{where}.cgroupPath.base={base!r:.40}: want one of {', '.join(_BASES)}")
    parts = [_segment(path.get(key) or "", f"{where}.cgroupPath.{key}", many=True)
             for key in ("parentDir", "relativePath")]
    rel = "/".join(p for p in parts if p)
    if not rel and _BASES[base] is None:
        raise HostAppError(f"{where}.cgroupPath names the cgroup root itself")
    return HostApp(name, qos, _BASES[base], rel)


def host_app_updates(apps: Iterable[HostApp], providers: Iterable[Callable[[HostApp], Resources | None]],
                     executor: CgroupExecutor) -> list[tuple[str, CgroupUpdate]]:
    """For each host application whose cgroup exists (its owner makes it): what the
    ``providers`` (plugins' ``host_app_resources``) give it, merged, named for log lines."""
    providers = list(providers)
    updates = []
    for app in apps:
        merged = Resources()
        for provide in providers:
            res = provide(app)
            if res is not None:
                merged.update(res)
        if merged.is_empty():
            continue
        base = executor.kube_qos_dir(app.base) if app.base is not None else ""
        cgroup_dir = "/".join(p for p in (base, app.rel) if p)
        if cgroup_dir_exists(executor, cgroup_dir, merged):
            updates.append((f"host application {app.name}", CgroupUpdate(cgroup_dir, merged)))
        else:
            log.debug("host application %s: no cgroup %s", app.name, cgroup_dir)
    return updates
