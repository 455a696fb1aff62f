"""koordlet's feature gates, all behind one ``--feature-gates`` flag: the runtime-hooks
plugins', the QoS manager's strategies' and the metrics advisor's optional collectors'.

Upstream's defaults: CPU suppress is on, every eviction is off; suppress and the evictions
still need NodeSLO ``resourceUsedThresholdWithBE.enable: true`` to act.
"""

from __future__ import annotations

BE_CPU_SUPPRESS = "BECPUSuppress"
BE_CPU_EVICT = "BECPUEvict"
CPU_EVICT = "CPUEvict"
BE_MEMORY_EVICT = "BEMemoryEvict"
MEMORY_EVICT = "MemoryEvict"
PSI_COLLECTOR = "PSICollector"
CPU_ALLOCATABLE_EVICT = "CPUAllocatableEvict"
MEMORY_ALLOCATABLE_EVICT = "MemoryAllocatableEvict"
CGROUP_RECONCILE = "CgroupReconcile"
RDT_RESCTRL = "RdtResctrl"
SYSTEM_CONFIG = "SystemConfig"
RESCTRL_COLLECTOR = "ResctrlCollector"

RUNTIME_HOOK_GATES: dict[str, bool] = {
    "GroupIdentity": True,
    "CPUSetAllocator": True,
    "BatchResource": True,
    "GPUEnvInject": False,
    "CPUNormalization": False,
    "Resctrl": False,
}
"""One gate per runtime-hooks plugin, named after the plugin."""

QOS_FEATURE_GATES: dict[str, bool] = {
    BE_CPU_SUPPRESS: True,
    BE_CPU_EVICT: False,
    CPU_EVICT: False,
    BE_MEMORY_EVICT: False,
    MEMORY_EVICT: False,
    CPU_ALLOCATABLE_EVICT: False,
    MEMORY_ALLOCATABLE_EVICT: False,
    CGROUP_RECONCILE: False,
    RDT_RESCTRL: True,
    SYSTEM_CONFIG: False,
}

ADVISOR_FEATURE_GATES: dict[str, bool] = {PSI_COLLECTOR: False, RESCTRL_COLLECTOR: False}

DEFAULT_FEATURE_GATES: dict[str, bool] = {**RUNTIME_HOOK_GATES, **QOS_FEATURE_GATES, **ADVISOR_FEATURE_GATES}

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
