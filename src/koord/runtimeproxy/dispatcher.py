"""The Runtime Dispatcher: calls the registered plugins for one hook point.

Pre hooks are chained: every plugin registered for the hook point is called in file-name
order and sees the request as changed by those before it.  Each plugin has its own
timeout; a plugin that fails, times out or answers something invalid is an error for
that call only (it is called again next time).  With ``Fail`` the error fails the CRI
call; with ``Ignore`` the call goes on with the answers so far.  Post hooks only notify:
their errors are logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from koord.hookapi import ContainerHookResponse, FailurePolicy, HookPoint, PodHookResponse

from . import convert
from .metrics import ProxyMetrics
from .pluginsmanager import PluginRegistration, PluginsManager

log = logging.getLogger(__name__)

FAST_RECONNECT = (
    # A restarted plugin or runtime must be reachable again within a second, not after grpc's
    # 2-minute backoff. Not grpc.min_reconnect_backoff_ms: grpc takes it as the time one connection
    # attempt may take, and at 100 ms a busy server's first answer came too late, so calls failed
    # UNAVAILABLE ("timed out before receiving SETTINGS frame") with the server up.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
_CHANNEL_OPTIONS = (
    *FAST_RECONNECT,
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


class HookFailed(Exception):
    """A plugin with failure-policy Fail failed; the message names plugin, hook point and error."""


@dataclass(frozen=True)
class Target:
    """Who a hook call is about, for logs and error messages."""

    pod: str
    container: str = ""

    def __str__(self) -> str:
        return f"pod {self.pod}" + (f" container {self.container}" if self.container else "")


class _PluginError(Exception):
    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class RuntimeDispatcher:
    def __init__(self, plugins: PluginsManager, metrics: ProxyMetrics) -> None:
        self._plugins = plugins
        self._metrics = metrics
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[tuple[str, HookPoint], Callable] = {}

    def has_plugins(self, *hook_points: HookPoint) -> bool:
        """Lets the CRI server skip store look-ups (maybe a backend call) nobody needs."""
        return any(self._plugins.plugins_for(h) for h in hook_points)

    async def run_pre(self, hook_point: HookPoint, request, target: Target) -> bool:
        """Chains every plugin's answer into ``request`` in place; True when anything changed.

        Raises HookFailed when a plugin with failure-policy Fail fails.
        """
        set_by: dict[str, str] = {}
        for plugin in self._plugins.plugins_for(hook_point):
            try:
                answer = await self._call(plugin, hook_point, request, target)
            except _PluginError as exc:
                if plugin.failure_policy is FailurePolicy.FAIL:
                    raise HookFailed(f"runtime hook {hook_point} of plugin {plugin.name} "
                                     f"failed for {target}: {exc}") from None
                continue
            changed = (convert.merge_pod_response(request, answer) if hook_point.is_pod
                       else convert.merge_container_response(request, answer))
            for field in changed:
                earlier = set_by.get(field)
                if earlier is not None and earlier != plugin.name:
                    log.info("%s: plugin %s overrides %s set by plugin %s for %s",
                             hook_point, plugin.name, field, earlier, target)
                set_by[field] = plugin.name
        return bool(set_by)

    async def run_post(self, hook_point: HookPoint, request, target: Target) -> None:
        """Notifies every plugin; failures are logged and counted, never raised."""
        for plugin in self._plugins.plugins_for(hook_point):
            try:
                await self._call(plugin, hook_point, request, target)
            except _PluginError:
                pass

    async def _call(self, plugin: PluginRegistration, hook_point: HookPoint, request, target: Target):
        start = time.perf_counter()
        outcome = "ok"
        try:
            answer = _decode(hook_point.response_type, await self._ask(plugin, hook_point, request))
            problems = (convert.validate_pod_response(answer) if isinstance(answer, PodHookResponse)
                        else convert.validate_container_response(answer))
            if problems:
                raise _PluginError("invalid", "invalid answer: " + "; ".join(problems))
            return answer
        except _PluginError as exc:
            outcome = exc.outcome
            raise
        except asyncio.CancelledError:
            # The CRI caller gave up (its deadline passed): the plugin's answer never counted.
            outcome = "cancelled"
            raise
        finally:
            elapsed = time.perf_counter() - start
            self._metrics.observe_hook(plugin.name, hook_point.value, outcome, elapsed)
            level = logging.DEBUG if outcome == "ok" else logging.WARNING
            log.log(level, "%s plugin %s for %s: %s in %.1f ms (policy %s)", hook_point,
                    plugin.name, target, outcome, elapsed * 1000, plugin.failure_policy)

    async def _ask(self, plugin: PluginRegistration, hook_point: HookPoint, request) -> bytes:
        """One gRPC call, answer as raw bytes; every way it can fail becomes a _PluginError."""
        try:
            return await self._multicallable(plugin.endpoint, hook_point)(request, timeout=plugin.timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _PluginError("timeout", f"no answer within {plugin.timeout:g}s") from None
            outcome = "unavailable" if code is grpc.StatusCode.UNAVAILABLE else "error"
            raise _PluginError(outcome, f"{code.name}: {exc.details()}") from None
        except Exception as exc:  # a plugin's broken answer must fail its call, never the proxy
            raise _PluginError("error", f"{type(exc).__name__}: {exc}") from None

    def _multicallable(self, endpoint: str, hook_point: HookPoint) -> Callable:
        key = (endpoint, hook_point)
        call = self._calls.get(key)
        if call is None:
            channel = self._channels.get(endpoint)
            if channel is None:
                channel = grpc.aio.insecure_channel(f"unix://{endpoint}", options=_CHANNEL_OPTIONS)
                self._channels[endpoint] = channel
            # No response deserializer: grpc would turn an undecodable answer into None and
            # log it on its own; _decode makes it this plugin's "invalid" outcome instead.
            call = channel.unary_unary(hook_point.method,
                                       request_serializer=hook_point.request_type.SerializeToString)
            self._calls[key] = call
        return call

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._calls.clear()


def _decode(response_type: type[PodHookResponse] | type[ContainerHookResponse],
            raw: bytes) -> PodHookResponse | ContainerHookResponse:
    try:
        return response_type.FromString(raw)
    except DecodeError as exc:
        raise _PluginError("invalid", f"undecodable answer ({len(raw)} bytes): {exc}") from None
