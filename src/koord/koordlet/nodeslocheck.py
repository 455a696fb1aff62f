"""The checks koordlet's modules make of a NodeSLO beyond its typed sections (which the states
informer parses itself, ``slo.parse_node_slo``), in one function the states informer runs on
each new version it receives.

The runtime hooks' rules and the QoS strategies each turn their part of the NodeSLO into
checked values, and each refuses a value it cannot use. Run there only, one bad version
would be refused (and logged) once by every reader, and every reader would drop to its own
fallback. Run here first, a bad version is refused once, with one line naming the field, and
every reader keeps the last good version.
"""

from __future__ import annotations

from .qosmanager.burstcalc import burst_strategy
from .qosmanager.resourceqos import CLASS_KEYS, memory_qos, resctrl_qos
from .runtimehooks.plugins import parse_rules
from .statesinformer.specs import merged_node_slo


def check_node_slo(node_slo: dict) -> None:
    """ValueError naming the field when any module would refuse ``node_slo`` (the object as
    received): its resource QoS classes, its CPU burst strategy, or the runtime-hook rules
    made from it."""
    parse_rules(node_slo, None)  # the hooks merge the object as received over the defaults themselves
    merged = merged_node_slo(node_slo)
    for cls in CLASS_KEYS:
        memory_qos(merged, cls)
        resctrl_qos(merged, cls)
    burst_strategy(merged)
