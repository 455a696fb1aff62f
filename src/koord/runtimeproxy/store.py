"""The Store: pod and container info the hooks need, kept in memory.

StartContainer carries only an id, so the info captured at RunPodSandbox and
CreateContainer (as sent to the backend, after hooks) is kept here and joined into
every later hook request.  Records are hook-protocol messages, so building a hook
request from them is a copy.

The store is rebuilt from the backend before the proxy serves (``rebuild``), and a
record it lacks is fetched on demand (``fetch_pod`` / ``fetch_container``) from the
backend's verbose status, by the builder koordlet's reconciler uses too.  All access happens on the proxy's
event loop, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc

from koord.hookapi import ContainerHookRequest, PodHookRequest, fromcri
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


async def fetch_pod(runtime: cri_grpc.RuntimeServiceStub, sandbox_id: str,
                    timeout: float = 10.0) -> PodHookRequest:
    resp = await runtime.PodSandboxStatus(
        cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=timeout)
    return fromcri.pod_record_from_status(resp, sandbox_id)


async def fetch_container(runtime: cri_grpc.RuntimeServiceStub, container_id: str,
                          timeout: float = 10.0) -> ContainerRecord:
    resp = await runtime.ContainerStatus(
        cri.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=timeout)
    sandbox_id, record = fromcri.container_record_from_status(resp, container_id)
    return ContainerRecord(sandbox_id=sandbox_id, info=record)


async def rebuild(store: Store, runtime: cri_grpc.RuntimeServiceStub, parallel: int = 16) -> None:
    """Fills ``store`` with every sandbox and container the backend knows.

    Raises grpc.aio.AioRpcError when the backend cannot be listed: the caller retries,
    because serving with a half-built store would hand plugins empty info.  A single
    record that cannot be read is logged and skipped (it is fetched on demand later).
    """
    pods = (await runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=30)).items
    containers = (await runtime.ListContainers(cri.ListContainersRequest(), timeout=30)).containers
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

    await asyncio.gather(*(load_pod(p.id) for p in pods), *(load_container(c.id) for c in containers))


def describe_error(exc: Exception, what: str = "") -> str:
    prefix = f"{what}: " if what else ""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{prefix}{exc.code().name}: {exc.details()}"
    return f"{prefix}{exc}"
