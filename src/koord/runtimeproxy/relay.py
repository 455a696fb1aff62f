"""What every pass-through handler of the CRI server does around the backend's call: pass the
caller's deadline and metadata on, the backend's headers and status back, and end a failed
call without keeping its request alive."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

_NO_DEADLINE = 1e8  # the sync API reports "no deadline" as a huge number, aio as None


async def unary_call(call: grpc.aio.UnaryUnaryCall, context: grpc.aio.ServicerContext) -> bytes:
    """The backend's answer to ``call``; its initial metadata (response headers) goes on to our caller."""
    try:
        response = await call
    except grpc.aio.AioRpcError as err:
        await send_headers(context, err.initial_metadata())
        raise
    await pass_initial_metadata(call, context)
    return response


async def pass_initial_metadata(call: grpc.aio.Call, context: grpc.aio.ServicerContext) -> None:
    await send_headers(context, await call.initial_metadata())


async def send_headers(context: grpc.aio.ServicerContext, metadata: Any) -> None:
    headers = user_metadata(metadata)
    if headers:
        with contextlib.suppress(grpc.aio.UsageError, ValueError):  # already sent (a second forward)
            await context.send_initial_metadata(headers)


def call_options(context: grpc.aio.ServicerContext) -> tuple[float | None, tuple[tuple[str, str], ...]]:
    remaining = context.time_remaining()
    timeout = None if remaining is None or remaining > _NO_DEADLINE else max(remaining, 0.001)
    metadata = tuple((m.key, m.value) for m in context.invocation_metadata() or ()
                     if not m.key.startswith((":", "grpc-")))
    return timeout, metadata


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str,
                 trailing: tuple[tuple[str, str], ...] = ()) -> NoReturn:
    """Ends the call with ``code``; grpc's abort always raises, which this signature tells the type checker."""
    await context.abort(code, details, trailing)
    raise AssertionError("grpc.aio ServicerContext.abort returned")


def user_metadata(metadata: Any) -> tuple[tuple[str, str], ...]:
    """What a proxy passes on: everything but pseudo-headers and grpc's own."""
    return tuple((k, v) for k, v in (metadata or ()) if not k.startswith((":", "grpc-")) and k != "content-type")


def trailing(err: grpc.aio.AioRpcError) -> tuple[tuple[str, str], ...]:
    return user_metadata(err.trailing_metadata())


@dataclass(frozen=True)
class Failure:
    """How a unary call ends when it fails, returned by its body instead of aborting where it stands.

    grpc.aio keeps the exception an abort raises, and with it the traceback: every frame it
    passed and, through ``__context__``, the backend's error and its frames. Aborting from a
    frame that held the request kept a request the backend refused in memory for good
    (+120 MiB after one 60 MiB request containerd refused); ``unary_handler`` aborts from
    a frame that no longer holds it, outside any ``except`` block.
    """

    code: grpc.StatusCode
    details: str | None
    trailing: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, err: grpc.aio.AioRpcError) -> Failure:
        return cls(err.code(), err.details(), trailing(err))


UnaryBody = Callable[[bytes, grpc.aio.ServicerContext], Awaitable["bytes | Failure"]]


def unary_handler(body: UnaryBody) -> grpc.RpcMethodHandler:
    async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        outcome = await body(request, context)
        del request  # see Failure
        if isinstance(outcome, Failure):
            await abort(context, outcome.code, outcome.details or "", outcome.trailing)
        return outcome

    return grpc.unary_unary_rpc_method_handler(handler)
