"""The CRI Server: serves kubelet and forwards every call to the backend.

Every method is forwarded as raw bytes by its path, so methods this code has never
heard of (a newer CRI, ``runtime.v1alpha2`` from old kubelets, streaming calls) pass
untouched, with the caller's metadata and deadline, and the backend's status code and
message come back unchanged.

Eight lifecycle methods are intercepted (for v1 and v1alpha2, whose messages share
field numbers): each reads top to bottom as build hook request -> Pre hooks -> forward ->
store -> Post hooks.  When no plugin changes anything the original request bytes are
forwarded, so an unhooked call is byte-for-byte the same as a direct one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc
from cri_api.v1alpha2 import api_pb2 as cri_v1alpha2
from google.protobuf.message import DecodeError, Message

from koord.hookapi import HookPoint, PodHookRequest, fromcri
from koord.hookapi.fromcri import StatusError

from . import convert
from . import store as store_mod
from .config import DEFAULT_DATA_PLANE_IDLE_TIMEOUT
from .dispatcher import FAST_RECONNECT, HookFailed, RuntimeDispatcher, Target
from .memtrim import MemoryTrimmer
from .metrics import ProxyMetrics
from .relay import Failure, abort, call_options, pass_initial_metadata, trailing, unary_call, unary_handler
from .store import ContainerRecord, Store
from .streams import StreamEnded, StreamRelay

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20
"""Above kubelet's 16 MiB, so the proxy is never the limit on a large node."""

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    *FAST_RECONNECT,
)
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)

class Backend:
    """Channels to the backend runtime and image services.

    ``reachable`` is what /readyz reports: set by the proxy's periodic probe, cleared at
    once by any intercepted call the backend answers UNAVAILABLE.  While it is False no
    Pre hook is called without first checking that the backend answers again, because
    the CRI call the plugins would prepare cannot succeed.
    """

    def __init__(self, runtime_endpoint: str, image_endpoint: str) -> None:
        self.reachable = False
        self.runtime_channel = grpc.aio.insecure_channel(f"unix://{runtime_endpoint}", options=CHANNEL_OPTIONS)
        self.image_channel = (self.runtime_channel if image_endpoint == runtime_endpoint else
                              grpc.aio.insecure_channel(f"unix://{image_endpoint}", options=CHANNEL_OPTIONS))
        self.runtime = cri_grpc.RuntimeServiceStub(self.runtime_channel)
        self.reader = store_mod.BackendReader(self.runtime_channel)

    def channel_for(self, path: str) -> grpc.aio.Channel:
        return self.image_channel if ".ImageService/" in path else self.runtime_channel

    async def close(self) -> None:
        await self.runtime_channel.close()
        if self.image_channel is not self.runtime_channel:
            await self.image_channel.close()


@dataclass(slots=True)
class Call:
    """One CRI call in flight: its raw request, deadline and metadata, and how to forward it."""

    raw: bytes
    timeout: float | None
    metadata: tuple[tuple[str, str], ...]
    upstream: Callable[..., grpc.aio.UnaryUnaryCall]
    context: grpc.aio.ServicerContext

    async def forward(self, changed: Message | None = None) -> bytes:
        """Sends the original bytes, or ``changed`` when a plugin changed the request."""
        request = self.raw if changed is None else changed.SerializeToString()
        return await unary_call(self.upstream(request, timeout=self.timeout, metadata=self.metadata),
                                self.context)


Lifecycle = Callable[[Any, "Call"], Awaitable[bytes]]
_RUNTIME_SERVICES = ("runtime.v1.RuntimeService", "runtime.v1alpha2.RuntimeService")

LIFECYCLE: dict[str, tuple[type[Message], str]] = {
    "RunPodSandbox": (cri.RunPodSandboxRequest, "run_pod_sandbox"),
    "CreateContainer": (cri.CreateContainerRequest, "create_container"),
    "StartContainer": (cri.StartContainerRequest, "start_container"),
    "UpdateContainerResources": (cri.UpdateContainerResourcesRequest, "update_container_resources"),
    "StopContainer": (cri.StopContainerRequest, "stop_container"),
    "RemoveContainer": (cri.RemoveContainerRequest, "remove_container"),
    "StopPodSandbox": (cri.StopPodSandboxRequest, "stop_pod_sandbox"),
    "RemovePodSandbox": (cri.RemovePodSandboxRequest, "remove_pod_sandbox"),
}
"""The intercepted methods: the CRI request type that decodes them and the CRIServer method handling them."""


