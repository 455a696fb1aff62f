"""NodeSLO's host applications (``spec.hostApplications``, parsed by ``slo.parse_host_apps``)
as the runtime hooks see them: processes outside Kubernetes in cgroups of their own, which
plugins may give values to as they give pods (upstream's host-application reconciler;
CPUSetAllocator: the share pools).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..resourceexecutor.executor import CgroupExecutor, cgroup_dir_exists
from ..resources import Resources
from ..slo import HostApp, SLOError, parse_host_apps
from .protocol import CgroupUpdate
from .rule import Rule, RuleError, Source

log = logging.getLogger(__name__)


def _host_apps_rule(spec: dict[str, Any]) -> tuple[HostApp, ...]:
    try:
        return parse_host_apps(spec)
    except SLOError as exc:
        raise RuleError(str(exc)) from None


HOST_APPS: Rule[tuple[HostApp, ...]] = Rule("hostApplications", Source.NODE_SLO, _host_apps_rule, absent=())
"""NodeSLO's ``hostApplications``: read by the reconciler, so parsed whatever plugins run."""


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
