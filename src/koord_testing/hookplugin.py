"""A runtime plugin for tests: serves runtime.v1alpha1.RuntimeHookService on a unix socket
with our generated code, records every request, and answers what the test tells it to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from koord.hookapi import SERVICE, HookPoint, Registration

POD_HOOKS = tuple(h for h in HookPoint if h.is_pod)
ALL_HOOKS = tuple(HookPoint)

Answer = Callable[[object], object]
"""Takes the request, returns the response message (or raises grpc errors via abort)."""


@dataclass
class Behaviour:
    answer: Answer | None = None
    delay: float = 0.0
    error: tuple[grpc.StatusCode, str] | None = None
    raw: bytes | None = None
    """Answer these bytes instead of a message: a plugin whose answer does not decode."""


@dataclass
class RecordingPlugin:
    """One plugin server; ``behaviours[hook]`` decides each answer, ``calls`` records requests."""

    socket: Path
    name: str = "plugin"
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    calls: list[tuple[str, object]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def start(self) -> RecordingPlugin:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        server.add_generic_rpc_handlers((self._handler(),))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def registration(self, config_dir: Path, file_name: str, hooks: Iterable[str] = ALL_HOOKS,
                     failure_policy: str = "Ignore", timeout: float | None = None) -> Path:
        """Writes the plugin's registration file the way a real plugin would (atomically, 0644)."""
        return Registration.of(file_name.removesuffix(".json"), str(self.socket), failure_policy, hooks,
                               timeout).write(config_dir)

    def requests(self, hook: str) -> list:
        with self._lock:
            return [req for h, req in self.calls if h == hook]

    def hooks_seen(self) -> list[str]:
        with self._lock:
            return [h for h, _ in self.calls]

    def wait_for(self, hook: str, count: int = 1, timeout: float = 10.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.requests(hook)
            if len(got) >= count:
                return got
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: expected {count} {hook} call(s) within {timeout}s, "
                             f"saw {self.hooks_seen()}")

    def _handler(self) -> grpc.GenericRpcHandler:
        handlers = {
            hook.rpc: grpc.unary_unary_rpc_method_handler(
                self._serve(hook, hook.response_type),
                request_deserializer=hook.request_type.FromString,
                response_serializer=_serialize)
            for hook in HookPoint}
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _serve(self, hook: str, resp_type: type) -> Callable:
        def serve(request, context: grpc.ServicerContext):
            with self._lock:
                self.calls.append((hook, request))
            behaviour = self.behaviours.get(hook, Behaviour())
            if behaviour.delay:
                time.sleep(behaviour.delay)
            if behaviour.error is not None:
                context.abort(*behaviour.error)
            if behaviour.raw is not None:
                return behaviour.raw
            if behaviour.answer is not None:
                return behaviour.answer(request)
            return resp_type()
        return serve


def _serialize(message: object) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()  # type: ignore[attr-defined]
