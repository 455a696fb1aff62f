"""BatchResource: gives BE pods the cgroup limits of their batch resources.

BE pods request ``kubernetes.io/batch-cpu`` / ``kubernetes.io/batch-memory`` (extended
resources kubelet knows nothing about), so kubelet creates them as BestEffort with no
limits. The scheduler writes the real amounts into ``node.koordinator.sh/extended-resource-spec``
and this plugin turns them into shares, cfs quota and memory limit.

The quota follows two node-wide rules: it is -1 while BE CPU suppress works by cfs quota
(``BATCH_CFS_QUOTA``; a pod's own quota would stop the besteffort quota from going
lower), and it is scaled by the node's cpu normalization ratio, as LS quotas are.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koord import cgrouplimits
from koord.apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, BATCH_CPU, BATCH_MEMORY
from koord.hookapi import HookPoint, json_annotation, parse_quantity

from ...resources import KoordQoS, KubeQoS, Resources
from ...slo import CFS_QUOTA_POLICY, SLOError, threshold_config
from ..hooks import Hooks, InvalidInput, RuntimePlugin
from ..protocol import ContainerContext, PodContext
from ..rule import Rule, RuleError, Source
from .cpunormalization import CPU_NORMALIZATION_RATIO, normalized_quota

log = logging.getLogger(__name__)

DEFAULT_CFS_PERIOD = 100000
MIN_SHARES = cgrouplimits.MIN_SHARES
MAX_SHARES = cgrouplimits.MAX_SHARES
MIN_QUOTA = cgrouplimits.MIN_CFS_QUOTA_US  # the kernel refuses a cfs quota below 1ms
MAX_MILLI_CPU = cgrouplimits.MAX_CFS_QUOTA_US * 1000 // cgrouplimits.MAX_CFS_PERIOD_US
"""The largest batch-cpu whose quota fits the kernel at any period (~17.6 million cores)."""

@dataclass(frozen=True)
class BatchSpec:
    """One container's batch amounts; None means not requested / not limited."""

    cpu_request_milli: int | None = None
    cpu_limit_milli: int | None = None
    memory_limit: int | None = None


def _milli_cpu(value: object, where: str) -> int:
    """batch-cpu is counted in milli-cores already: "500" means half a core."""
    try:
        number = parse_quantity(value)
    except ValueError as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    if number.denominator != 1 or number < 0:
        raise InvalidInput(f"{where}={value!r}: want a non-negative whole number of milli-cores")
    if number > MAX_MILLI_CPU:
        raise InvalidInput(f"{where}={value!r}: above {MAX_MILLI_CPU} milli-cores, "
                           "no cfs quota the kernel accepts can express it")
    return int(number)


def _bytes(value: object, where: str) -> int:
    try:
        number = parse_quantity(value)
    except ValueError as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    if number <= 0:
        raise InvalidInput(f"{where}={value!r}: want a positive memory amount")
    if number > cgrouplimits.MAX_MEMORY_BYTES:
        raise InvalidInput(f"{where}={value!r}: above the kernel's largest memory limit "
                           f"({cgrouplimits.MAX_MEMORY_BYTES} bytes)")
    return math.ceil(number)


def parse_extended_resource_spec(annotations: Mapping[str, str]) -> dict[str, BatchSpec]:
    """Container name -> its batch amounts; {} without the annotation; HookError when malformed."""
    spec = json_annotation(annotations, ANNOTATION_EXTENDED_RESOURCE_SPEC, error=InvalidInput)
    if spec is None:
        return {}
    where = f"pod annotation {ANNOTATION_EXTENDED_RESOURCE_SPEC}"
    containers = spec.get("containers")
    if not isinstance(containers, dict):
        raise InvalidInput(f"{where}: want {{\"containers\": {{<name>: {{requests, limits}}}}}}")
    result = {}
    for name, body in containers.items():
        at = f"{where}: containers.{name}"
        if not isinstance(body, dict):
            raise InvalidInput(f"{at}: want an object with requests/limits")
        requests, limits = body.get("requests") or {}, body.get("limits") or {}
        if not isinstance(requests, dict) or not isinstance(limits, dict):
            raise InvalidInput(f"{at}: requests and limits must be objects")
        result[name] = BatchSpec(
            cpu_request_milli=(_milli_cpu(requests[BATCH_CPU], f"{at}.requests.{BATCH_CPU}")
                               if BATCH_CPU in requests else None),
            cpu_limit_milli=(_milli_cpu(limits[BATCH_CPU], f"{at}.limits.{BATCH_CPU}")
                             if BATCH_CPU in limits else None),
            memory_limit=(_bytes(limits[BATCH_MEMORY], f"{at}.limits.{BATCH_MEMORY}")
                          if BATCH_MEMORY in limits else None),
        )
    return result


