"""Host applications NodeSLO declares (``spec.hostApplications``): CPU and memory of their
cgroups, as for pods (their dirs: ``slo.HostApp``). Their totals (zero without applications,
or without NodeSLO) go to the shared state, so the system collector never waits on them, and
so does each app's usage once it has a CPU rate, for upstream's
``koordlet_host_application_resource_usage`` gauge (``metricsadvisor.gauges``).
"""

from __future__ import annotations

import logging

from ...metriccache import Samples
from ...metriccache import kinds as k
from ...slo import HostApp
from ..framework import Collector, Env, HostAppRow, Point, Rates
from ..parsers import FileProblem, cgroup_cpu_ns, parse_memory_stat


class HostApplicationCollector(Collector):
    name = "HostApplication"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems)

    def app_dir(self, app: HostApp) -> str:
        """The app's cgroup dir: its ``rel`` under kubelet's dir of its base, or the root."""
        base = "" if app.base is None else self.env.kube_qos_dir(app.base)
        return "/".join(p for p in (base, app.rel) if p)

    def apps(self) -> tuple[HostApp, ...]:
        """The host applications of the NodeSLO (the states informer parsed them once)."""
        node_slo = self.env.pods.get_node_slo()
        return () if node_slo is None else node_slo.host_apps

    def collect(self, now: float) -> Samples:
        out = Samples(now)
        total_cpu = total_mem = 0.0
        usage: list[HostAppRow] = []
        version = self.env.cgroups.version
        for app in self.apps():
            cgroup_dir = self.app_dir(app)
            name = app.name
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
                usage.append((name, app.priority, app.qos, rate / 1e9, memory))
        self.rates.prune(now)
        self.env.shared.set_host_apps(Point(total_cpu, total_mem, now))
        self.env.shared.host_app_usage = tuple(usage)
        return out
