"""Docker mode's start-up and shutdown, in the same order as the CRI mode's.

Wait for dockerd and rebuild the store from its containers, and only then open the socket,
so cri-dockerd never reaches a proxy that would hand plugins empty info.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from .. import store as store_mod
from ..config import Options
from ..daemon import BACKEND_PROBE_SECONDS, SHUTDOWN_GRACE_SECONDS, HookBoxes, stop_on_signals, wait_for_backend
from ..metrics import ProxyMetrics
from .backend import BackendError, DockerBackend
from .intercept import Interceptor
from .server import DockerServer

log = logging.getLogger("koord-runtime-proxy")


async def run(options: Options) -> int:
    stop = stop_on_signals()
    backend = DockerBackend(options.runtime_endpoint)
    store_ready = False

    def ready() -> tuple[bool, str]:
        if not store_ready:
            return False, "store not rebuilt yet"
        if not backend.reachable:
            return False, "dockerd not reachable"
        return True, "ok"

    boxes = HookBoxes.start(options, ready)
    metrics = boxes.metrics
    store = store_mod.Store()
    interceptor = Interceptor(backend, store, boxes.dispatcher, (options.skip_key, options.skip_val))

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
        await boxes.close()


async def _rebuild(interceptor: Interceptor, stop: asyncio.Event, options: Options) -> bool:
    """Waits for dockerd and rebuilds the store, retrying with backoff; False if told to stop."""
    if not await wait_for_backend(interceptor.rebuild, (BackendError,), str, f"dockerd {options.runtime_endpoint}",
                                  stop):
        return False
    pods, containers = interceptor.store.sizes()
    log.info("store rebuilt from dockerd: %d pods, %d containers", pods, containers)
    return True


async def _probe(backend: DockerBackend, store: store_mod.Store, metrics: ProxyMetrics) -> None:
    while True:
        backend.reachable = await backend.ping(BACKEND_PROBE_SECONDS)
        pods, containers = store.sizes()
        metrics.store_pods.set(pods)
        metrics.store_containers.set(containers)
        await asyncio.sleep(BACKEND_PROBE_SECONDS)