def hooked_paths() -> tuple[str, ...]:
    """The method paths that need this server (the rest may bypass it): LIFECYCLE in both CRI versions."""
    return tuple(f"/{service}/{method}" for service in _RUNTIME_SERVICES for method in LIFECYCLE)


def python_paths() -> tuple[str, ...]:
    """The paths the HAProxy data plane hands to this server: the hooked ones, and every
    server-streaming one (``GetContainerEvents``).

    A stream goes through grpc here rather than straight to the backend because HAProxy
    answers a backend stream that was reset before its first response headers with
    RST_STREAM(REFUSED_STREAM), which the client reads as UNAVAILABLE: containerd 2.x
    resets a quiet event stream with CANCEL when the caller's deadline passes, so a direct
    caller sees DEADLINE_EXCEEDED or CANCELLED where HAProxy alone would say UNAVAILABLE.
    Relayed here, the backend's status reaches the caller as the backend gave it.
    """
    return hooked_paths() + tuple(sorted(_cri_paths(server_streaming=True)))


def cri_paths() -> frozenset[str]:
    """Every method path of CRI v1 and v1alpha2 (both services) that this proxy knows by name."""
    return _cri_paths(server_streaming=False) | _cri_paths(server_streaming=True)


def _cri_paths(server_streaming: bool) -> frozenset[str]:
    """Method paths of CRI v1 and v1alpha2 with the given streaming kind."""
    return frozenset(
        f"/{service.full_name}/{m.name}"
        for module in (cri, cri_v1alpha2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
        if m.server_streaming == server_streaming and not m.client_streaming
    )


class CRIServer(grpc.GenericRpcHandler):
    """Answers every method path; see the module docstring for the three kinds of handler."""

    def __init__(self, backend: Backend, store: Store, dispatcher: RuntimeDispatcher,
                 metrics: ProxyMetrics, skip_label: tuple[str, str],
                 stream_idle_timeout: float = DEFAULT_DATA_PLANE_IDLE_TIMEOUT) -> None:
        self.backend = backend
        self.store = store
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.skip_key, self.skip_val = skip_label
        self.trimmer = MemoryTrimmer()
        self.streams = StreamRelay(stream_idle_timeout)
        self._unary = _cri_paths(server_streaming=False)
        self._streaming = _cri_paths(server_streaming=True)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.lifecycle: dict[str, tuple[type[Message], Lifecycle]] = {
            method: (request_type, getattr(self, handler))
            for method, (request_type, handler) in LIFECYCLE.items()
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        path = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is None:
            handler = self._make_handler(path)
            if path in self._unary or path in self._streaming:
                # Only CRI's own paths are cached: arbitrary method names must not grow memory.
                self._handlers[path] = handler
        return handler

    def _make_handler(self, path: str) -> grpc.RpcMethodHandler:
        service, _, method = path.lstrip("/").partition("/")
        channel = self.backend.channel_for(path)
        if service in _RUNTIME_SERVICES and method in self.lifecycle:
            request_type, lifecycle = self.lifecycle[method]
            return self._intercepted(path, request_type, lifecycle, channel.unary_unary(path))
        if path in self._unary:
            return self._unary_passthrough(path, channel.unary_unary(path))
        if path in self._streaming:
            return self._stream_passthrough(path, channel.unary_stream(path))
        return self._generic_passthrough(path, channel.unary_stream(path))

    # ------------------------------------------------------------ pass-through handlers

    def _unary_passthrough(self, path: str, upstream) -> grpc.RpcMethodHandler:
        label = path[1:]
        observe = self.metrics.observe_cri
        note_size = self.trimmer.note

        async def body(request: bytes, context: grpc.aio.ServicerContext) -> bytes | Failure:
            start = time.perf_counter()
            timeout, metadata = call_options(context)
            note_size(len(request))
            try:
                response = await unary_call(upstream(request, timeout=timeout, metadata=metadata), context)
            except grpc.aio.AioRpcError as err:
                observe(label, err.code().name, time.perf_counter() - start)
                return Failure.of(err)
            observe(label, "OK", time.perf_counter() - start)
            note_size(len(response))
            return response

        return unary_handler(body)

    def _stream_passthrough(self, path: str, upstream) -> grpc.RpcMethodHandler:
        """A CRI server stream: relayed like ``_relay``; the proxy ends it at stop and when idle (``StreamRelay``)."""
        label = path[1:]

        async def handler(request: bytes, context: grpc.aio.ServicerContext):
            timeout, metadata = call_options(context)
            call = upstream(request, timeout=timeout, metadata=metadata)
            start, code = time.perf_counter(), "OK"
            try:
                async for message in self.streams.messages(call, pass_initial_metadata(call, context)):
                    yield message
            except grpc.aio.AioRpcError as err:
                code = err.code().name
                await abort(context, err.code(), err.details(), trailing(err))
            except StreamEnded as ended:
                code = grpc.StatusCode.UNAVAILABLE.name
                await abort(context, grpc.StatusCode.UNAVAILABLE, str(ended))
            finally:
                call.cancel()
                self.metrics.observe_cri(label, code, time.perf_counter() - start)

        return grpc.unary_stream_rpc_method_handler(handler)

    def _generic_passthrough(self, path: str, upstream) -> grpc.RpcMethodHandler:
        """Any method we do not know, as unary-stream: on the wire it carries unary calls and
        server-streaming ones alike (no CRI version has client-streaming methods).

        Not stream-stream: when the backend answers before grpc's client has written the
        request (UNIMPLEMENTED for a method it lacks), grpc-python fails that call with
        INTERNAL "Internal error from Core" instead of the backend's status.
        """
        label = path[1:]

        async def handler(request: bytes, context: grpc.aio.ServicerContext):
            timeout, metadata = call_options(context)
            async for message in self._relay(upstream(request, timeout=timeout, metadata=metadata),
                                             context, label):
                yield message

        return grpc.unary_stream_rpc_method_handler(handler)

    async def _relay(self, call, context: grpc.aio.ServicerContext, label: str):
        """Yields the backend's messages; its status ends ours; our cancellation cancels it."""
        start = time.perf_counter()
        code = "OK"
        try:
            await pass_initial_metadata(call, context)
            async for message in call:
                self.trimmer.note(len(message))
                yield message
        except grpc.aio.AioRpcError as err:
            code = err.code().name
            await abort(context, err.code(), err.details(), trailing(err))
        finally:
            call.cancel()
            self.metrics.observe_cri(label, code, time.perf_counter() - start)

    # ------------------------------------------------------------ the interception path

    def _intercepted(self, path: str, request_type: type[Message], lifecycle: Lifecycle,
                     upstream: Callable[..., grpc.aio.UnaryUnaryCall]) -> grpc.RpcMethodHandler:
        label = path[1:]
        observe = self.metrics.observe_cri

        async def body(request: bytes, context: grpc.aio.ServicerContext) -> bytes | Failure:
            start = time.perf_counter()
            timeout, metadata = call_options(context)
            self.trimmer.note(len(request))
            call = Call(request, timeout, metadata, upstream, context)
            code = "OK"
            try:
                try:
                    decoded = request_type.FromString(request)
                except DecodeError:
                    return await call.forward()  # the backend answers what it cannot parse
                return await lifecycle(decoded, call)
            except grpc.aio.AioRpcError as err:
                code = err.code().name
                if err.code() is grpc.StatusCode.UNAVAILABLE:
                    self.backend.reachable = False
                return Failure.of(err)
            except HookFailed as err:
                code = grpc.StatusCode.UNKNOWN.name
                return Failure(grpc.StatusCode.UNKNOWN, str(err))
            except Exception as err:  # a bug or unreadable backend data: say so, never die silently
                code = grpc.StatusCode.INTERNAL.name
                log.exception("%s failed inside the proxy", label)
                return Failure(grpc.StatusCode.INTERNAL, f"koord-runtime-proxy: {label}: {type(err).__name__}: {err}")
            finally:
                observe(label, code, time.perf_counter() - start)

        return unary_handler(body)

    def _hooked(self, pod: convert.PodHookRequest | None,
                container_name: str | None = None) -> TypeGuard[convert.PodHookRequest]:
        """Whether plugins hear about this pod (and container) at all.

        Not for pods with the skip label, nor for a call that cannot succeed: one without
        pod (or container) metadata, which the backend rejects.  The call is still
        forwarded, so kubelet gets the backend's own error.
        """
        return (pod is not None and bool(pod.pod_meta.name) and container_name != ""
                and pod.labels.get(self.skip_key) != self.skip_val)

    async def _backend_up(self, target: Target) -> bool:
        """False while the backend is unreachable: Pre hooks are skipped, the call fails as is.

        Asked of the backend itself (one Version call) when the last probe failed, so a
        backend that just came back never has a call go through without its hooks.
        """
        if self.backend.reachable:
            return True
        try:
            await self.backend.runtime.Version(cri.VersionRequest(), timeout=1.0)
        except grpc.aio.AioRpcError as exc:
            log.info("backend unreachable (%s): no hooks for %s", exc.code().name, target)
            return False
        self.backend.reachable = True
        return True

    async def run_pod_sandbox(self, req: cri.RunPodSandboxRequest, call: Call) -> bytes:
        pod = fromcri.pod_hook_request(req)
        changed = False
        if self._hooked(pod) and await self._backend_up(_pod_target(pod)):
            changed = await self.dispatcher.run_pre(HookPoint.PRE_RUN_POD_SANDBOX, pod, _pod_target(pod))
            if changed:
                convert.apply_to_run_pod_sandbox(req, pod)
        raw = await call.forward(req if changed else None)
        self.store.put_pod(cri.RunPodSandboxResponse.FromString(raw).pod_sandbox_id, pod)
        return raw

    async def create_container(self, req: cri.CreateContainerRequest, call: Call) -> bytes:
        pod = await self._pod(req.pod_sandbox_id, req.sandbox_config)
        container = fromcri.container_record(req.config)
        changed = False
        name = req.config.metadata.name
        if self._hooked(pod, name) and await self._backend_up(target := _pod_target(pod, name)):
            request = fromcri.container_hook_request(pod, container)
            changed = await self.dispatcher.run_pre(HookPoint.PRE_CREATE_CONTAINER, request, target)
            if changed:
                convert.apply_to_create_container(req, request)
                container = fromcri.container_record(req.config)
        raw = await call.forward(req if changed else None)
        container_id = cri.CreateContainerResponse.FromString(raw).container_id
        container.container_meta.id = container_id
        self.store.put_container(container_id, ContainerRecord(req.pod_sandbox_id, container))
        return raw

    async def start_container(self, req: cri.StartContainerRequest, call: Call) -> bytes:
        if not self.dispatcher.has_plugins(HookPoint.PRE_START_CONTAINER, HookPoint.POST_START_CONTAINER):
            return await call.forward()
        found = await self._container(req.container_id)
        if found is None:
            return await call.forward()
        record, pod = found
        if not self._hooked(pod):
            return await call.forward()
        request = fromcri.container_hook_request(pod, record.info)
        target = _pod_target(pod, record.info.container_meta.name)
        if not await self._backend_up(target):
            return await call.forward()
        if await self.dispatcher.run_pre(HookPoint.PRE_START_CONTAINER, request, target):
            if request.container_resources != record.info.container_resources:
                # The container exists already: resources can only change through an update.
                await self.backend.runtime.UpdateContainerResources(
                    cri.UpdateContainerResourcesRequest(
                        container_id=req.container_id,
                        linux=fromcri.to_cri_resources(request.container_resources)),
                    timeout=call.timeout, metadata=call.metadata)
                record.info.container_resources.CopyFrom(request.container_resources)
        raw = await call.forward()
        await self.dispatcher.run_post(HookPoint.POST_START_CONTAINER, request, target)
        return raw

    async def update_container_resources(self, req: cri.UpdateContainerResourcesRequest, call: Call) -> bytes:
        changed = False
        if self.dispatcher.has_plugins(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
            found = await self._container(req.container_id)
            record, pod = found if found is not None else (None, None)
            if record is not None and self._hooked(pod) and await self._backend_up(
                    target := _pod_target(pod, record.info.container_meta.name)):
                request = fromcri.container_hook_request(pod, record.info)
                request.container_resources.CopyFrom(fromcri.to_hook_resources(req.linux))
                request.container_annotations.update(req.annotations)
                changed = await self.dispatcher.run_pre(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, request, target)
                if changed:
                    convert.apply_to_update_resources(req, request)
        raw = await call.forward(req if changed else None)
        stored = self.store.get_container(req.container_id)
        if stored is not None:
            stored.info.container_resources.CopyFrom(fromcri.to_hook_resources(req.linux))
        return raw

    async def stop_container(self, req: cri.StopContainerRequest, call: Call) -> bytes:
        raw = await call.forward()
        if not self.dispatcher.has_plugins(HookPoint.POST_STOP_CONTAINER):
            return raw
        found = await self._container(req.container_id)
        record, pod = found if found is not None else (None, None)
        if record is not None and self._hooked(pod):
            await self.dispatcher.run_post(HookPoint.POST_STOP_CONTAINER,
                                           fromcri.container_hook_request(pod, record.info),
                                           _pod_target(pod, record.info.container_meta.name))
        return raw

    async def stop_pod_sandbox(self, req: cri.StopPodSandboxRequest, call: Call) -> bytes:
        raw = await call.forward()
        if not self.dispatcher.has_plugins(HookPoint.POST_STOP_POD_SANDBOX):
            return raw
        pod = await self._pod(req.pod_sandbox_id)
        if self._hooked(pod):
            await self.dispatcher.run_post(HookPoint.POST_STOP_POD_SANDBOX, pod, _pod_target(pod))
        return raw

    async def remove_container(self, req: cri.RemoveContainerRequest, call: Call) -> bytes:
        raw = await call.forward()
        self.store.delete_container(req.container_id)
        return raw

    async def remove_pod_sandbox(self, req: cri.RemovePodSandboxRequest, call: Call) -> bytes:
        raw = await call.forward()
        self.store.delete_pod(req.pod_sandbox_id)
        return raw

    # ------------------------------------------------------------ store look-ups

    async def _pod(self, sandbox_id: str,
                   fallback: cri.PodSandboxConfig | None = None) -> PodHookRequest | None:
        """From the store, else from the backend (and kept), else from kubelet's copy of the config."""
        pod = self.store.get_pod(sandbox_id)
        if pod is not None:
            return pod
        try:
            pod = await store_mod.fetch_pod(self.backend.reader, sandbox_id)
        except (StatusError, grpc.aio.AioRpcError) as exc:
            if fallback is not None and fallback.ByteSize():
                return fromcri.pod_record_from_config(fallback)
            log.warning("no info for sandbox %s, hooks skipped: %s", sandbox_id, store_mod.describe_error(exc))
            return None
        self.store.put_pod(sandbox_id, pod)
        return pod

    async def _container(self, container_id: str) -> tuple[ContainerRecord, PodHookRequest | None] | None:
        """The container's record and its pod's info, each from the store or else from the backend."""
        record = self.store.get_container(container_id)
        if record is None:
            try:
                record = await store_mod.fetch_container(self.backend.reader, container_id)
            except (StatusError, grpc.aio.AioRpcError) as exc:
                log.warning("no info for container %s, hooks skipped: %s",
                            container_id, store_mod.describe_error(exc))
                return None
            self.store.put_container(container_id, record)
        return record, await self._pod(record.sandbox_id)


def _pod_target(pod: PodHookRequest, container: str = "") -> Target:
    return Target(f"{pod.pod_meta.namespace}/{pod.pod_meta.name}", container)

