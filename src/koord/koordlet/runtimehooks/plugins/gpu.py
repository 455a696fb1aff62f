"""GPUEnvInject: tells the NVIDIA container runtime which GPUs the scheduler allocated.

Only Proxy mode can inject environment variables (they exist only at creation), so in
Standalone mode this plugin's answer is simply not applied.
"""

from __future__ import annotations

import logging

from koord.apis.extension import ANNOTATION_DEVICE_ALLOCATED
from koord.hookapi import HookPoint, json_annotation

from ..hooks import Hooks, InvalidInput, RuntimePlugin
from ..protocol import ContainerContext

log = logging.getLogger(__name__)

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


def gpu_minors(annotations: dict[str, str]) -> list[int]:
    """GPU minors from ``{"gpu":[{"minor":0},...]}``; [] when none; InvalidInput when malformed."""
    allocated = json_annotation(annotations, ANNOTATION_DEVICE_ALLOCATED, error=InvalidInput)
    if allocated is None:
        return []
    where = f"pod annotation {ANNOTATION_DEVICE_ALLOCATED}"
    gpus = allocated.get("gpu") or []
    if not isinstance(gpus, list):
        raise InvalidInput(f"{where}: gpu: want a list of allocations")
    minors = []
    for i, gpu in enumerate(gpus):
        minor = gpu.get("minor") if isinstance(gpu, dict) else None
        if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
            raise InvalidInput(f"{where}: gpu[{i}].minor={minor!r}: want a non-negative integer")
        minors.append(minor)
    return minors


class GPUEnvInject(RuntimePlugin):
    name = "GPUEnvInject"
    answers_from_request_and_rules = True

    def register(self, hooks: Hooks) -> None:
        hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, self.name,
                                 f"set {ENV_VISIBLE_DEVICES} from allocated GPUs", self.inject_env)

    def inject_env(self, ctx: ContainerContext) -> None:
        req = ctx.request
        minors = gpu_minors(req.pod_annotations)
        if minors:
            ctx.response.envs[ENV_VISIBLE_DEVICES] = ",".join(map(str, minors))
            log.debug("plugin %s: pod %s container %s: %s=%s", self.name, req.pod_meta,
                      req.container_name, ENV_VISIBLE_DEVICES, ctx.response.envs[ENV_VISIBLE_DEVICES])
