"""The built-in runtime-hooks plugins, their order and their feature gates.

Order matters: a later plugin refines an earlier one's answer (CPUNormalization scales
the quota BatchResource or kubelet set, after CPUSetAllocator has decided whether the pod
is bound to cpus and so exempt).
"""

from __future__ import annotations

from ...features import RUNTIME_HOOK_GATES, UPSTREAM_GATES
from ..hooks import PluginEnv, RuntimePlugin
from .batchresource import BatchResource
from .coresched import CoreSched
from .cpunormalization import CPUNormalization
from .cpuset import CPUSetAllocator
from .gpu import GPUEnvInject
from .groupidentity import GroupIdentity
from .oomscoreadj import OOMScoreAdj
from .resctrl import Resctrl

PLUGIN_ORDER: tuple[type[RuntimePlugin], ...] = (
    GroupIdentity, BatchResource, CPUSetAllocator, CPUNormalization, GPUEnvInject, Resctrl, OOMScoreAdj,
    CoreSched,
)


def build_plugins(env: PluginEnv, gates: dict[str, bool]) -> list[RuntimePlugin]:
    """The enabled plugins in PLUGIN_ORDER; gates missing from ``gates`` take their default."""
    unknown = set(gates) - set(UPSTREAM_GATES)
    if unknown:
        raise ValueError(f"unknown feature gate(s) {', '.join(sorted(unknown))}")
    return [cls(env) for cls in PLUGIN_ORDER if gates.get(cls.name, RUNTIME_HOOK_GATES[cls.name])]
