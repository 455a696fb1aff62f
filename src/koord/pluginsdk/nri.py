"""Write an NRI plugin in a few lines: decorate the handlers, then ``serve()``.

The NRI counterpart of :class:`koord.pluginsdk.RuntimePluginServer`: instead of being called
by koord-runtime-proxy, the plugin connects to the runtime's NRI socket (containerd 1.7+, on
by default from 2.0) and is called on the events it handles::

    from koord.pluginsdk.nri import NriPlugin, api

    plugin = NriPlugin("hello", index="50")

    @plugin.create_container
    def hello(pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        adjust = api.ContainerAdjustment()
        adjust.env.add(key="HELLO", value=pod.name)
        return adjust

    plugin.serve()

The handlers' signatures and return values are those of :class:`koord.nri.stub.Handlers`;
the messages are NRI's own (``api`` is the generated module of NRI's api.proto). The events
subscribed are the handled ones unless a ``configure`` handler chooses.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TypeVar

from koord.nri import api_pb2 as api
from koord.nri import events
from koord.nri.stub import DEFAULT_SOCKET_PATH, Handlers, NriStub

__all__ = ["DEFAULT_SOCKET_PATH", "NriPlugin", "api", "events"]

F = TypeVar("F", bound=Callable[..., object])


class NriPlugin:
    """A name, a two-digit index (plugins run in ascending index order) and handlers."""

    def __init__(self, name: str, index: str = "50", *, socket_path: str = DEFAULT_SOCKET_PATH,
                 on_disconnect: Callable[[str], None] | None = None) -> None:
        self.handlers = Handlers()
        self.stub = NriStub(name, index, self.handlers, socket_path=socket_path, on_disconnect=on_disconnect)

    def _set(self, field: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            setattr(self.handlers, field, fn)
            return fn
        return register

    # One decorator per handler of koord.nri.stub.Handlers; each returns the function unchanged.
    @property
    def configure(self) -> Callable[[F], F]:
        return self._set("configure")

    @property
    def synchronize(self) -> Callable[[F], F]:
        return self._set("synchronize")

    @property
    def shutdown(self) -> Callable[[F], F]:
        return self._set("shutdown")

    @property
    def run_pod_sandbox(self) -> Callable[[F], F]:
        return self._set("run_pod_sandbox")

    @property
    def update_pod_sandbox(self) -> Callable[[F], F]:
        return self._set("update_pod_sandbox")

    @property
    def post_update_pod_sandbox(self) -> Callable[[F], F]:
        return self._set("post_update_pod_sandbox")

    @property
    def stop_pod_sandbox(self) -> Callable[[F], F]:
        return self._set("stop_pod_sandbox")

    @property
    def remove_pod_sandbox(self) -> Callable[[F], F]:
        return self._set("remove_pod_sandbox")

    @property
    def create_container(self) -> Callable[[F], F]:
        return self._set("create_container")

    @property
    def post_create_container(self) -> Callable[[F], F]:
        return self._set("post_create_container")

    @property
    def start_container(self) -> Callable[[F], F]:
        return self._set("start_container")

    @property
    def post_start_container(self) -> Callable[[F], F]:
        return self._set("post_start_container")

    @property
    def update_container(self) -> Callable[[F], F]:
        return self._set("update_container")

    @property
    def post_update_container(self) -> Callable[[F], F]:
        return self._set("post_update_container")

    @property
    def stop_container(self) -> Callable[[F], F]:
        return self._set("stop_container")

    @property
    def remove_container(self) -> Callable[[F], F]:
        return self._set("remove_container")

    def start(self) -> None:
        """Connects in a background thread and stays connected (reconnecting with backoff)."""
        if not self.handlers.events() and self.handlers.configure is None:
            raise ValueError(f"NRI plugin {self.stub.name}: no event handlers; decorate at least one function")
        self.stub.start()

    def stop(self) -> None:
        self.stub.stop()

    def serve(self) -> None:
        """start(), block until SIGTERM or SIGINT, stop()."""
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        self.start()
        try:
            stopping.wait()
        finally:
            self.stop()
