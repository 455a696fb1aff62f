"""The seven hook points of ``runtime.v1alpha1.RuntimeHookService`` and the failure policy.

Everything that speaks the protocol (the proxy's plugins manager and dispatcher, koordlet's
hook server and framework, the plugin SDK, the test plugins) asks a ``HookPoint`` for its
registration name, RPC, kind and message types instead of spelling them again.
"""

from __future__ import annotations

import enum
from collections.abc import Container

from koord.apis.runtime.v1alpha1 import api_pb2

SERVICE = "runtime.v1alpha1.RuntimeHookService"

PodHookRequest = api_pb2.PodSandboxHookRequest
PodHookResponse = api_pb2.PodSandboxHookResponse
ContainerHookRequest = api_pb2.ContainerResourceHookRequest
ContainerHookResponse = api_pb2.ContainerResourceHookResponse
HookRequest = PodHookRequest | ContainerHookRequest
HookResponse = PodHookResponse | ContainerHookResponse


class HookPoint(enum.StrEnum):
    """A hook point; the value is the name registration files use.

    Members are in the order of a pod's life, which is also the order registration files
    list them in.
    """

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"

    @property
    def rpc(self) -> str:
        """The RuntimeHookService method name, e.g. ``PreRunPodSandboxHook``."""
        return f"{self.value}Hook"

    @property
    def method(self) -> str:
        """The full gRPC method path, e.g. ``/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook``."""
        return f"/{SERVICE}/{self.rpc}"

    @property
    def is_pod(self) -> bool:
        """Pod hooks carry PodSandboxHook messages; all others ContainerResourceHook messages."""
        return self in _POD_HOOKS

    @property
    def is_pre(self) -> bool:
        """Pre hooks may change the CRI call; Post hooks only notify."""
        return self.value.startswith("Pre")

    @property
    def cri_method(self) -> str:
        """The CRI call the hook rides on, e.g. ``RunPodSandbox``."""
        return self.value.removeprefix("Pre").removeprefix("Post")

    @property
    def request_type(self) -> type[PodHookRequest] | type[ContainerHookRequest]:
        return PodHookRequest if self.is_pod else ContainerHookRequest

    @property
    def response_type(self) -> type[PodHookResponse] | type[ContainerHookResponse]:
        return PodHookResponse if self.is_pod else ContainerHookResponse

    @classmethod
    def ordered(cls, hooks: Container[str]) -> tuple[HookPoint, ...]:
        """``hooks`` (any container of hook points) in the canonical order."""
        return tuple(h for h in cls if h in hooks)


_POD_HOOKS = frozenset({HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.POST_STOP_POD_SANDBOX})


class FailurePolicy(enum.StrEnum):
    """What the caller does when a plugin fails: fail the call, or go on without that answer."""

    FAIL = "Fail"
    IGNORE = "Ignore"
