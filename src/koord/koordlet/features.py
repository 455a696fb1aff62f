"""koordlet's feature gates besides the runtime-hooks plugins' own (one ``--feature-gates`` flag).

Upstream's defaults: CPU suppress is on, every eviction is off; suppress and the evictions
still need NodeSLO ``resourceUsedThresholdWithBE.enable: true`` to act.
"""

from __future__ import annotations

BE_CPU_SUPPRESS = "BECPUSuppress"
BE_CPU_EVICT = "BECPUEvict"
CPU_EVICT = "CPUEvict"
BE_MEMORY_EVICT = "BEMemoryEvict"
MEMORY_EVICT = "MemoryEvict"

QOS_FEATURE_GATES: dict[str, bool] = {
    BE_CPU_SUPPRESS: True,
    BE_CPU_EVICT: False,
    CPU_EVICT: False,
    BE_MEMORY_EVICT: False,
    MEMORY_EVICT: False,
}
