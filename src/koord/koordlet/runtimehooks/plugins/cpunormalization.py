"""CPUNormalization: shrinks cfs quotas on nodes whose cpus are faster than the reference.

A node annotated with ratio r > 1 advertises r times more cpu than it has threads, so a
quota granted in those "normalized" cpus is scaled back by 1/r. Pods bound to cpus
(a resource-status cpuset) are exempt: they own whole cpus, not a share of time.
The arithmetic is exact (Fraction), so 120000 at 1.2 gives 100000, not 100001.

The unscaled quota is recorded in an annotation (``ANNOTATION_CPU_NORMALIZATION_BASE_QUOTA``) that travels
with the pod or container into containerd's stored config.  The reconciler rebuilds
requests from that config, whose quota is already scaled; a quota equal to the scaled
recorded base is recognised as such and not scaled twice.
"""

from __future__ import annotations

import logging
import math
import re
from fractions import Fraction

from koord import cgrouplimits
from koord.apis.extension import ANNOTATION_CPU_NORMALIZATION_BASE_QUOTA, ANNOTATION_CPU_NORMALIZATION_RATIO
from koord.hookapi import HookPoint

from ...resources import KoordQoS, Resources
from ..hooks import Hooks, RuntimePlugin
from ..protocol import ContainerContext, PodContext
from ..rule import Rule, RuleError, Source
from .cpuset import resource_status_cpuset

log = logging.getLogger(__name__)

_RATIO = re.compile(r"[0-9]{1,10}(\.[0-9]{1,10})?")


def parse_ratio(annotations: dict[str, str]) -> float | None:
    """The Node's ``node.koordinator.sh/cpu-normalization-ratio``; None without one."""
    text = annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO)
    if text is None or text == "":
        return None
    where = f"node annotation {ANNOTATION_CPU_NORMALIZATION_RATIO}"
    # float() also takes other scripts' digits and "1_2"; Go's ParseFloat, which wrote it, does not.
    if not isinstance(text, str) or not _RATIO.fullmatch(text):
        raise RuleError(f"{where}={text!r}: not a decimal number like 1.2")
    ratio = float(text)
    if not math.isfinite(ratio) or ratio < 1.0:
        # Below 1 would inflate quotas beyond what the scheduler granted.
        raise RuleError(f"{where}={text!r}: want a finite ratio >= 1.0")
    return ratio


CPU_NORMALIZATION_RATIO: Rule[float | None] = Rule("cpuNormalizationRatio", Source.NODE, parse_ratio, absent=None)


def normalized_quota(quota: int, ratio: float) -> int:
    """Never below the 1 ms the kernel accepts as a cfs quota."""
    return max(cgrouplimits.MIN_CFS_QUOTA_US, math.ceil(Fraction(quota) / Fraction(str(ratio))))


class CPUNormalization(RuntimePlugin):
    name = "CPUNormalization"
    answers_from_request_and_rules = True
    rules_read = (CPU_NORMALIZATION_RATIO,)

    def register(self, hooks: Hooks) -> None:
        description = "scale cfs quota by the node's cpu normalization ratio"
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, description + " (pod)", self.adjust_pod_quota)
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
            hooks.register_container(stage, self.name, description, self.adjust_container_quota)

    def adjust_pod_quota(self, ctx: PodContext) -> None:
        req = ctx.request
        self._adjust(req.koord_qos, req.annotations, req.annotations, req.resources, ctx.response.annotations,
                     ctx.response.resources, f"pod {req.meta}")

    def adjust_container_quota(self, ctx: ContainerContext) -> None:
        req = ctx.request
        self._adjust(req.koord_qos, req.pod_annotations, req.container_annotations, req.resources,
                     ctx.response.annotations, ctx.response.resources,
                     f"pod {req.pod_meta} container {req.container_name}")

    def _adjust(self, qos: KoordQoS, pod_annotations: dict[str, str], own_annotations: dict[str, str],
                requested: Resources, answer_annotations: dict[str, str], res: Resources, who: str) -> None:
        """``own_annotations`` are the pod's or the container's own, where the unscaled quota is recorded."""
        ratio = self.rules[CPU_NORMALIZATION_RATIO] if self.rules else None
        if ratio is None or ratio <= 1.0:
            return
        if qos not in (KoordQoS.LS, KoordQoS.NONE):
            return
        if resource_status_cpuset(pod_annotations) is not None:
            return
        quota = res.cpu_quota if res.cpu_quota is not None else requested.cpu_quota
        if quota is None or quota <= 0:
            return
        base = _recorded_base(own_annotations)
        if base is not None and normalized_quota(base, ratio) == quota:
            quota = base  # already scaled when it was created: scale the original again, not twice
        res.cpu_quota = normalized_quota(quota, ratio)
        answer_annotations[ANNOTATION_CPU_NORMALIZATION_BASE_QUOTA] = str(quota)
        log.debug("plugin %s: %s: quota %d -> %d at ratio %s", self.name, who, quota, res.cpu_quota, ratio)

def _recorded_base(annotations: dict[str, str]) -> int | None:
    text = annotations.get(ANNOTATION_CPU_NORMALIZATION_BASE_QUOTA, "")
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None
