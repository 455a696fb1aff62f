"""HookPoint knows everything about a hook point that both ends of the protocol need."""

from __future__ import annotations

import pytest

from koord.apis.runtime.v1alpha1 import api_pb2
from koord.hookapi import SERVICE, HookPoint

POD = (api_pb2.PodSandboxHookRequest, api_pb2.PodSandboxHookResponse)
CONTAINER = (api_pb2.ContainerResourceHookRequest, api_pb2.ContainerResourceHookResponse)


@pytest.mark.parametrize("hook, name, pod, pre, cri, types", [
    (HookPoint.PRE_RUN_POD_SANDBOX, "PreRunPodSandbox", True, True, "RunPodSandbox", POD),
    (HookPoint.PRE_CREATE_CONTAINER, "PreCreateContainer", False, True, "CreateContainer", CONTAINER),
    (HookPoint.PRE_START_CONTAINER, "PreStartContainer", False, True, "StartContainer", CONTAINER),
    (HookPoint.POST_START_CONTAINER, "PostStartContainer", False, False, "StartContainer", CONTAINER),
    (HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, "PreUpdateContainerResources", False, True,
     "UpdateContainerResources", CONTAINER),
    (HookPoint.POST_STOP_CONTAINER, "PostStopContainer", False, False, "StopContainer", CONTAINER),
    (HookPoint.POST_STOP_POD_SANDBOX, "PostStopPodSandbox", True, False, "StopPodSandbox", POD),
])
def test_table(hook: HookPoint, name: str, pod: bool, pre: bool, cri: str, types: tuple) -> None:
    assert hook.value == name
    assert hook.rpc == name + "Hook"
    assert hook.method == f"/runtime.v1alpha1.RuntimeHookService/{name}Hook"
    assert (hook.is_pod, hook.is_pre, hook.cri_method) == (pod, pre, cri)
    assert (hook.request_type, hook.response_type) == types


def test_every_rpc_of_the_service_is_a_hook_point_with_its_message_types() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["RuntimeHookService"]
    assert service.full_name == SERVICE
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {h.rpc for h in HookPoint}
    for hook in HookPoint:
        assert methods[hook.rpc].input_type.full_name == hook.request_type.DESCRIPTOR.full_name
        assert methods[hook.rpc].output_type.full_name == hook.response_type.DESCRIPTOR.full_name


def test_ordered_is_the_order_of_a_pods_life() -> None:
    assert HookPoint.ordered({"PostStopPodSandbox", HookPoint.PRE_RUN_POD_SANDBOX, "PreStartContainer"}) == (
        HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_START_CONTAINER, HookPoint.POST_STOP_POD_SANDBOX)
