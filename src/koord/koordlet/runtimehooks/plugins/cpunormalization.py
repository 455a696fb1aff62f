"""CPUNormalization: shrinks cfs quotas on nodes whose cpus are faster than the reference.

A node annotated with ratio r > 1 advertises r times more cpu than it has threads, so a
quota granted in those "normalized" cpus is scaled back by 1/r. Pods bound to cpus
(a resource-status cpuset) are exempt: they own whole cpus, not a share of time.
The arithmetic is exact (Fraction), so 120000 at 1.2 gives 100000, not 100001.
"""

from __future__ import annotations

import logging
import math
from fractions import Fraction

from ..hooks import Hooks, RuntimePlugin, Stage
from ..protocol import ContainerContext, HookContext, KoordQoS, PodContext
from .cpuset import resource_status_cpuset

log = logging.getLogger(__name__)


def normalized_quota(quota: int, ratio: float) -> int:
    return math.ceil(Fraction(quota) / Fraction(str(ratio)))


class CPUNormalization(RuntimePlugin):
    name = "CPUNormalization"

    def register(self, hooks: Hooks) -> None:
        description = "scale cfs quota by the node's cpu normalization ratio"
        hooks.register(Stage.PRE_RUN_POD_SANDBOX, self.name, description + " (pod)", self.adjust_quota)
        for stage in (Stage.PRE_CREATE_CONTAINER, Stage.PRE_UPDATE_CONTAINER_RESOURCES):
            hooks.register(stage, self.name, description, self.adjust_quota)

    def adjust_quota(self, ctx: HookContext) -> None:
        ratio = self.rules.cpu_normalization_ratio if self.rules else None
        if ratio is None or ratio <= 1.0:
            return
        if isinstance(ctx, PodContext):
            req = ctx.request
            qos, annotations, who = req.koord_qos, req.annotations, f"pod {req.meta}"
        else:
            assert isinstance(ctx, ContainerContext)
            req = ctx.request
            qos, annotations = req.koord_qos, req.pod_annotations
            who = f"pod {req.pod_meta} container {req.container_name}"
        if qos not in (KoordQoS.LS, KoordQoS.NONE):
            return
        if resource_status_cpuset(annotations) is not None:
            return
        res = ctx.response.resources
        quota = res.cpu_quota if res.cpu_quota is not None else ctx.request.resources.cpu_quota
        if quota is None or quota <= 0:
            return
        res.cpu_quota = normalized_quota(quota, ratio)
        log.debug("plugin %s: %s: quota %d -> %d at ratio %s", self.name, who, quota, res.cpu_quota, ratio)
