"""NodeSLO ``spec.resourceQOSStrategy`` per QoS class: ``memoryQOS`` and ``resctrlQOS``,
upstream's defaults filled in, ``enable: false`` replaced by the all-off values, every
number range-checked; and the pod annotation ``koordinator.sh/memoryQOS`` merged over it.

Upstream fills a missing section field from its recommended defaults and, when a class's
``enable`` is false, replaces the whole section with the "none" values (kernel defaults),
so that disabling a class writes the defaults back instead of leaving the old values. A
value outside the range the API declares is refused here with an error naming the field:
the strategies then skip their tick rather than write a cgroup or resctrl file from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koord.apis.extension import ANNOTATION_POD_MEMORY_QOS
from koord.hookapi import json_annotation

from ..runtimehooks.protocol import KubeQoS
from ..slo import SLOError
from ..statesinformer import PodMeta
from ..statesinformer.specs import DEFAULT_NODE_SLO_SPEC, merge_over

FIELD = "spec.resourceQOSStrategy"
POLICY_DEFAULT, POLICY_NONE, POLICY_AUTO = "default", "none", "auto"

LSR, LS, BE, SYSTEM = "LSR", "LS", "BE", "SYSTEM"
CLASS_KEYS = {LSR: "lsrClass", LS: "lsClass", BE: "beClass", SYSTEM: "systemClass"}

MEMORY_RANGES: dict[str, tuple[int, int]] = {
    "minLimitPercent": (0, 100),
    "lowLimitPercent": (0, 100),
    "throttlingPercent": (0, 100),
    "wmarkRatio": (0, 100),
    "wmarkScalePermill": (1, 1000),
    "wmarkMinAdj": (-25, 50),
    "priorityEnable": (0, 1),
    "priority": (0, 12),
    "oomKillGroup": (0, 1),
}
"""The API's declared bounds of each memoryQOS field."""


def _memory(wmark_ratio: int, scale: int, min_adj: int) -> dict[str, int]:
    return {"minLimitPercent": 0, "lowLimitPercent": 0, "throttlingPercent": 0,
            "wmarkRatio": wmark_ratio, "wmarkScalePermill": scale, "wmarkMinAdj": min_adj,
            "priorityEnable": 0, "priority": 0, "oomKillGroup": 0}


DEFAULT_MEMORY_QOS: dict[str, dict[str, int]] = {
    LSR: _memory(95, 20, -25), LS: _memory(95, 20, -25), BE: _memory(95, 20, 50),
    SYSTEM: _memory(0, 50, 0),
}
"""Upstream's recommended values: protection and throttling off, async reclaim on."""
NONE_MEMORY_QOS: dict[str, int] = _memory(0, 50, 0)
"""Every knob at the kernel's default: what a disabled class (or ``policy: none``) gets."""

DEFAULT_RESCTRL_QOS: dict[str, dict[str, int]] = {
    cls: {k: v for k, v in DEFAULT_NODE_SLO_SPEC["resourceQOSStrategy"][key]["resctrlQOS"].items() if k != "enable"}
    for cls, key in CLASS_KEYS.items()
}
"""Upstream's defaults, as the default NodeSLO spec holds them (for a null section)."""
NONE_RESCTRL_QOS: dict[str, int] = {"catRangeStartPercent": 0, "catRangeEndPercent": 100,
                                    "mbaPercent": 100}


@dataclass(frozen=True)
class ClassQOS:
    """One section of one class: whether it is enabled and its (checked) values."""

    enable: bool
    values: Mapping[str, int]


