"""System usage: what the node uses beyond its pods and host applications.

sys = max(node - sum(pods of every pod collector) - host applications, 0), from the shared
latest points, each younger than ``--collect-sys-metric-outdated-interval``; a missing or
stale input gives no sample (a wrong number would be worse).
"""

from __future__ import annotations

import logging

from ...metriccache import Samples
from ...metriccache import kinds as k
from ..framework import Collector


class SystemResourceCollector(Collector):
    name = "SystemResource"

    def collect(self, now: float) -> Samples:
        node, pods, host_apps = self.env.shared.snapshot()
        outdated = self.env.config.collect_sys_metric_outdated_interval
        inputs = {"node": node, "host applications": host_apps, **{f"pods ({n})": p for n, p in pods.items()}}
        if not pods:
            inputs["pods"] = None
        for what, point in inputs.items():
            if point is None or now - point.timestamp > outdated:
                self.problems.say(("stale", what), "no recent %s usage (within %.0fs); no system usage",
                                     what, outdated, level=logging.INFO)
                return Samples(now)
            self.problems.clear(("stale", what))
        assert node is not None and host_apps is not None
        cpu = node.cpu - sum(p.cpu for p in pods.values()) - host_apps.cpu
        memory = node.memory - sum(p.memory for p in pods.values()) - host_apps.memory
        out = Samples(now)
        out.add(k.SYS_CPU_USAGE, {}, max(cpu, 0.0))
        out.add(k.SYS_MEMORY_USAGE, {}, max(memory, 0.0))
        return out
