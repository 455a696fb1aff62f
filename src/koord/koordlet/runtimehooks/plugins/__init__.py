"""The built-in runtime-hooks plugins, their order and their feature gates.

Order matters: a later plugin refines an earlier one's answer (CPUNormalization scales
the quota BatchResource or kubelet set, after CPUSetAllocator has decided whether the pod
is bound to cpus and so exempt).
"""

from __future__ import annotations

from ...features import QOS_FEATURE_GATES
from ..hooks import PluginEnv, RuntimePlugin
from .batchresource import BatchResource
from .cpunormalization import CPUNormalization
from .cpuset import CPUSetAllocator
from .gpu import GPUEnvInject
from .groupidentity import GroupIdentity
from .resctrl import Resctrl

PLUGIN_ORDER: tuple[type[RuntimePlugin], ...] = (
    GroupIdentity, BatchResource, CPUSetAllocator, CPUNormalization, GPUEnvInject, Resctrl,
)

DEFAULT_FEATURE_GATES: dict[str, bool] = {
    "GroupIdentity": True,
    "CPUSetAllocator": True,
    "BatchResource": True,
    "GPUEnvInject": False,
    "CPUNormalization": False,
    "Resctrl": False,
    **QOS_FEATURE_GATES,
}

_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def parse_feature_gates(text: str) -> dict[str, bool]:
    """"A=true,B=false" -> every gate's value, defaults filled in (Go's ParseBool spellings)."""
    gates = dict(DEFAULT_FEATURE_GATES)
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if name not in DEFAULT_FEATURE_GATES:
            raise ValueError(f"unknown feature gate {name!r}; known: {', '.join(DEFAULT_FEATURE_GATES)}")
        if not sep or value not in _TRUE | _FALSE:
            raise ValueError(f"feature gate {name}: bad value {value!r}: want true or false")
        gates[name] = value in _TRUE
    return gates


def build_plugins(env: PluginEnv, gates: dict[str, bool]) -> list[RuntimePlugin]:
    """The enabled plugins in PLUGIN_ORDER; gates missing from ``gates`` take their default."""
    unknown = set(gates) - set(DEFAULT_FEATURE_GATES)
    if unknown:
        raise ValueError(f"unknown feature gate(s) {', '.join(sorted(unknown))}")
    return [cls(env) for cls in PLUGIN_ORDER if gates.get(cls.name, DEFAULT_FEATURE_GATES[cls.name])]