def shares_of(milli: int) -> int:
    """Clamped to what cpu.shares accepts, as kubelet's MilliCPUToShares does."""
    return min(MAX_SHARES, max(MIN_SHARES, milli * 1024 // 1000))


def quota_of(milli: int | None, period: int) -> int:
    if not milli:
        return -1
    return max(MIN_QUOTA, milli * period // 1000)


def batch_resources(specs: list[BatchSpec], period: int) -> Resources:
    """Shares from the summed requests; quota and memory from summed limits, -1 if any is unlimited.

    InvalidInput when the sums (each container's amount is bounded already) overflow what
    the kernel accepts.
    """
    requests = [s.cpu_request_milli for s in specs if s.cpu_request_milli is not None]
    cpu_limits = [s.cpu_limit_milli for s in specs if s.cpu_limit_milli is not None]
    memory_limits = [s.memory_limit for s in specs if s.memory_limit is not None]
    resources = Resources(
        cpu_shares=shares_of(sum(requests)) if requests else None,
        cpu_quota=-1 if len(cpu_limits) < len(specs) else quota_of(sum(cpu_limits), period),
        memory_limit=-1 if len(memory_limits) < len(specs) else sum(memory_limits),
    )
    problems = resources.problems(f"pod annotation {ANNOTATION_EXTENDED_RESOURCE_SPEC}: sum of the containers'")
    if problems:
        raise InvalidInput("; ".join(problems))
    return resources


def batch_cfs_quota_enabled(spec: dict[str, Any]) -> bool:
    """Whether BE pods keep a cfs quota of their batch-cpu limit.

    Not while ``resourceUsedThresholdWithBE`` enables suppress with ``cpuSuppressPolicy:
    cfsQuota``: cgroup v1 refuses a parent's quota below a child's (EINVAL), so a BE pod's
    own quota would be the floor of the besteffort quota suppress writes. The pods are then
    held by their shares and the besteffort quota alone. The thresholds are validated as
    the QoS manager validates them, so both read one NodeSLO the same way.
    """
    try:
        config = threshold_config({"spec": spec})
    except SLOError as exc:
        raise RuleError(str(exc)) from None
    return not (config.enable and config.cpu_suppress_policy == CFS_QUOTA_POLICY)


BATCH_CFS_QUOTA: Rule[bool] = Rule("batchCFSQuota", Source.NODE_SLO, batch_cfs_quota_enabled, absent=True)
"""False while BE CPU suppress limits the besteffort dir by cfs quota: BE pods and
containers then get quota -1. Without a NodeSLO suppress is off."""


class BatchResource(RuntimePlugin):
    name = "BatchResource"
    answers_from_request_and_rules = True
    rules_read = (BATCH_CFS_QUOTA, CPU_NORMALIZATION_RATIO)

    def register(self, hooks: Hooks) -> None:
        description = "set cgroup limits of BE pods from batch resources"
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, description + " (pod)", self.set_pod_resources)
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
            hooks.register_container(stage, self.name, description, self.set_container_resources)

    def set_pod_resources(self, ctx: PodContext) -> None:
        req = ctx.request
        if req.koord_qos is not KoordQoS.BE:
            return
        specs = parse_extended_resource_spec(req.annotations)
        if not specs:
            return
        period = req.resources.cpu_period or DEFAULT_CFS_PERIOD
        ctx.response.resources.update(self._node_rules(batch_resources(list(specs.values()), period)))
        log.debug("plugin %s: pod %s: %s", self.name, req.meta, ctx.response.resources)

    def set_container_resources(self, ctx: ContainerContext) -> None:
        req = ctx.request
        if req.koord_qos is not KoordQoS.BE:
            return
        spec = parse_extended_resource_spec(req.pod_annotations).get(req.container_name)
        if spec is None:
            return
        period = req.resources.cpu_period or DEFAULT_CFS_PERIOD
        ctx.response.resources.update(self._node_rules(batch_resources([spec], period)))
        log.debug("plugin %s: pod %s container %s: %s", self.name, req.pod_meta, req.container_name,
                  ctx.response.resources)

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        """The besteffort quota back to -1 once cfs-quota suppress is off.

        The reconciler writes the kube-QoS level before the pods, so when the rule turns BE
        quotas back on, the besteffort dir is unlimited before any pod gets its limit again
        (cgroup v1 refuses a pod quota above a suppressed parent's). Nothing else limits
        the besteffort dir while the rule is on: the suppress strategy writes -1 itself then.
        """
        if qos is not KubeQoS.BESTEFFORT or self.rules is None or not self.rules[BATCH_CFS_QUOTA]:
            return None
        return Resources(cpu_quota=-1)

    def _node_rules(self, resources: Resources) -> Resources:
        """The quota as NodeSLO and the Node want it: -1 under cfs-quota suppress, else scaled."""
        if self.rules is None or resources.cpu_quota is None:
            return resources
        if not self.rules[BATCH_CFS_QUOTA]:
            resources.cpu_quota = -1
        elif resources.cpu_quota > 0 and (ratio := self.rules[CPU_NORMALIZATION_RATIO]) and ratio > 1.0:
            resources.cpu_quota = normalized_quota(resources.cpu_quota, ratio)
        return resources
