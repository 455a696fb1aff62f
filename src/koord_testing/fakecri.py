"""A CRI runtime service in memory, for unit tests that need a backend but not containers.

It answers like containerd 1.6 where the code under test depends on it: verbose
``PodSandboxStatus`` / ``ContainerStatus`` carry the original config as JSON in
``info["info"]`` (snake_case field names, as containerd's Go structs print them), and a
container's status reports its current resources with containerd's implicit swap (swap =
memory limit when none was asked for). Every request is recorded as the bytes that
arrived, so a test can check that a proxy forwarded the original bytes or what it changed.

Methods listed in ``echo`` (and any method it does not implement) fail with
FAILED_PRECONDITION whose message is a JSON echo of what arrived: metadata, deadline and
request bytes, for transparency tests. ``fail[method] = (code, message)`` makes a method
fail. ``GetContainerEvents`` streams an event for every RunPodSandbox. Implemented methods
send ``x-fake-method: <method>`` as initial metadata; ``FakeMirror`` answers its request bytes.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as cri
from google.protobuf import json_format
from google.protobuf.message import Message

SERVICE = "runtime.v1.RuntimeService"
ECHO_CODE = grpc.StatusCode.FAILED_PRECONDITION
INITIAL_METADATA_KEY = "x-fake-method"
"""Sent as initial metadata (a response header) by every method the fake implements."""
MAX_CONCURRENT_CALLS = 256
"""Enough threads for tests of kubelet's many concurrent calls on one connection."""
MIRROR_METHOD = "FakeMirror"
"""A method no CRI has, answering the request's bytes."""
MAX_MESSAGE_BYTES = 64 << 20


@dataclass
class FakePod:
    config: cri.PodSandboxConfig
    state: cri.PodSandboxState.ValueType = cri.SANDBOX_READY
    runtime_handler: str = ""


@dataclass
class FakeContainer:
    sandbox_id: str
    config: cri.ContainerConfig
    state: cri.ContainerState.ValueType = cri.CONTAINER_CREATED
    resources: cri.LinuxContainerResources = field(default_factory=cri.LinuxContainerResources)
    """What ContainerStatus reports as the current resources (containerd keeps them up to date)."""
    created_at: int = field(default_factory=time.time_ns)


def _as_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _current_resources(config: cri.ContainerConfig) -> cri.LinuxContainerResources:
    """What containerd reports after CreateContainer: the config's resources, swap = memory limit if unset."""
    res = cri.LinuxContainerResources()
    res.CopyFrom(config.linux.resources)
    if not res.memory_swap_limit_in_bytes and res.memory_limit_in_bytes > 0:
        res.memory_swap_limit_in_bytes = res.memory_limit_in_bytes
    return res


