"""Host applications NodeSLO declares (``spec.hostApplications``): CPU and memory of their
cgroups, as for pods. The dir is ``cgroupPath`` (base + parentDir + relativePath) when given,
else ``host-latency-sensitive/<name>`` for LS classes and ``host-best-effort/<name>`` for BE.
Their totals (zero without applications, or without NodeSLO) go to the shared state, so the
system collector never waits on them, and so does each app's usage once it has a CPU rate, for
upstream's ``koordlet_host_application_resource_usage`` gauge (``metricsadvisor.gauges``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...metriccache import Samples
from ...metriccache import kinds as k
from ..framework import Collector, Env, HostAppRow, Point, Rates
from ..parsers import FileProblem, cgroup_cpu_ns, parse_memory_stat

_BASES = {"CgroupRoot": None, "Kubepods": "guaranteed", "KubepodsBurstable": "burstable",
          "KubepodsBesteffort": "besteffort"}


class HostApplicationCollector(Collector):
    name = "HostApplication"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems)

    def app_dir(self, app: Mapping[str, Any]) -> str:
        """The app's cgroup dir; ValueError when the NodeSLO entry is malformed."""
        name = app.get("name")
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad name {name!r}")
        path = app.get("cgroupPath")
        if path is None:
            qos = app.get("qos") or "LS"
            return f"{'host-best-effort' if qos == 'BE' else 'host-latency-sensitive'}/{name}"
        if not isinstance(path, Mapping):
            raise ValueError(f"cgroupPath {path!r}: want an object")
        base = path.get("base") or "CgroupRoot"
        if base not in _BASES:
            raise ValueError(f"cgroupPath.base {base!r}: want one of {', '.join(_BASES)}")
        qos_class = _BASES[base]
        parts = [] if qos_class is None else [self.env.kube_qos_dir(qos_class)]
        for key in ("parentDir", "relativePath"):
            value = path.get(key) or ""
            if not isinstance(value, str) or ".." in value.split("/"):
                raise ValueError(f"cgroupPath.{key} {value!r}")
            parts.append(value.strip("/"))
        rel = "/".join(p for p in parts if p)
        if not rel:
            raise ValueError("cgroupPath names no dir")
        return rel

    def apps(self) -> list[Mapping[str, Any]]:
        """``spec.hostApplications`` of the NodeSLO (a dict, or an object with a ``spec``)."""
        slo = self.env.pods.get_node_slo()
        spec = slo.get("spec", slo) if isinstance(slo, Mapping) else getattr(slo, "spec", None)
        if isinstance(spec, Mapping):
            apps = spec.get("hostApplications")
        else:
            apps = getattr(spec, "host_applications", None) or getattr(spec, "hostApplications", None)
        if not isinstance(apps, list):
            return []
        return [a for a in apps if isinstance(a, Mapping)]

    def collect(self, now: float) -> Samples:
        out = Samples(now)
        total_cpu = total_mem = 0.0
        usage: list[HostAppRow] = []
        version = self.env.cgroups.version
        for app in self.apps():
            try:
                cgroup_dir = self.app_dir(app)
            except ValueError as exc:
                self.problems.say(("slo", repr(app)[:200]), "NodeSLO hostApplications entry %r: %s; skipped",
                                     dict(app), exc)
                continue
            name = str(app["name"])
            labels = {k.HOST_APP_NAME: name}
            try:
                ns = self.env.read_cgroup(cgroup_dir, "cpuacct_usage", lambda t: cgroup_cpu_ns(t, version))
                memory, with_cache = self.env.read_cgroup(cgroup_dir, "memory_stat",
                                                          lambda t: parse_memory_stat(t, version))
            except FileProblem as exc:
                self.problems.say(("app", name, exc.reason), "host application %s: %s; no sample", name, exc,
                                     level=logging.INFO if exc.missing else logging.WARNING)
                continue
            out.add(k.HOST_APPLICATION_MEMORY_USAGE, labels, memory)
            out.add(k.HOST_APPLICATION_MEMORY_USAGE_WITH_PAGE_CACHE, labels, with_cache)
            total_mem += memory
            rate = self.rates.rate(name, ns, now, f"host application {name}: CPU time")
            if rate is not None:
                out.add(k.HOST_APPLICATION_CPU_USAGE, labels, rate / 1e9)
                total_cpu += rate / 1e9
                usage.append((name, str(app.get("priority") or ""), str(app.get("qos") or ""), rate / 1e9, memory))
        self.rates.prune(now)
        self.env.shared.set_host_apps(Point(total_cpu, total_mem, now))
        self.env.shared.host_app_usage = tuple(usage)
        return out
