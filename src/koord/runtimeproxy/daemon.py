"""What both backend modes (CRI and Docker) run around their server: stopping on signals, the
boxes that call plugins (metrics with their HTTP endpoint, the plugins manager, the runtime
dispatcher), and waiting for the backend before anything is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from koord.health import HealthServer

from .config import Options
from .dispatcher import RuntimeDispatcher
from .metrics import ProxyMetrics
from .pluginsmanager import PluginsManager

log = logging.getLogger("koord-runtime-proxy")

SHUTDOWN_GRACE_SECONDS = 10.0
"""How long in-flight calls may run after SIGTERM."""

BACKEND_PROBE_SECONDS = 2.0
"""How often the backend is probed for /readyz, and how long one probe may take."""


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, on the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


@dataclass
class HookBoxes:
    """Metrics (served with /healthz and /readyz), the plugins manager and the dispatcher."""

    metrics: ProxyMetrics
    plugins: PluginsManager
    dispatcher: RuntimeDispatcher
    health: HealthServer | None

    @classmethod
    def start(cls, options: Options, ready: Callable[[], tuple[bool, str]]) -> HookBoxes:
        metrics = ProxyMetrics()
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
        return cls(metrics, plugins, RuntimeDispatcher(plugins, metrics), health)

    async def close(self) -> None:
        self.plugins.stop()
        await self.dispatcher.close()
        if self.health is not None:
            self.health.stop()


async def wait_for_backend(attempt: Callable[[], Awaitable[object]], errors: tuple[type[Exception], ...],
                           describe: Callable[[Exception], str], what: str, stop: asyncio.Event) -> bool:
    """Runs ``attempt`` until it succeeds, retrying on ``errors`` with backoff (50 ms doubling to
    2 s) and logging every 5 s; False if told to stop first."""
    delay, waited, last_log = 0.05, 0.0, -10.0
    while not stop.is_set():
        try:
            await attempt()
        except errors as exc:
            if waited - last_log >= 5.0:
                log.warning("waiting for %s: %s", what, describe(exc))
                last_log = waited
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            waited += delay
            delay = min(delay * 2, 2.0)
            continue
        return True
    return False
