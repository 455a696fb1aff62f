"""koordlet's feature gates, all behind one ``--feature-gates`` flag: the runtime-hooks
plugins', the QoS manager's strategies' and the metrics advisor's optional collectors'.

Every gate upstream knows is in ``UPSTREAM_GATES`` with its default and stage; the
runtime-hooks plugins implemented here are listed by their registry
(``runtimehooks.plugins.REGISTRY``), one gate per plugin, named after it.

Upstream's defaults: CPU suppress is on, every eviction is off; suppress and the evictions
still need NodeSLO ``resourceUsedThresholdWithBE.enable: true`` to act.
"""

from __future__ import annotations

from collections.abc import Collection

BE_CPU_SUPPRESS = "BECPUSuppress"
BE_CPU_EVICT = "BECPUEvict"
CPU_EVICT = "CPUEvict"
BE_MEMORY_EVICT = "BEMemoryEvict"
MEMORY_EVICT = "MemoryEvict"
PSI_COLLECTOR = "PSICollector"
CPU_BURST = "CPUBurst"
CPU_ALLOCATABLE_EVICT = "CPUAllocatableEvict"
MEMORY_ALLOCATABLE_EVICT = "MemoryAllocatableEvict"
CGROUP_RECONCILE = "CgroupReconcile"
RDT_RESCTRL = "RdtResctrl"
SYSTEM_CONFIG = "SystemConfig"
RESCTRL_COLLECTOR = "ResctrlCollector"

QOS_FEATURE_GATES: dict[str, bool] = {
    BE_CPU_SUPPRESS: True,
    BE_CPU_EVICT: False,
    CPU_EVICT: False,
    BE_MEMORY_EVICT: False,
    MEMORY_EVICT: False,
    CPU_BURST: True,
    CPU_ALLOCATABLE_EVICT: False,
    MEMORY_ALLOCATABLE_EVICT: False,
    CGROUP_RECONCILE: False,
    RDT_RESCTRL: True,
    SYSTEM_CONFIG: False,
}

ADVISOR_FEATURE_GATES: dict[str, bool] = {PSI_COLLECTOR: False, RESCTRL_COLLECTOR: False}

NODE_TOPOLOGY_REPORT = "NodeTopologyReport"
STATES_FEATURE_GATES: dict[str, bool] = {NODE_TOPOLOGY_REPORT: True}
"""The states informer's: report the NodeResourceTopology (on by default, as upstream)."""

MODULE_FEATURE_GATES: dict[str, bool] = {**QOS_FEATURE_GATES, **ADVISOR_FEATURE_GATES, **STATES_FEATURE_GATES}
"""The gates this koordlet's modules other than the runtime hooks implement, with upstream's defaults."""

ALPHA, BETA = "Alpha", "Beta"
UPSTREAM_GATES: dict[str, tuple[bool, str]] = {
    # koordlet's own gates
    "AuditEvents": (False, ALPHA), "AuditEventsHTTPHandler": (False, ALPHA),
    BE_CPU_SUPPRESS: (True, BETA), "BECPUManager": (False, ALPHA), BE_CPU_EVICT: (False, ALPHA),
    CPU_EVICT: (False, ALPHA), "CPUAllocatableEvict": (False, ALPHA), BE_MEMORY_EVICT: (False, ALPHA),
    MEMORY_EVICT: (False, ALPHA), "MemoryAllocatableEvict": (False, ALPHA), "CPUBurst": (True, BETA),
    "SystemConfig": (False, ALPHA), "RdtResctrl": (True, BETA), "ResctrlCollector": (False, ALPHA),
    "CgroupReconcile": (False, ALPHA), NODE_TOPOLOGY_REPORT: (True, BETA), "Accelerators": (False, ALPHA),
    "RDMADevices": (False, ALPHA), "CPICollector": (False, ALPHA), "Libpfm4": (False, ALPHA),
    PSI_COLLECTOR: (False, ALPHA), "BlkIOReconcile": (False, ALPHA), "ColdPageCollector": (False, ALPHA),
    "HugePageReport": (False, ALPHA), "PodResourcesProxy": (False, ALPHA), "HamiCoreVGPUMonitor": (False, ALPHA),
    "PerCPUMetric": (False, ALPHA), "NodeMetricPromMetrics": (False, ALPHA),
    # the runtime-hooks plugins' gates, registered in the same gate set upstream
    "GroupIdentity": (True, BETA), "CPUSetAllocator": (True, BETA), "GPUEnvInject": (False, ALPHA),
    "RDMADeviceInject": (False, ALPHA), "BatchResource": (True, BETA), "CPUNormalization": (False, ALPHA),
    "CoreSched": (False, ALPHA), "TerwayQoS": (False, ALPHA), "TCNetworkQoS": (False, ALPHA),
    "Resctrl": (False, ALPHA), "OOMScoreAdj": (False, ALPHA),
}
"""Every gate upstream koordlet knows (v1.8): its default and stage. ``AllAlpha`` / ``AllBeta``
set every gate of that stage that is not named explicitly, as Kubernetes' feature gates do."""

ALL_GATE_DEFAULTS: dict[str, bool] = {name: default for name, (default, _) in UPSTREAM_GATES.items()}
_ALL_STAGE = {"AllAlpha": ALPHA, "AllBeta": BETA}

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
"""Go's strconv.ParseBool spellings, exactly (``tRuE`` is an error there too)."""

MAX_GATES_TEXT = 4096


def parse_feature_gates(text: str) -> dict[str, bool]:
    """"AllAlpha=true,B=false" -> every upstream gate's value, defaults filled in.

    Unknown names and values that are not Go booleans are errors naming them. Explicit
    gates win over ``AllAlpha``/``AllBeta`` whatever their order.
    """
    if len(text) > MAX_GATES_TEXT:
        raise ValueError(f"feature gates: longer than {MAX_GATES_TEXT} characters")
    explicit: dict[str, bool] = {}
    stages: dict[str, bool] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if name not in UPSTREAM_GATES and name not in _ALL_STAGE:
            raise ValueError(f"unknown feature gate {name!r:.60}; known: AllAlpha, AllBeta, "
                             + ", ".join(UPSTREAM_GATES))
        if not sep or value not in _TRUE | _FALSE:
            raise ValueError(f"feature gate {name}: bad value {value!r:.20}: want true or false")
        if name in _ALL_STAGE:
            stages[_ALL_STAGE[name]] = value in _TRUE
        else:
            explicit[name] = value in _TRUE
    gates = dict(ALL_GATE_DEFAULTS)
    for name, (_, stage) in UPSTREAM_GATES.items():
        if stage in stages:
            gates[name] = stages[stage]
    gates.update(explicit)
    return gates


def not_implemented(gates: dict[str, bool], implemented: Collection[str]) -> list[str]:
    """Enabled gates of upstream that this koordlet has no feature for (logged once at start)."""
    return sorted(name for name, on in gates.items() if on and name not in implemented)
