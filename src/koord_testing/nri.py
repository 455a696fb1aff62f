"""A scripted NRI runtime for tests: the runtime's half of the wire, in-process.

It listens on a unix socket, serves Runtime.RegisterPlugin and UpdateContainers on mux
connection 2 and calls the plugin's Plugin service on connection 1, so a test drives a stub
through registration, Configure, Synchronize and any event without containerd, including
the runtime versions and failures a real containerd cannot be made to show on demand.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from google.protobuf.message import Message as PbMessage

from koord.nri import api_pb2 as api
from koord.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from koord.nri.rpc import Method, TtrpcClient, TtrpcServer
from koord.nri.stub import PLUGIN_SERVICE, RUNTIME_SERVICE

M = TypeVar("M", bound=PbMessage)


class FakeRuntime:
    """One plugin connection at a time; ``registrations`` and ``updates`` record what came in."""

    def __init__(self, socket_path: str, *, runtime_name: str = "containerd", runtime_version: str = "2.1.9",
                 nri_version: str = "", request_timeout_ms: int = 2000) -> None:
        self.socket_path = socket_path
        self.configure_request = api.ConfigureRequest(runtime_name=runtime_name, runtime_version=runtime_version,
                                                      NRI_version=nri_version, request_timeout=request_timeout_ms,
                                                      registration_timeout=5000)
        self.registrations: list[api.RegisterPluginRequest] = []
        self.updates: list[api.UpdateContainersRequest] = []
        self.failed_updates: list[api.ContainerUpdate] = []
        self._registered: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._client: TtrpcClient | None = None
        self._mux: Mux | None = None
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> FakeRuntime:
        self._registered = asyncio.Event()
        self._server = await asyncio.start_unix_server(self._accept, path=self.socket_path)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mux: Mux
        server = TtrpcServer(lambda data: mux.send(RUNTIME_SERVICE_CONN, data), {
            (RUNTIME_SERVICE, "RegisterPlugin"): Method(api.RegisterPluginRequest, self._register),
            (RUNTIME_SERVICE, "UpdateContainers"): Method(api.UpdateContainersRequest, self._update),
        })
        self._client = TtrpcClient(lambda data: mux.send(PLUGIN_SERVICE_CONN, data))
        mux = Mux(reader, writer, {PLUGIN_SERVICE_CONN: self._client.receive, RUNTIME_SERVICE_CONN: server.receive})
        self._mux = mux
        self._reading = asyncio.ensure_future(mux.run())

    async def _register(self, request: api.RegisterPluginRequest) -> api.Empty:
        self.registrations.append(request)
        assert self._registered is not None
        self._registered.set()
        return api.Empty()

    async def _update(self, request: api.UpdateContainersRequest) -> api.UpdateContainersResponse:
        self.updates.append(request)
        return api.UpdateContainersResponse(failed=self.failed_updates)

    async def wait_registered(self, timeout: float = 5.0) -> api.RegisterPluginRequest:
        assert self._registered is not None
        await asyncio.wait_for(self._registered.wait(), timeout)
        return self.registrations[-1]

    async def call(self, method: str, request: PbMessage, response_type: type[M], timeout: float = 2.0) -> M:
        """Plugin.<method>, as the runtime calls it."""
        assert self._client is not None, "no plugin connected"
        return await self._client.call(PLUGIN_SERVICE, method, request, response_type, timeout)

    async def handshake(self, pods: list[api.PodSandbox] | None = None,
                        containers: list[api.Container] | None = None) -> tuple[int, list[api.ContainerUpdate]]:
        """Waits for RegisterPlugin, then Configure and Synchronize as a runtime does; returns
        the plugin's event mask and its synchronization updates."""
        await self.wait_registered()
        configured = await self.call("Configure", self.configure_request, api.ConfigureResponse)
        synced = await self.call("Synchronize", api.SynchronizeRequest(pods=pods, containers=containers),
                                 api.SynchronizeResponse)
        return configured.events, list(synced.update)

    def drop(self) -> None:
        """Closes the plugin's connection, as a runtime going away does; the next
        :meth:`wait_registered` waits for the plugin to register again."""
        if self._mux is not None:
            self._mux.close()
        self._registered = asyncio.Event()

    async def close(self) -> None:
        self.drop()
        if self._reading is not None:
            self._reading.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

