"""koord-runtime-proxy's entry point: parses flags, wires the proxy's boxes, serves.

Start-up order matters: wait for the backend, rebuild the store, and only then open the
socket, so kubelet never reaches a proxy that would hand plugins empty info.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import grpc
from cri_api.v1 import api_pb2 as cri

from koord import klog, rlimits
from koord.hookapi import SOCKET_MODE, prepare_socket

from . import dataplane, memtrim
from . import store as store_mod
from .config import BackendMode, OptionError, Options, parse_options
from .criserver import CHANNEL_OPTIONS, SERVER_OPTIONS, Backend, CRIServer, cri_paths, python_paths
from .daemon import BACKEND_PROBE_SECONDS, SHUTDOWN_GRACE_SECONDS, HookBoxes, stop_on_signals, wait_for_backend
from .dockerserver import app as docker_app
from .metrics import ProxyMetrics

log = logging.getLogger("koord-runtime-proxy")



def main(argv: list[str] | None = None) -> int:
    memtrim.limit_arenas()  # before grpc starts its threads
    rlimits.raise_open_file_limit()
    try:
        options = parse_options(argv)
    except OptionError as exc:
        print(f"koord-runtime-proxy: {exc}", file=sys.stderr)
        return 2
    klog.configure(klog.python_level(options.log_level, options.verbosity), [logging.StreamHandler(sys.stderr)],
                   options.logging_format)
    if options.backend_mode is BackendMode.DOCKER:
        log.info("data plane: python (Docker mode serves the Docker API itself)")
        serve = docker_app.run(options)
    else:
        try:
            plane, why, haproxy = dataplane.choose(options.data_plane)
        except dataplane.DataPlaneError as exc:
            print(f"koord-runtime-proxy: {exc}", file=sys.stderr)
            return 2
        log.info("data plane: %s, because %s", plane, why)
        serve = run(options, haproxy)
    try:
        return asyncio.run(serve)
    except KeyboardInterrupt:
        return 0
    except dataplane.DataPlaneError as exc:
        log.error("%s", exc)
        return 1


class _State:
    """What /readyz reports: the store is rebuilt and the backend answered recently.

    With HAProxy also: HAProxy runs, and the last Version call through the public socket
    (HAProxy, then the backend) was answered.
    """

    def __init__(self, backend: Backend) -> None:
        self.store_ready = False
        self.backend = backend
        self.haproxy: dataplane.Supervisor | None = None
        self.public_answered = False

    def ready(self) -> tuple[bool, str]:
        if not self.store_ready:
            return False, "store not rebuilt yet"
        if not self.backend.reachable:
            return False, "backend not reachable"
        if self.haproxy is not None:
            if not self.haproxy.alive:
                return False, "haproxy is not running"
            if not self.public_answered:
                return False, "Version through the public socket was not answered"
        return True, "ok"


async def run(options: Options, haproxy: str | None = None) -> int:
    """Serves until SIGTERM; with ``haproxy`` (its binary) HAProxy serves the public socket."""
    stop = stop_on_signals()
    backend = Backend(options.runtime_endpoint, options.image_endpoint)
    state = _State(backend)
    boxes = HookBoxes.start(options, state.ready)
    metrics, dispatcher = boxes.metrics, boxes.dispatcher
    store = store_mod.Store()
    try:
        if not await _prepare(backend, store, state, stop, options):
            return 0
        server = grpc.aio.server(options=SERVER_OPTIONS)
        cri_server = CRIServer(backend, store, dispatcher, metrics, (options.skip_key, options.skip_val),
                               options.data_plane_idle_timeout)
        server.add_generic_rpc_handlers((cri_server,))
        layout = None
        if haproxy is None:
            python_socket, python_mode = options.proxy_endpoint, SOCKET_MODE
            prepare_socket(Path(options.proxy_endpoint))
        else:
            layout = dataplane.Layout.for_public_socket(options.proxy_endpoint)
            layout.prepare()
            python_socket, python_mode = str(layout.hooked_socket), 0o600
        server.add_insecure_port(f"unix://{python_socket}")
        await server.start()
        os.chmod(python_socket, python_mode)
        if layout is not None and haproxy is not None:
            try:
                state.haproxy = await _start_haproxy(haproxy, layout, options, metrics)
            except BaseException:
                await server.stop(0)
                layout.remove()
                raise
        log.info("serving CRI on %s, backend %s (images %s), hook config %s",
                 options.proxy_endpoint, options.runtime_endpoint, options.image_endpoint,
                 options.hook_config_dir)
        probe = asyncio.create_task(_probe_backend(backend, state, store, metrics, options))
        await stop.wait()
        probe.cancel()
        # Event streams never finish by themselves: end them first, so that neither HAProxy's
        # soft stop nor the grace period below waits for them, and their clients reopen at once.
        cri_server.streams.end_all()
        if state.haproxy is not None:
            # HAProxy first: stopping Python first fails calls HAProxy is still sending it.
            log.info("shutting down: stopping haproxy (in-flight calls get at most %.0fs)",
                     dataplane.HARD_STOP_AFTER)
            await state.haproxy.stop()
        log.info("shutting down: finishing in-flight calls (at most %.0fs)", SHUTDOWN_GRACE_SECONDS)
        await server.stop(SHUTDOWN_GRACE_SECONDS)
        Path(options.proxy_endpoint).unlink(missing_ok=True)
        if layout is not None:
            layout.remove()
        return 0
    finally:
        await boxes.close()
        await backend.close()


async def _prepare(backend: Backend, store: store_mod.Store, state: _State,
                   stop: asyncio.Event, options: Options) -> bool:
    """Waits for the backend and rebuilds the store, retrying with backoff; False if told to stop."""
    if not await wait_for_backend(lambda: store_mod.rebuild(store, backend.reader), (grpc.aio.AioRpcError,),
                                  store_mod.describe_error, f"backend {options.runtime_endpoint}", stop):
        return False
    pods, containers = store.sizes()
    log.info("store rebuilt from the backend: %d pods, %d containers", pods, containers)
    state.store_ready = backend.reachable = True
    return True


async def _start_haproxy(binary: str, layout: dataplane.Layout, options: Options,
                         metrics: ProxyMetrics) -> dataplane.Supervisor:
    routes = dataplane.Routes(options.proxy_endpoint, python_paths(), sorted(cri_paths()),
                              options.runtime_endpoint, options.image_endpoint)
    dataplane.write_config(routes, layout, options.data_plane_idle_timeout)
    prepare_socket(Path(options.proxy_endpoint))
    supervisor = dataplane.Supervisor(binary, layout, options.proxy_endpoint, options.data_plane_start_timeout)
    metrics.registry.register(dataplane.HAProxyCollector(layout, routes, lambda: supervisor.restarts))
    await supervisor.start()
    log.info("haproxy sends the %d hooked and streaming paths to %s, the rest to the backend", len(routes.python_paths),
             layout.hooked_socket)
    return supervisor


async def _probe_backend(backend: Backend, state: _State, store: store_mod.Store,
                         metrics: ProxyMetrics, options: Options) -> None:
    public = None
    if state.haproxy is not None:
        public = grpc.aio.insecure_channel(f"unix://{options.proxy_endpoint}", options=CHANNEL_OPTIONS)
    try:
        while True:
            if public is not None:  # first: a client can already call through HAProxy while this runs
                try:
                    await public.unary_unary("/runtime.v1.RuntimeService/Version")(
                        cri.VersionRequest().SerializeToString(), timeout=BACKEND_PROBE_SECONDS)
                    state.public_answered = True
                except grpc.aio.AioRpcError:
                    state.public_answered = False
            try:
                await backend.runtime.Version(cri.VersionRequest(), timeout=BACKEND_PROBE_SECONDS)
                backend.reachable = True
            except grpc.aio.AioRpcError:
                backend.reachable = False
            pods, containers = store.sizes()
            metrics.store_pods.set(pods)
            metrics.store_containers.set(containers)
            await asyncio.sleep(BACKEND_PROBE_SECONDS)
    finally:
        if public is not None:
            await public.close()

