"""Write a runtime plugin for koord-runtime-proxy in a few lines.

Modelled on containerd NRI's stub: a plugin implements only the handlers it needs, one
per hook point, and the SDK derives the hook points to register from the handlers it
finds::

    from koord.pluginsdk import ContainerRequest, ContainerResponse, RuntimePluginServer

    plugin = RuntimePluginServer("gpu-env", endpoint="/run/gpu-env.sock")

    @plugin.pre_create_container
    def inject(req: ContainerRequest) -> ContainerResponse | None:
        return ContainerResponse(envs={"HELLO": req.pod_meta.name})

    plugin.serve(config_dir="/etc/runtime/hookserver.d")

A handler gets the typed request and returns the changes (or None for none). A handler
that raises fails the hook call; the proxy then applies the registration's
``failure_policy``. The server and registration file are koordlet's own, so a plugin
behaves on the wire exactly like koordlet.

``PodMeta`` here is a request's pod identity (koordlet's ``HookPodMeta``): the SDK has
only the one, so it keeps the short name.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from koord.hookapi import FailurePolicy, HookPoint, Registration
from koord.koordlet.resources import KoordQoS, KubeQoS, Resources
from koord.koordlet.runtimehooks.hooks import Hooks
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    ContainerResponse,
    PodContext,
    PodRequest,
    PodResponse,
)
from koord.koordlet.runtimehooks.protocol import HookPodMeta as PodMeta
from koord.koordlet.runtimehooks.server import Network, RuntimeHookServer

__all__ = [
    "ContainerRequest", "ContainerResponse", "FailurePolicy", "KoordQoS", "KubeQoS",
    "PodMeta", "PodRequest", "PodResponse", "Resources", "RuntimePluginServer", "HookPoint",
]

DEFAULT_CONFIG_DIR = Path("/etc/runtime/hookserver.d")

PodHandler = Callable[[PodRequest], PodResponse | None]
ContainerHandler = Callable[[ContainerRequest], ContainerResponse | None]


class RuntimePluginServer:
    """One plugin: its handlers, its hook server and its registration file ``<name>.json``.

    ``endpoint`` is where the server listens (socket path, or host:port with
    ``network="tcp"``); ``host_endpoint`` is what the proxy is told, when it differs
    (e.g. the plugin runs in a container with the socket mounted elsewhere).
    """

    def __init__(self, name: str, endpoint: str, *, failure_policy: FailurePolicy | str = "Ignore",
                 network: str = Network.UNIX, host_endpoint: str | None = None) -> None:
        Registration.of(name, endpoint, failure_policy, [])  # the name and policy make a valid file
        self.name = name
        self.failure_policy = FailurePolicy(failure_policy)
        self.host_endpoint = host_endpoint
        self.hooks = Hooks(FailurePolicy.FAIL)
        self.server = RuntimeHookServer(self.hooks, network=network, addr=endpoint)
        self._config_dir: Path | None = None
        self._registration: Registration | None = None

    # One decorator per hook point; each returns the handler unchanged.
    def pre_run_pod_sandbox(self, fn: PodHandler) -> PodHandler:
        return self.handle_pod(HookPoint.PRE_RUN_POD_SANDBOX, fn)

    def post_stop_pod_sandbox(self, fn: PodHandler) -> PodHandler:
        return self.handle_pod(HookPoint.POST_STOP_POD_SANDBOX, fn)

    def pre_create_container(self, fn: ContainerHandler) -> ContainerHandler:
        return self.handle_container(HookPoint.PRE_CREATE_CONTAINER, fn)

    def pre_start_container(self, fn: ContainerHandler) -> ContainerHandler:
        return self.handle_container(HookPoint.PRE_START_CONTAINER, fn)

    def post_start_container(self, fn: ContainerHandler) -> ContainerHandler:
        return self.handle_container(HookPoint.POST_START_CONTAINER, fn)

    def post_stop_container(self, fn: ContainerHandler) -> ContainerHandler:
        return self.handle_container(HookPoint.POST_STOP_CONTAINER, fn)

    def pre_update_container_resources(self, fn: ContainerHandler) -> ContainerHandler:
        return self.handle_container(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, fn)

    def handle_pod(self, stage: HookPoint | str, fn: PodHandler) -> PodHandler:
        """Registers ``fn`` for pod hook point ``stage``; several handlers of one stage run in order."""
        stage = HookPoint(stage)

        def run(ctx: PodContext) -> None:
            response = fn(ctx.request)
            if response is not None:
                ctx.response.merge(_checked(response, PodResponse, fn, stage))

        self.hooks.register_pod(stage, self.name, fn.__name__, run)
        return fn

    def handle_container(self, stage: HookPoint | str, fn: ContainerHandler) -> ContainerHandler:
        """Registers ``fn`` for container hook point ``stage``; several handlers of one stage run in order."""
        stage = HookPoint(stage)

        def run(ctx: ContainerContext) -> None:
            response = fn(ctx.request)
            if response is not None:
                ctx.response.merge(_checked(response, ContainerResponse, fn, stage))

        self.hooks.register_container(stage, self.name, fn.__name__, run)
        return fn

    @property
    def stages(self) -> set[HookPoint]:
        return self.hooks.stages()

    def start(self, config_dir: Path | str = DEFAULT_CONFIG_DIR) -> None:
        """Serves, then registers: the proxy never sees an endpoint that does not answer yet."""
        if not self.stages:
            raise ValueError(f"plugin {self.name}: no handlers; decorate at least one function")
        self.server.start()
        self._config_dir = Path(config_dir)
        self._registration = Registration.of(self.name, self.host_endpoint or self.server.endpoint,
                                             self.failure_policy, self.stages)
        self._registration.write(self._config_dir)

    def stop(self) -> None:
        """Unregisters, then stops serving."""
        if self._registration is not None and self._config_dir is not None:
            self._registration.remove(self._config_dir)
            self._registration = None
        self.server.stop()

    def serve(self, config_dir: Path | str = DEFAULT_CONFIG_DIR) -> None:
        """start(), block until SIGTERM or SIGINT, stop()."""
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        self.start(config_dir)
        try:
            stopping.wait()
        finally:
            self.stop()


_R = TypeVar("_R", PodResponse, ContainerResponse)


def _checked(response: object, want: type[_R], fn: Callable[..., object], stage: HookPoint) -> _R:
    """A handler written without type checking may return anything; say which handler and what it should."""
    if not isinstance(response, want):
        raise TypeError(f"handler {getattr(fn, '__name__', fn)} returned {type(response).__name__}; "
                        f"{stage} handlers return {want.__name__} or None")
    return response
