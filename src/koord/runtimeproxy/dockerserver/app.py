"""Docker mode's start-up and shutdown, in the same order as the CRI mode's.

Wait for dockerd and rebuild the store from its containers, and only then open the socket,
so cri-dockerd never reaches a proxy that would hand plugins empty info.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from koord.health import HealthServer

from .. import store as store_mod
from ..config import Options
from ..dispatcher import RuntimeDispatcher
from ..metrics import ProxyMetrics
from ..pluginsmanager import PluginsManager
from .backend import BackendError, DockerBackend
from .intercept import Interceptor
from .server import DockerServer

log = logging.getLogger("koord-runtime-proxy")

SHUTDOWN_GRACE_SECONDS = 10.0
BACKEND_PROBE_SECONDS = 2.0


async def run(options: Options) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    metrics = ProxyMetrics()
    backend = DockerBackend(options.runtime_endpoint)
    store_ready = False

    def ready() -> tuple[bool, str]:
        if not store_ready:
            return False, "store not rebuilt yet"
        if not backend.reachable:
            return False, "dockerd not reachable"
        return True, "ok"

    health = None
    if options.metrics_address:
        health = HealthServer(options.metrics_address, metrics, ready)
        health.start()

    def publish_plugins() -> None:
        metrics.registered_plugins.set(len(plugins.snapshot()))
        metrics.invalid_registrations.set(len(plugins.invalid()))

    plugins = PluginsManager(options.hook_config_dir, default_timeout=options.hook_timeout,
                             on_change=publish_plugins)
    plugins.start()
    publish_plugins()
    store = store_mod.Store()
    dispatcher = RuntimeDispatcher(plugins, metrics)
    interceptor = Interceptor(backend, store, dispatcher, (options.skip_key, options.skip_val))

    def backend_down() -> None:
        backend.reachable = False

    try:
        if not await _rebuild(interceptor, stop, options):
            return 0
        store_ready = backend.reachable = True
        server = DockerServer(options.runtime_endpoint, interceptor, metrics, backend_down)
        await server.start(options.proxy_endpoint)
        log.info("serving the Docker API on %s, backend dockerd %s, hook config %s",
                 options.proxy_endpoint, options.runtime_endpoint, options.hook_config_dir)
        probe = asyncio.create_task(_probe(backend, store, metrics))
        await stop.wait()
        log.info("shutting down: finishing in-flight calls (at most %.0fs)", SHUTDOWN_GRACE_SECONDS)
        probe.cancel()
        await server.stop(SHUTDOWN_GRACE_SECONDS)
        Path(options.proxy_endpoint).unlink(missing_ok=True)
        return 0
    finally:
        plugins.stop()
        await dispatcher.close()
        if health is not None:
            health.stop()


async def _rebuild(interceptor: Interceptor, stop: asyncio.Event, options: Options) -> bool:
    """Waits for dockerd and rebuilds the store, retrying with backoff; False if told to stop."""
    delay, waited, last_log = 0.05, 0.0, -10.0
    while not stop.is_set():
        try:
            count = await interceptor.rebuild()
        except BackendError as exc:
            if waited - last_log >= 5.0:
                log.warning("waiting for dockerd %s: %s", options.runtime_endpoint, exc)
                last_log = waited
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
            waited += delay
            delay = min(delay * 2, 2.0)
            continue
        log.info("store rebuilt from dockerd: %d Kubernetes containers", count)
        return True
    return False


async def _probe(backend: DockerBackend, store: store_mod.Store, metrics: ProxyMetrics) -> None:
    while True:
        backend.reachable = await backend.ping(BACKEND_PROBE_SECONDS)
        pods, containers = store.sizes()
        metrics.store_pods.set(pods)
        metrics.store_containers.set(containers)
        await asyncio.sleep(BACKEND_PROBE_SECONDS)
