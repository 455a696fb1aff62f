"""The Store: pod and container info the hooks need, kept in memory.

StartContainer carries only an id, so the info captured at RunPodSandbox and
CreateContainer (as sent to the backend, after hooks) is kept here and joined into
every later hook request.  Records are hook-protocol messages, so building a hook
request from them is a copy.

The store is rebuilt from the backend before the proxy serves (``rebuild``), and a
record it lacks is fetched on demand (``fetch_pod`` / ``fetch_container``) from the
backend's verbose status, by the builder koordlet's reconciler uses too.  All access happens on the proxy's
event loop, so no lock is needed.

The backend's answers are data from outside: containerd stores whatever bytes a client
sent, e.g. a sandbox name that is not UTF-8, which no protobuf string field decodes.
``BackendReader`` therefore decodes every answer itself, and a list is decoded item by
item, so one unreadable record is skipped with one log line instead of failing the whole
rebuild (and with it every start of the proxy).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TypeVar

import grpc
from cri_api.v1 import api_pb2 as cri
from google.protobuf.message import DecodeError, Message

from koord.hookapi import ContainerHookRequest, PodHookRequest, crilist, fromcri
from koord.hookapi.fromcri import StatusError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ContainerRecord:
    sandbox_id: str
    info: ContainerHookRequest
    """The container's half of a hook request: meta (with id), annotations, resources, envs."""


class Store:
    def __init__(self) -> None:
        self._pods: dict[str, PodHookRequest] = {}
        self._containers: dict[str, ContainerRecord] = {}

    def put_pod(self, sandbox_id: str, pod: PodHookRequest) -> None:
        self._pods[sandbox_id] = pod

    def get_pod(self, sandbox_id: str) -> PodHookRequest | None:
        return self._pods.get(sandbox_id)

    def delete_pod(self, sandbox_id: str) -> None:
        """Also drops the pod's containers: the backend removes them with the sandbox."""
        self._pods.pop(sandbox_id, None)
        for cid in [cid for cid, rec in self._containers.items() if rec.sandbox_id == sandbox_id]:
            del self._containers[cid]

    def put_container(self, container_id: str, record: ContainerRecord) -> None:
        self._containers[container_id] = record

    def get_container(self, container_id: str) -> ContainerRecord | None:
        return self._containers.get(container_id)

    def delete_container(self, container_id: str) -> None:
        self._containers.pop(container_id, None)

    def sizes(self) -> tuple[int, int]:
        return len(self._pods), len(self._containers)


_RUNTIME = "/runtime.v1.RuntimeService/"
_M = TypeVar("_M", bound=Message)
_Item = TypeVar("_Item", cri.PodSandbox, cri.Container)


class BackendReader:
    """The backend calls the store makes, with answers decoded here, never by grpc.

    grpc-python turns an answer its deserializer rejects into ``None`` (and an ERROR log
    line of its own); decoding here makes it a StatusError naming the record instead.
    """

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    async def call(self, method: str, request: Message, response_type: type[_M],
                   what: str, timeout: float) -> _M:
        raw = await self._channel.unary_unary(
            _RUNTIME + method, request_serializer=_serialize)(request, timeout=timeout)
        try:
            return response_type.FromString(raw)
        except DecodeError:
            raise StatusError(f"{what}: the backend's {method} answer does not decode "
                                "(a field that is not valid UTF-8?)") from None

    async def list_ids(self, method: str, request: Message, item_type: type[_Item], timeout: float) -> list[str]:
        """Ids of every item of a List* answer, including items that do not decode as a whole."""
        raw = await self._channel.unary_unary(
            _RUNTIME + method, request_serializer=_serialize)(request, timeout=timeout)
        try:
            items, unreadable = crilist.decode_items(raw, item_type)
        except crilist.ListError as exc:
            raise StatusError(f"the backend's {method} answer: {exc}") from None
        if "" in unreadable:
            log.warning("store rebuild: %d item(s) of the backend's %s answer have no readable id; "
                        "skipped", unreadable.count(""), method)
        return [item.id for item in items] + [i for i in unreadable if i]


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


async def fetch_pod(runtime: BackendReader, sandbox_id: str,
                    timeout: float = 10.0) -> PodHookRequest:
    resp = await runtime.call("PodSandboxStatus",
                              cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True),
                              cri.PodSandboxStatusResponse, f"sandbox {sandbox_id}", timeout)
    return fromcri.pod_record_from_status(resp, sandbox_id)


async def fetch_container(runtime: BackendReader, container_id: str,
                          timeout: float = 10.0) -> ContainerRecord:
    resp = await runtime.call("ContainerStatus",
                              cri.ContainerStatusRequest(container_id=container_id, verbose=True),
                              cri.ContainerStatusResponse, f"container {container_id}", timeout)
    sandbox_id, record = fromcri.container_record_from_status(resp, container_id)
    return ContainerRecord(sandbox_id=sandbox_id, info=record)


async def rebuild(store: Store, runtime: BackendReader, parallel: int = 16) -> None:
    """Fills ``store`` with every sandbox and container the backend knows.

    Raises grpc.aio.AioRpcError when the backend cannot be listed: the caller retries,
    because serving with a half-built store would hand plugins empty info.  A single
    record that cannot be read is logged once and skipped (it is fetched on demand later);
    a list answer that is not protobuf at all is logged and leaves the store empty.
    """
    try:
        pods = await runtime.list_ids("ListPodSandbox", cri.ListPodSandboxRequest(), cri.PodSandbox, 30)
        containers = await runtime.list_ids("ListContainers", cri.ListContainersRequest(), cri.Container, 30)
    except StatusError as exc:
        log.error("store rebuild: %s; starting with an empty store (records are fetched on demand)", exc)
        return
    limit = asyncio.Semaphore(parallel)

    async def load_pod(sandbox_id: str) -> None:
        async with limit:
            try:
                store.put_pod(sandbox_id, await fetch_pod(runtime, sandbox_id))
            except (StatusError, grpc.aio.AioRpcError) as exc:
                log.warning("store rebuild: skipping %s", describe_error(exc, f"sandbox {sandbox_id}"))

    async def load_container(container_id: str) -> None:
        async with limit:
            try:
                store.put_container(container_id, await fetch_container(runtime, container_id))
            except (StatusError, grpc.aio.AioRpcError) as exc:
                log.warning("store rebuild: skipping %s", describe_error(exc, f"container {container_id}"))

    await asyncio.gather(*(load_pod(p) for p in pods), *(load_container(c) for c in containers))


def describe_error(exc: Exception, what: str = "") -> str:
    prefix = f"{what}: " if what else ""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{prefix}{exc.code().name}: {exc.details()}"
    return f"{prefix}{exc}"
