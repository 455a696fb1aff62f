"""The plugin side of NRI: connect to the runtime's socket, register, serve the Plugin service.

Flow (as containerd/nri's pkg/stub): dial the NRI socket, multiplex it, serve the Plugin
service on connection 1, call Runtime.RegisterPlugin on connection 2; the runtime then calls
Configure (the plugin answers its event subscription) and Synchronize (the pods and
containers that exist), then the subscribed events as they happen.

Handlers are plain functions run in a small thread pool, so koordlet's thread-based code can
be called as is; each call is bounded by ``handler_timeout`` (below containerd's 2 s NRI
request timeout, so the runtime gets our error rather than its own timeout). A handler that
raises or overruns is logged and answered with an error status; the stub keeps serving.

A session ends when the runtime goes away or the peer breaks the protocol; :meth:`run_once`
returns why, and :meth:`serve_forever` reports it to ``on_disconnect`` and reconnects with
backoff. Everything the stub does runs on one asyncio loop: :meth:`start` runs it in a
thread of its own for thread-based owners.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from google.protobuf.message import Message as PbMessage

from koord.nri import api_pb2 as api
from koord.nri import events
from koord.nri.frames import ProtocolError
from koord.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from koord.nri.rpc import Code, Method, RpcError, TtrpcClient, TtrpcServer

log = logging.getLogger(__name__)

DEFAULT_SOCKET_PATH = "/var/run/nri/nri.sock"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
API_VERSION = "v0.12.2"
"""The NRI release whose api.proto is vendored; sent as RegisterPluginRequest.NRI_version."""
SYNC_BYTES_MAX = 64 << 20
"""Bound on a Synchronize split over several requests (``more``), summed over its parts."""

PodHandler = Callable[[api.PodSandbox], None]
ContainerHandler = Callable[[api.PodSandbox, api.Container], None]
Updates = Sequence[api.ContainerUpdate] | None


@dataclass
class Handlers:
    """The plugin's functions, each optional; the events subscribed by default are those handled.

    - ``configure(request) -> mask | None``: the event mask to subscribe (``koord.nri.events.mask``);
      None subscribes the handled events. Cut down to what the runtime knows, see koord.nri.events.
    - ``synchronize(pods, containers) -> updates | None``: the runtime's state at (re)connection.
    - ``create_container(pod, container) -> ContainerAdjustment | CreateContainerResponse | None``:
      the adjustment of the container being created (a whole response also updates or evicts others).
    - ``update_container(pod, container, resources) -> updates | None`` and
      ``stop_container(pod, container) -> updates | None``: changes to any containers.
    - ``update_pod_sandbox(pod, overhead, resources)``, the pod events ``(pod)`` and the other
      container events ``(pod, container)``: notifications; their return value is ignored.
    - ``shutdown()``: the runtime is going down.
    """

    configure: Callable[[api.ConfigureRequest], int | None] | None = None
    synchronize: Callable[[list[api.PodSandbox], list[api.Container]], Updates] | None = None
    shutdown: Callable[[], None] | None = None
    run_pod_sandbox: PodHandler | None = None
    update_pod_sandbox: Callable[[api.PodSandbox, api.LinuxResources, api.LinuxResources], None] | None = None
    post_update_pod_sandbox: PodHandler | None = None
    stop_pod_sandbox: PodHandler | None = None
    remove_pod_sandbox: PodHandler | None = None
    create_container: Callable[[api.PodSandbox, api.Container],
                               api.ContainerAdjustment | api.CreateContainerResponse | None] | None = None
    post_create_container: ContainerHandler | None = None
    start_container: ContainerHandler | None = None
    post_start_container: ContainerHandler | None = None
    update_container: Callable[[api.PodSandbox, api.Container, api.LinuxResources], Updates] | None = None
    post_update_container: ContainerHandler | None = None
    stop_container: Callable[[api.PodSandbox, api.Container], Updates] | None = None
    remove_container: ContainerHandler | None = None

    def events(self) -> int:
        """The mask of the events that have a handler."""
        return events.mask(*(event for name, event in EVENT_OF.items() if getattr(self, name) is not None))


EVENT_OF: dict[str, int] = {f.name: api.Event.Value(f.name.upper()) for f in fields(Handlers)
                            if f.name not in ("configure", "synchronize", "shutdown")}
"""Handler name -> the Event it handles (the names are the Events', lower-cased)."""

POD_EVENT_METHODS = {"RunPodSandbox": (api.RunPodSandboxRequest, api.RunPodSandboxResponse),
                     "PostUpdatePodSandbox": (api.PostUpdatePodSandboxRequest, api.PostUpdatePodSandboxResponse),
                     "StopPodSandbox": (api.StopPodSandboxRequest, api.StopPodSandboxResponse),
                     "RemovePodSandbox": (api.RemovePodSandboxRequest, api.RemovePodSandboxResponse)}
CONTAINER_EVENT_METHODS = {
    "PostCreateContainer": (api.PostCreateContainerRequest, api.PostCreateContainerResponse),
    "StartContainer": (api.StartContainerRequest, api.StartContainerResponse),
    "PostStartContainer": (api.PostStartContainerRequest, api.PostStartContainerResponse),
    "PostUpdateContainer": (api.PostUpdateContainerRequest, api.PostUpdateContainerResponse),
    "RemoveContainer": (api.RemoveContainerRequest, api.RemoveContainerResponse)}
"""The notification methods NRI v0.10+ calls directly; older runtimes send them as StateChange."""


def _snake(method: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in method).lstrip("_")


NOTIFICATIONS: dict[str, bool] = {**{_snake(m): False for m in POD_EVENT_METHODS},
                                  **{_snake(m): True for m in CONTAINER_EVENT_METHODS}}
"""Notification handler name -> whether it takes the container too."""


R = TypeVar("R")
M = TypeVar("M", bound=PbMessage)


class NriStub:
    """One NRI plugin connection. See the module docstring for the flow; ``index`` is the
    two-digit invocation order (plugins run in ascending index)."""

    def __init__(self, name: str, index: str, handlers: Handlers, *, socket_path: str = DEFAULT_SOCKET_PATH,
                 on_disconnect: Callable[[str], None] | None = None, handler_timeout: float = 1.5,
                 registration_timeout: float = 5.0, workers: int = 4) -> None:
        if not name or "/" in name:
            raise ValueError(f"NRI plugin name {name!r}: must be non-empty and contain no '/'")
        if len(index) != 2 or not index.isdigit():
            raise ValueError(f"NRI plugin index {index!r}: must be two digits, e.g. '10'")
        self.name = name
        self.index = index
        self.handlers = handlers
        self.socket_path = socket_path
        self.on_disconnect = on_disconnect
        self.handler_timeout = handler_timeout
        self.registration_timeout = registration_timeout
        self.ready = threading.Event()
        """Set while registered and synchronized; cleared when the connection ends."""
        self.subscribed = 0
        """The event mask answered in the last Configure."""
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"nri-{name}")
        self._client: TtrpcClient | None = None
        self._server: TtrpcServer | None = None
        self._synced: asyncio.Event | None = None
        self._sync_parts: list[api.SynchronizeRequest] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ---- sessions -----------------------------------------------------------------------

    async def run_once(self) -> str:
        """Connects, registers and serves until the connection ends; returns why it ended."""
        self._loop = asyncio.get_running_loop()
        if self._stop is None:
            self._stop = asyncio.Event()
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError as err:
            return f"cannot connect to {self.socket_path}: {err}"
        mux: Mux
        server = TtrpcServer(lambda data: mux.send(PLUGIN_SERVICE_CONN, data), self._methods(),
                             handler_timeout=self.handler_timeout)
        client = TtrpcClient(lambda data: mux.send(RUNTIME_SERVICE_CONN, data))
        mux = Mux(reader, writer, {PLUGIN_SERVICE_CONN: server.receive, RUNTIME_SERVICE_CONN: client.receive})
        self._client, self._synced, self._sync_parts = client, asyncio.Event(), []
        self._server = server
        reading = asyncio.ensure_future(mux.run())
        stopping = asyncio.ensure_future(self._stop.wait())
        registering = asyncio.ensure_future(self._register(client))
        tasks = (reading, stopping, registering)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if registering.done() and not reading.done() and not stopping.done():
                if registering.exception() is not None:
                    reason = f"registration failed: {registering.exception()}"
                    log.error("NRI plugin %s-%s: %s", self.index, self.name, reason)
                    return reason
                self.ready.set()
                log.info("NRI plugin %s-%s registered at %s, subscribed to %s", self.index, self.name,
                         self.socket_path, ", ".join(events.names(self.subscribed)))
                await asyncio.wait((reading, stopping), return_when=asyncio.FIRST_COMPLETED)
            return self._ending(reading, server, client)
        finally:
            self.ready.clear()
            self._client = None
            for task in tasks:
                task.cancel()
            server.close()
            client.close(ConnectionError("NRI connection closed"))
            mux.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _ending(self, reading: asyncio.Future[None], server: TtrpcServer, client: TtrpcClient) -> str:
        """Why the session ended, logged: a stop, the runtime closing, or what broke the protocol."""
        if not reading.done():
            return "stopped"
        error = reading.exception()
        if error is None:
            try:
                server.check_complete()
                client.check_complete()
            except ProtocolError as err:
                error = err
        if error is None:
            reason = "the runtime closed the connection"
            log.warning("NRI plugin %s-%s: %s", self.index, self.name, reason)
        else:
            reason = f"{type(error).__name__}: {error}"
            log.error("NRI plugin %s-%s: connection closed: %s", self.index, self.name, reason)
        return reason

    async def _register(self, client: TtrpcClient) -> None:
        """RegisterPlugin, then wait for the runtime's Configure and Synchronize to be answered."""
        request = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index, NRI_version=API_VERSION)
        await client.call(RUNTIME_SERVICE, "RegisterPlugin", request, api.Empty, self.registration_timeout)
        assert self._synced is not None
        try:
            await asyncio.wait_for(self._synced.wait(), self.registration_timeout)
        except TimeoutError:
            raise RpcError(Code.DEADLINE_EXCEEDED, f"no Configure and Synchronize within "
                           f"{self.registration_timeout}s of registering") from None

    async def serve_forever(self, *, backoff: float = 0.5, backoff_max: float = 30.0, factor: float = 2.0,
                            steps: int | None = None) -> None:
        """Sessions until :meth:`stop`; each loss goes to ``on_disconnect``, then a retry after a
        delay that grows ``factor`` times per failed attempt, at most ``steps`` times (None:
        always) and up to ``backoff_max``, and starts over after a session that registered."""
        self._stop = asyncio.Event()
        if self._stopping.is_set():
            self._stop.set()
        delay, grown = backoff, 0
        while not self._stop.is_set():
            reason = await self.run_once()
            registered = self.subscribed != 0
            self.subscribed = 0
            if self._stop.is_set():
                break
            if self.on_disconnect is not None:
                try:
                    self.on_disconnect(reason)
                except Exception:
                    log.exception("NRI plugin %s-%s: on_disconnect raised", self.index, self.name)
            if registered:
                delay, grown = backoff, 0
            wait = delay
            if steps is None or grown < steps:
                delay, grown = min(delay * factor, backoff_max), grown + 1
            log.info("NRI plugin %s-%s: reconnecting in %.1fs (%s)", self.index, self.name, wait, reason)
            try:
                await asyncio.wait_for(self._stop.wait(), wait)
            except TimeoutError:
                pass

    def start(self, *, backoff: float = 0.5, backoff_max: float = 30.0, factor: float = 2.0,
              steps: int | None = None) -> None:
        """Runs :meth:`serve_forever` (same arguments) on a loop in a daemon thread of its own."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self.serve_forever(
            backoff=backoff, backoff_max=backoff_max, factor=factor, steps=steps)),
                                        name=f"nri-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the session and the reconnect loop for good; callable from any thread."""
        self._stopping.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- unsolicited updates --------------------------------------------------------------

    async def aupdate_containers(self, updates: Sequence[api.ContainerUpdate],
                                 evictions: Sequence[api.ContainerEviction] = (),
                                 timeout: float = 2.0) -> list[api.ContainerUpdate]:
        """Runtime.UpdateContainers; returns the updates the runtime failed to apply."""
        if self._client is None or not self.ready.is_set():
            raise ConnectionError(f"NRI plugin {self.name}: not connected to the runtime")
        request = api.UpdateContainersRequest(update=updates, evict=evictions)
        reply = await self._client.call(RUNTIME_SERVICE, "UpdateContainers", request,
                                        api.UpdateContainersResponse, timeout)
        return list(reply.failed)

    def update_containers(self, updates: Sequence[api.ContainerUpdate],
                          evictions: Sequence[api.ContainerEviction] = (),
                          timeout: float = 2.0) -> list[api.ContainerUpdate]:
        """:meth:`aupdate_containers` from a thread other than the stub's loop."""
        if self._loop is None:
            raise ConnectionError(f"NRI plugin {self.name}: not started")
        future = asyncio.run_coroutine_threadsafe(self.aupdate_containers(updates, evictions, timeout), self._loop)
        return future.result(timeout + 1.0)

    # ---- the Plugin service ---------------------------------------------------------------

    def _methods(self) -> dict[tuple[str, str], Method]:
        methods = {
            "Configure": Method(api.ConfigureRequest, self._configure),
            "Synchronize": Method(api.SynchronizeRequest, self._synchronize),
            "Shutdown": Method(api.Empty, self._shutdown),
            "CreateContainer": Method(api.CreateContainerRequest, self._create_container),
            "UpdateContainer": Method(api.UpdateContainerRequest, self._update_container),
            "StopContainer": Method(api.StopContainerRequest, self._stop_container),
            "UpdatePodSandbox": Method(api.UpdatePodSandboxRequest, self._update_pod_sandbox),
            "StateChange": Method(api.StateChangeEvent, self._state_change),
        }
        for name, (request, response) in (POD_EVENT_METHODS | CONTAINER_EVENT_METHODS).items():
            methods[name] = Method(request, self._notification(_snake(name), response))
        return {(PLUGIN_SERVICE, name): method for name, method in methods.items()}

    async def _run(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` in the handler pool; the server bounds the wait by handler_timeout."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _configure(self, request: api.ConfigureRequest) -> api.ConfigureResponse:
        log.info("NRI plugin %s-%s: configured by %s %s (NRI %s), request timeout %d ms", self.index, self.name,
                 request.runtime_name, request.runtime_version, request.NRI_version or "unreported",
                 request.request_timeout)
        if request.request_timeout > 0 and self._server is not None:
            self._server.handler_timeout = min(self.handler_timeout, request.request_timeout / 1000 * 0.75)
        wanted = self.handlers.events()
        if self.handlers.configure is not None:
            chosen = await self._run(self.handlers.configure, request)
            if chosen is not None:
                wanted = chosen
        known = events.runtime_events(request)
        if wanted & ~known:
            log.warning("NRI plugin %s-%s: %s %s does not know events %s; not subscribed", self.index, self.name,
                        request.runtime_name, request.runtime_version, ", ".join(events.names(wanted & ~known)))
        subscribed = wanted & known
        if subscribed == 0:
            # The runtime reads 0 as "every event": refuse rather than subscribe to everything.
            raise RpcError(Code.INVALID_ARGUMENT, f"plugin {self.name} subscribes to no event the runtime knows")
        self.subscribed = subscribed
        return api.ConfigureResponse(events=subscribed)

    async def _synchronize(self, request: api.SynchronizeRequest) -> api.SynchronizeResponse:
        self._sync_parts.append(request)
        if sum(part.ByteSize() for part in self._sync_parts) > SYNC_BYTES_MAX:
            self._sync_parts = []
            raise RpcError(Code.RESOURCE_EXHAUSTED, f"Synchronize exceeds {SYNC_BYTES_MAX} bytes over its parts")
        if request.more:
            return api.SynchronizeResponse(more=True)
        pods = [pod for part in self._sync_parts for pod in part.pods]
        containers = [container for part in self._sync_parts for container in part.containers]
        self._sync_parts = []
        updates: Updates = None
        if self.handlers.synchronize is not None:
            updates = await self._run(self.handlers.synchronize, pods, containers)
        if self._synced is not None:
            self._synced.set()
        return api.SynchronizeResponse(update=updates or ())

    async def _shutdown(self, _: api.Empty) -> api.Empty:
        log.info("NRI plugin %s-%s: the runtime is shutting down", self.index, self.name)
        if self.handlers.shutdown is not None:
            await self._run(self.handlers.shutdown)
        return api.Empty()

    async def _create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse:
        if self.handlers.create_container is None:
            return api.CreateContainerResponse()
        result = await self._run(self.handlers.create_container, request.pod, request.container)
        if isinstance(result, api.ContainerAdjustment):
            return api.CreateContainerResponse(adjust=result)
        if result is None or isinstance(result, api.CreateContainerResponse):
            return result or api.CreateContainerResponse()
        raise TypeError(f"create_container returned {type(result).__name__}; "
                        "expected ContainerAdjustment, CreateContainerResponse or None")

    async def _update_container(self, request: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        updates: Updates = None
        if self.handlers.update_container is not None:
            updates = await self._run(self.handlers.update_container, request.pod, request.container,
                                      request.linux_resources)
        return api.UpdateContainerResponse(update=updates or ())

    async def _stop_container(self, request: api.StopContainerRequest) -> api.StopContainerResponse:
        updates: Updates = None
        if self.handlers.stop_container is not None:
            updates = await self._run(self.handlers.stop_container, request.pod, request.container)
        return api.StopContainerResponse(update=updates or ())

    async def _update_pod_sandbox(self, request: api.UpdatePodSandboxRequest) -> api.UpdatePodSandboxResponse:
        if self.handlers.update_pod_sandbox is not None:
            await self._run(self.handlers.update_pod_sandbox, request.pod, request.overhead_linux_resources,
                            request.linux_resources)
        return api.UpdatePodSandboxResponse()

    def _notification(self, handler: str, response: type[M]) -> Callable[[Any], Awaitable[M]]:
        with_container = NOTIFICATIONS[handler]

        async def serve(request: Any) -> M:
            fn = getattr(self.handlers, handler)
            if fn is not None:
                await self._run(fn, request.pod, *((request.container,) if with_container else ()))
            return response()
        return serve

    async def _state_change(self, event: api.StateChangeEvent) -> api.Empty:
        """The pre-v0.10 way of delivering the notification events."""
        name = api.Event.Name(event.event).lower() if event.event in api.Event.values() else ""
        fn = getattr(self.handlers, name) if name in NOTIFICATIONS else None
        if fn is not None:
            with_container = NOTIFICATIONS[name]
            await self._run(fn, event.pod, *((event.container,) if with_container else ()))
        return api.Empty()
