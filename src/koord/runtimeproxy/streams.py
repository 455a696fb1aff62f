"""Long-lived server streams (``GetContainerEvents``) relayed from the backend to the caller.

A stream differs from a call in one way that matters to a proxy: it never finishes by itself.
kubelet's evented PLEG keeps one open for the node's lifetime, so a proxy that stops the way it
stops calls (finish what is in flight, within a grace period) would hold every stop for the
whole period and then cut the stream with whatever its transport says. Instead, when the
proxy begins to stop, each stream ends at once with UNAVAILABLE and a message saying why, the
backend's stream is cancelled, and the caller opens a new one (kubelet does on any error).

A stream that carries nothing for the idle timeout (``--data-plane-idle-timeout``, a day by
default) ends the same way. HAProxy's own timeouts are set longer, so that it is always this
clear ending a client sees, never HAProxy closing the stream without a gRPC status.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import grpc

T = TypeVar("T")

STOPPING_MESSAGE = "koord-runtime-proxy is stopping: open the stream again"


class StreamEnded(Exception):
    """The proxy ends the stream: ``str(self)`` is the message its client gets with UNAVAILABLE."""


class StreamRelay:
    """Relays backend streams until the backend ends them, the caller goes, or ``end_all``."""

    def __init__(self, idle_timeout: float) -> None:
        self._stopping = asyncio.Event()
        self.idle_timeout = idle_timeout

    def end_all(self) -> None:
        """Ends every open stream, and every stream opened from now on, with UNAVAILABLE."""
        self._stopping.set()

    async def _step(self, step: Awaitable[T], stopping: asyncio.Future[Any]) -> T:
        """``step``'s result; StreamEnded (``step`` cancelled) when ``end_all`` or the idle timeout comes first."""
        task = asyncio.ensure_future(step)
        done, _ = await asyncio.wait((task, stopping), timeout=self.idle_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await task
        if stopping in done:
            raise StreamEnded(STOPPING_MESSAGE)
        raise StreamEnded(f"koord-runtime-proxy: nothing came for {self.idle_timeout:g}s "
                          "(--data-plane-idle-timeout): open the stream again")

    async def messages(self, call: grpc.aio.UnaryStreamCall, headers: Awaitable[None]) -> AsyncIterator[bytes]:
        """The backend's messages, after ``headers`` (passing its initial metadata on) is done.

        Raises the backend's AioRpcError when it ends the stream with an error, and StreamEnded
        when the proxy ends it; the caller cancels the backend's stream in its ``finally``.
        """
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await self._step(headers, stopping)
            while True:
                message = await self._step(call.read(), stopping)
                if message is grpc.aio.EOF:
                    return
                yield message
        finally:
            stopping.cancel()