def _enable(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SLOError(f"{where}.enable={value!r:.40}: want true or false")
    return value


def _checked(values: Mapping[str, Any], ranges: Mapping[str, tuple[int, int]], where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, (lo, hi) in ranges.items():
        v = values.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise SLOError(f"{where}.{key}={v!r:.40}: want an integer in [{lo}, {hi}]")
        out[key] = v
    return out


def _section(node_slo: Mapping[str, Any] | None, cls: str, name: str) -> tuple[Any, str]:
    where = f"{FIELD}.{CLASS_KEYS[cls]}.{name}"
    if node_slo is None:
        return None, where
    spec = node_slo.get("spec")
    strategy = spec.get("resourceQOSStrategy") if isinstance(spec, dict) else None
    if strategy is None:
        return None, where
    if not isinstance(strategy, dict):
        raise SLOError(f"{FIELD}: want an object, got {type(strategy).__name__}")
    section = strategy.get(CLASS_KEYS[cls])
    if section is None:
        return None, where
    if not isinstance(section, dict):
        raise SLOError(f"{FIELD}.{CLASS_KEYS[cls]}: want an object, got {type(section).__name__}")
    raw = section.get(name)
    if raw is not None and not isinstance(raw, dict):
        raise SLOError(f"{where}: want an object, got {type(raw).__name__}")
    return raw, where


def _class_qos(node_slo: Mapping[str, Any] | None, cls: str, name: str,
               defaults: Mapping[str, int], none: Mapping[str, int],
               ranges: Mapping[str, tuple[int, int]]) -> ClassQOS:
    raw, where = _section(node_slo, cls, name)
    raw = raw or {}
    enable = _enable(raw.get("enable"), where)
    values = merge_over(dict(defaults), _checked(raw, ranges, where))
    return ClassQOS(enable, dict(none) if not enable else values)


def memory_qos(node_slo: Mapping[str, Any] | None, cls: str) -> ClassQOS:
    """``resourceQOSStrategy.<cls>.memoryQOS`` over upstream's defaults (none when disabled)."""
    return _class_qos(node_slo, cls, "memoryQOS", DEFAULT_MEMORY_QOS[cls], NONE_MEMORY_QOS, MEMORY_RANGES)


RESCTRL_RANGES: dict[str, tuple[int, int]] = {
    "catRangeStartPercent": (0, 100), "catRangeEndPercent": (0, 100), "mbaPercent": (1, 100)}


def resctrl_qos(node_slo: Mapping[str, Any] | None, cls: str) -> ClassQOS:
    """``resourceQOSStrategy.<cls>.resctrlQOS`` over upstream's defaults (full cache and
    bandwidth when disabled); a start not below its end is refused."""
    q = _class_qos(node_slo, cls, "resctrlQOS", DEFAULT_RESCTRL_QOS[cls], NONE_RESCTRL_QOS,
                   RESCTRL_RANGES)
    if q.values["catRangeStartPercent"] >= q.values["catRangeEndPercent"]:
        raise SLOError(f"{FIELD}.{CLASS_KEYS[cls]}.resctrlQOS: catRangeStartPercent="
                       f"{q.values['catRangeStartPercent']} is not below catRangeEndPercent="
                       f"{q.values['catRangeEndPercent']}")
    return q


def pod_class(pod: PodMeta) -> str:
    """The NodeSLO class whose config a pod takes: LSE shares LSR's; a pod without a
    Koordinator class takes BE's when kube BestEffort, else LS's."""
    if pod.koord_qos in ("LSE", LSR):
        return LSR
    if pod.koord_qos in (LS, BE, SYSTEM):
        return pod.koord_qos
    return BE if pod.kube_qos == KubeQoS.BESTEFFORT.value else LS


KUBE_QOS_CLASS = {KubeQoS.GUARANTEED: LSR, KubeQoS.BURSTABLE: LS, KubeQoS.BESTEFFORT: BE}
"""The class whose config a kube-QoS dir takes (upstream's static mapping)."""


def pod_memory_qos_config(pod: PodMeta) -> tuple[str, dict[str, int]] | None:
    """The pod's ``koordinator.sh/memoryQOS`` annotation: (policy, fields), None when absent.
    SLOError names the pod and the field when it is malformed or out of range."""
    owner = f"pod {pod.key}"
    raw = json_annotation(pod.annotations, ANNOTATION_POD_MEMORY_QOS, error=SLOError, owner=owner)
    if raw is None:
        return None
    policy = raw.get("policy") or POLICY_DEFAULT
    if policy not in (POLICY_DEFAULT, POLICY_NONE, POLICY_AUTO):
        raise SLOError(f"{owner} annotation {ANNOTATION_POD_MEMORY_QOS}: policy={policy!r:.40}: want "
                       f"{POLICY_DEFAULT}, {POLICY_NONE} or {POLICY_AUTO}")
    return policy, _checked(raw, MEMORY_RANGES, f"{owner} annotation {ANNOTATION_POD_MEMORY_QOS}")


def merged_pod_memory_qos(node_cfg: Mapping[str, int], pod: PodMeta,
                          annotation: tuple[str, dict[str, int]] | None) -> dict[str, int]:
    """Upstream's order: the pod's fields > the policy's template > the node's class config.
    ``none`` turns everything off (fields ignored); ``auto`` starts from the recommended
    values of the pod's class even when the node's class is disabled."""
    if annotation is None:
        return dict(node_cfg)
    policy, fields = annotation
    if policy == POLICY_NONE:
        return dict(NONE_MEMORY_QOS)
    base = DEFAULT_MEMORY_QOS[pod_class(pod)] if policy == POLICY_AUTO else node_cfg
    return {**base, **fields}
