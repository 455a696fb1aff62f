"""The Node annotation parsers of koord.apis.extension: what a well-formed value reads as, and
the field a malformed one is refused for (each caller then applies its own policy)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from koord.apis.extension import (
    ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
    AnnotationError,
    KubeletCPUManagerPolicy,
    NodeReservation,
    SystemQOSResource,
    kubelet_cpu_manager_policy,
    node_reservation,
    system_qos_resource,
)


def anno(key: str, value: object) -> dict[str, str]:
    return {key: value if isinstance(value, str) else json.dumps(value)}


@pytest.mark.parametrize("annotations, want", [
    ({}, NodeReservation({}, None, "", "")),
    (anno(ANNOTATION_NODE_RESERVATION, "null"), NodeReservation({}, None, "", "")),
    (anno(ANNOTATION_NODE_RESERVATION, {"resources": {"cpu": "2500m", "memory": "1Gi"}}),
     NodeReservation({"cpu": "2500m", "memory": "1Gi"}, Fraction(5, 2), "", "")),
    (anno(ANNOTATION_NODE_RESERVATION, {"resources": {"cpu": "-2"}}),
     NodeReservation({"cpu": "-2"}, Fraction(-2), "", "")),
    (anno(ANNOTATION_NODE_RESERVATION, {"reservedCPUs": "-1", "applyPolicy": "Default"}),
     NodeReservation({}, None, "-1", "Default")),  # the list is kept as written: readers judge it
])
def test_node_reservation(annotations: dict, want: NodeReservation) -> None:
    assert node_reservation(annotations) == want


@pytest.mark.parametrize("annotations, want", [
    ({}, None),
    (anno(ANNOTATION_SYSTEM_QOS_RESOURCE, {}), SystemQOSResource("", None)),
    (anno(ANNOTATION_SYSTEM_QOS_RESOURCE, {"cpuset": "0b"}), SystemQOSResource("0b", None)),
    (anno(ANNOTATION_SYSTEM_QOS_RESOURCE, {"cpuset": "0-3", "cpusetExclusive": False}),
     SystemQOSResource("0-3", False)),
])
def test_system_qos_resource(annotations: dict, want: SystemQOSResource | None) -> None:
    got = system_qos_resource(annotations)
    assert got == want
    assert got is None or got.is_exclusive == (want is not None and want.exclusive is not False)


@pytest.mark.parametrize("annotations, want", [
    ({}, KubeletCPUManagerPolicy("", {}, "")),
    (anno(ANNOTATION_KUBELET_CPU_MANAGER_POLICY, {"policy": "static", "options": {"full-pcpus-only": "true"},
                                                  "reservedCPUs": "0-1"}),
     KubeletCPUManagerPolicy("static", {"full-pcpus-only": "true"}, "0-1")),
])
def test_kubelet_cpu_manager_policy(annotations: dict, want: KubeletCPUManagerPolicy) -> None:
    assert kubelet_cpu_manager_policy(annotations) == want


@pytest.mark.parametrize("parse, key, value, field", [
    (node_reservation, ANNOTATION_NODE_RESERVATION, "{bad", "bad JSON"),
    (node_reservation, ANNOTATION_NODE_RESERVATION, [], "want a JSON object"),
    (node_reservation, ANNOTATION_NODE_RESERVATION, {"resources": "2"}, "resources="),
    (node_reservation, ANNOTATION_NODE_RESERVATION, {"resources": {"cpu": "two"}}, "resources.cpu"),
    (node_reservation, ANNOTATION_NODE_RESERVATION, {"reservedCPUs": 5}, "reservedCPUs=5"),
    (node_reservation, ANNOTATION_NODE_RESERVATION, {"applyPolicy": True}, "applyPolicy"),
    (system_qos_resource, ANNOTATION_SYSTEM_QOS_RESOURCE, "5", "want a JSON object"),
    (system_qos_resource, ANNOTATION_SYSTEM_QOS_RESOURCE, {"cpuset": 7}, "cpuset=7"),
    (system_qos_resource, ANNOTATION_SYSTEM_QOS_RESOURCE, {"cpusetExclusive": "yes"}, "cpusetExclusive"),
    (kubelet_cpu_manager_policy, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, {"policy": 1}, "policy=1"),
    (kubelet_cpu_manager_policy, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, {"options": []}, "options"),
    (kubelet_cpu_manager_policy, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, {"options": {"a": 1}}, "options"),
])
def test_malformed_annotation_names_the_field(parse, key: str, value: object, field: str) -> None:
    with pytest.raises(AnnotationError, match=f"node annotation {key}.*{field}"):
        parse(anno(key, value))
