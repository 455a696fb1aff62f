"""The checked-in hook protocol code must be what api.proto generates, and keep upstream's wire names."""

from __future__ import annotations

from pathlib import Path

from koord.apis import generate
from koord.apis.runtime.v1alpha1 import api_pb2


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    for name in generate.OUTPUTS:
        fresh = (tmp_path / name).read_text()
        checked_in = (generate.PROTO_DIR / name).read_text()
        assert fresh == checked_in, f"{name} is stale: run python -m koord.apis.generate"


WIRE = {
    "PodSandboxMetadata": {"name": 1, "uid": 2, "namespace": 3, "attempt": 4},
    "PodSandboxHookRequest": {"pod_meta": 1, "runtime_handler": 2, "labels": 3, "annotations": 4,
                              "cgroup_parent": 5, "overhead": 6, "resources": 7},
    "PodSandboxHookResponse": {"labels": 1, "annotations": 2, "cgroup_parent": 3, "resources": 4},
    "LinuxContainerResources": {"cpu_period": 1, "cpu_quota": 2, "cpu_shares": 3, "memory_limit_in_bytes": 4,
                                "oom_score_adj": 5, "cpuset_cpus": 6, "cpuset_mems": 7, "hugepage_limits": 8,
                                "unified": 9, "memory_swap_limit_in_bytes": 10},
    "HugepageLimit": {"page_size": 1, "limit": 2},
    "ContainerMetadata": {"name": 1, "attempt": 2, "id": 3},
    "ContainerResourceHookRequest": {"pod_meta": 1, "container_meta": 2, "container_annotations": 3,
                                     "container_resources": 4, "pod_resources": 5, "pod_annotations": 6,
                                     "pod_labels": 7, "pod_cgroup_parent": 8, "container_envs": 9},
    "ContainerResourceHookResponse": {"container_annotations": 1, "container_resources": 2,
                                      "pod_cgroup_parent": 3, "container_envs": 4},
}


def test_wire_field_numbers_match_upstream() -> None:
    for message, fields in WIRE.items():
        descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields} == fields, message


def test_service_and_method_names() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["RuntimeHookService"]
    assert service.full_name == "runtime.v1alpha1.RuntimeHookService"
    assert {m.name for m in service.methods} == {
        "PreRunPodSandboxHook", "PostStopPodSandboxHook", "PreCreateContainerHook", "PreStartContainerHook",
        "PostStartContainerHook", "PostStopContainerHook", "PreUpdateContainerResourcesHook"}