class FakeCRI(grpc.GenericRpcHandler):
    """The fake backend: ``with FakeCRI(socket) as fake:`` serves on ``fake.endpoint``."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.endpoint = f"unix://{socket}"
        self.pods: dict[str, FakePod] = {}
        self.containers: dict[str, FakeContainer] = {}
        self.calls: list[tuple[str, bytes]] = []
        self.echo: set[str] = set()
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.subscribers: list[queue.Queue[cri.ContainerEventResponse | None]] = []
        self._ids = itertools.count(1)
        self._execs = 0
        self.most_concurrent_execs = 0
        self._lock = threading.Lock()
        pool = futures.ThreadPoolExecutor(max_workers=MAX_CONCURRENT_CALLS)
        self._server = grpc.server(pool, handlers=(self,), options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        self._server.add_insecure_port(f"unix:{socket}")
        self._unary: dict[str, tuple[type[Message], Callable[[Any], Message]]] = {
            "Version": (cri.VersionRequest, self._version),
            "ExecSync": (cri.ExecSyncRequest, self._exec_sync),
            "RunPodSandbox": (cri.RunPodSandboxRequest, self._run_pod),
            "StopPodSandbox": (cri.StopPodSandboxRequest, self._stop_pod),
            "RemovePodSandbox": (cri.RemovePodSandboxRequest, self._remove_pod),
            "PodSandboxStatus": (cri.PodSandboxStatusRequest, self._pod_status),
            "ListPodSandbox": (cri.ListPodSandboxRequest, self._list_pods),
            "CreateContainer": (cri.CreateContainerRequest, self._create_container),
            "StartContainer": (cri.StartContainerRequest, self._start_container),
            "StopContainer": (cri.StopContainerRequest, self._stop_container),
            "RemoveContainer": (cri.RemoveContainerRequest, self._remove_container),
            "ListContainers": (cri.ListContainersRequest, self._list_containers),
            "ContainerStatus": (cri.ContainerStatusRequest, self._container_status),
            "UpdateContainerResources": (cri.UpdateContainerResourcesRequest, self._update_resources),
        }

    def __enter__(self) -> FakeCRI:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            for sub in self.subscribers:
                sub.put(None)
        self._server.stop(grace=None)

    # -- what tests set up and inspect -----------------------------------------------------

    def add_pod(self, sid: str, name: str, labels: dict[str, str], parent: str | None,
                state: cri.PodSandboxState.ValueType = cri.SANDBOX_READY, annotations: dict[str, str] | None = None,
                namespace: str = "ns") -> FakePod:
        """A pod created before the test; ``parent`` None leaves the cgroup parent out of its config."""
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, namespace=namespace, uid="uid-" + sid),
            labels=labels, annotations=annotations or {})
        if parent is not None:
            config.linux.cgroup_parent = parent
        pod = self.pods[sid] = FakePod(config, state)
        return pod

    def add_container(self, cid: str, sid: str, name: str, envs: dict[str, str] | None = None,
                      resources: dict[str, Any] | None = None,
                      state: cri.ContainerState.ValueType = cri.CONTAINER_RUNNING) -> FakeContainer:
        """A container created before the test; ``resources`` in containerd's JSON shape."""
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name), annotations={"io.kubernetes.container.name": name},
            envs=[cri.KeyValue(key=k, value=v) for k, v in (envs or {}).items()])
        json_format.ParseDict({"linux": {"resources": resources or {}}}, config)
        container = self.containers[cid] = FakeContainer(sid, config, state, _current_resources(config))
        return container

    def remove_pod(self, sid: str) -> None:
        """The pod and its containers gone, as RemovePodSandbox leaves them."""
        self.pods.pop(sid, None)
        for cid in [cid for cid, c in list(self.containers.items()) if c.sandbox_id == sid]:
            self.containers.pop(cid, None)

    def requests(self, method: str) -> list[bytes]:
        """The raw requests of ``method`` (e.g. ``RunPodSandbox``), oldest first."""
        with self._lock:
            return [raw for m, raw in self.calls if m == method]

    # -- grpc --------------------------------------------------------------------------------

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, method = details.method.lstrip("/").partition("/")
        if service == SERVICE and method == "GetContainerEvents":
            return grpc.unary_stream_rpc_method_handler(self._events)
        if service == SERVICE and method == MIRROR_METHOD:
            return grpc.unary_unary_rpc_method_handler(self._mirror)
        if service == SERVICE and method in self._unary and method not in self.echo:
            request_type, answer = self._unary[method]
            return grpc.unary_unary_rpc_method_handler(self._serve(method, request_type, answer))
        return grpc.unary_unary_rpc_method_handler(self._echo)

    def _serve(self, method: str, request_type: type[Message],
               answer: Callable[[Any], Message]) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def serve(raw: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls.append((method, raw))
                failure = self.fail.get(method)
            context.send_initial_metadata(((INITIAL_METADATA_KEY, method),))
            if failure is not None:
                context.abort(*failure)
            try:
                return answer(request_type.FromString(raw)).SerializeToString()
            except KeyError as exc:
                context.abort(grpc.StatusCode.NOT_FOUND, f"{method}: {exc.args[0]} not found")
                raise
        return serve

    def _echo(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        remaining = context.time_remaining()
        echo = {
            "metadata": sorted([k, v.hex() if isinstance(v, bytes) else v]
                               for k, v in context.invocation_metadata() if not k.startswith((":", "grpc-"))),
            "deadline": None if remaining is None or remaining > 1e8 else remaining,
            "request": raw.hex(),
        }
        context.set_trailing_metadata((("x-fake-trailer", "kept"),))
        context.abort(ECHO_CODE, json.dumps(echo))
        raise AssertionError("abort returned")

    def _mirror(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """Answers the request's own bytes: a message of any size, both ways."""
        return raw

    def _events(self, raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        sub: queue.Queue[cri.ContainerEventResponse | None] = queue.Queue()
        with self._lock:
            self.subscribers.append(sub)
        try:
            while context.is_active():
                try:
                    event = sub.get(timeout=0.1)
                except queue.Empty:
                    continue
                if event is None:
                    return
                yield event.SerializeToString()
        finally:
            with self._lock:
                self.subscribers.remove(sub)

    def subscriber_count(self) -> int:
        with self._lock:
            return len(self.subscribers)

    # -- the runtime -------------------------------------------------------------------------

    def _version(self, req: cri.VersionRequest) -> cri.VersionResponse:
        return cri.VersionResponse(version="0.1.0", runtime_name="fake", runtime_version="1",
                                   runtime_api_version="v1")

    def _exec_sync(self, req: cri.ExecSyncRequest) -> cri.ExecSyncResponse:
        """Runs nothing: ``["sleep", "<seconds>"]`` (at most 10) takes that long, anything else exits 0 at once.

        ``most_concurrent_execs`` records how many were in progress at once.
        """
        with self._lock:
            self._execs += 1
            self.most_concurrent_execs = max(self.most_concurrent_execs, self._execs)
        try:
            if len(req.cmd) == 2 and req.cmd[0] == "sleep":
                time.sleep(min(float(req.cmd[1]), 10.0))
        finally:
            with self._lock:
                self._execs -= 1
        return cri.ExecSyncResponse(exit_code=0)

    def _run_pod(self, req: cri.RunPodSandboxRequest) -> cri.RunPodSandboxResponse:
        sid = f"pod-{next(self._ids)}"
        self.pods[sid] = FakePod(req.config, cri.SANDBOX_READY, req.runtime_handler)
        event = cri.ContainerEventResponse(
            container_id=sid, container_event_type=cri.CONTAINER_STARTED_EVENT, created_at=time.time_ns(),
            pod_sandbox_status=cri.PodSandboxStatus(id=sid, metadata=req.config.metadata))
        with self._lock:
            for sub in self.subscribers:
                sub.put(event)
        return cri.RunPodSandboxResponse(pod_sandbox_id=sid)

    def _stop_pod(self, req: cri.StopPodSandboxRequest) -> cri.StopPodSandboxResponse:
        self.pods[req.pod_sandbox_id].state = cri.SANDBOX_NOTREADY
        return cri.StopPodSandboxResponse()

    def _remove_pod(self, req: cri.RemovePodSandboxRequest) -> cri.RemovePodSandboxResponse:
        self.remove_pod(req.pod_sandbox_id)
        return cri.RemovePodSandboxResponse()

    def _pod_status(self, req: cri.PodSandboxStatusRequest) -> cri.PodSandboxStatusResponse:
        pod = self.pods[req.pod_sandbox_id]
        info = {"pid": 1, "processStatus": "running", "runtimeHandler": pod.runtime_handler,
                "config": _as_json(pod.config), "runtimeSpec": {}}
        return cri.PodSandboxStatusResponse(
            status=cri.PodSandboxStatus(id=req.pod_sandbox_id, metadata=pod.config.metadata, state=pod.state,
                                        labels=pod.config.labels, annotations=pod.config.annotations,
                                        runtime_handler=pod.runtime_handler),
            info={"info": json.dumps(info)} if req.verbose else {})

    def _list_pods(self, req: cri.ListPodSandboxRequest) -> cri.ListPodSandboxResponse:
        want = req.filter.state.state if req.filter.HasField("state") else None
        return cri.ListPodSandboxResponse(items=[
            cri.PodSandbox(id=sid, metadata=p.config.metadata, state=p.state, labels=p.config.labels,
                           annotations=p.config.annotations, runtime_handler=p.runtime_handler)
            for sid, p in list(self.pods.items()) if want is None or p.state == want])

    def _create_container(self, req: cri.CreateContainerRequest) -> cri.CreateContainerResponse:
        if req.pod_sandbox_id not in self.pods:
            raise KeyError(f"sandbox {req.pod_sandbox_id}")
        cid = f"ctr-{next(self._ids)}"
        self.containers[cid] = FakeContainer(req.pod_sandbox_id, req.config, cri.CONTAINER_CREATED,
                                             _current_resources(req.config))
        return cri.CreateContainerResponse(container_id=cid)

    def _start_container(self, req: cri.StartContainerRequest) -> cri.StartContainerResponse:
        self.containers[req.container_id].state = cri.CONTAINER_RUNNING
        return cri.StartContainerResponse()

    def _stop_container(self, req: cri.StopContainerRequest) -> cri.StopContainerResponse:
        self.containers[req.container_id].state = cri.CONTAINER_EXITED
        return cri.StopContainerResponse()

    def _remove_container(self, req: cri.RemoveContainerRequest) -> cri.RemoveContainerResponse:
        self.containers.pop(req.container_id, None)
        return cri.RemoveContainerResponse()

    def _list_containers(self, req: cri.ListContainersRequest) -> cri.ListContainersResponse:
        want = req.filter.state.state if req.filter.HasField("state") else None
        return cri.ListContainersResponse(containers=[
            cri.Container(id=cid, pod_sandbox_id=c.sandbox_id, state=c.state, metadata=c.config.metadata,
                          labels=c.config.labels, annotations=c.config.annotations, created_at=c.created_at)
            for cid, c in list(self.containers.items()) if want is None or c.state == want])

    def _container_status(self, req: cri.ContainerStatusRequest) -> cri.ContainerStatusResponse:
        c = self.containers[req.container_id]
        info = {"sandboxID": c.sandbox_id, "pid": 2, "config": _as_json(c.config)}
        return cri.ContainerStatusResponse(
            status=cri.ContainerStatus(id=req.container_id, metadata=c.config.metadata, state=c.state,
                                       labels=c.config.labels, annotations=c.config.annotations,
                                       resources=cri.ContainerResources(linux=c.resources)),
            info={"info": json.dumps(info)} if req.verbose else {})

    def _update_resources(self, req: cri.UpdateContainerResourcesRequest) -> cri.UpdateContainerResourcesResponse:
        self.containers[req.container_id].resources.CopyFrom(req.linux)
        return cri.UpdateContainerResourcesResponse()
