"""A ttrpc server and client for unary calls over one byte stream each.

NRI uses ttrpc unary calls only, so streaming (DATA messages) is refused. The server
dispatches ``(service, method)`` to async handlers, bounds each call by a timeout and the
number of calls in flight, and answers every failure with a google.rpc.Status: UNIMPLEMENTED
for a method it does not have, INVALID_ARGUMENT for a payload that does not parse,
DEADLINE_EXCEEDED for a handler that overran, UNKNOWN (with the exception named) for a
handler that raised. Such answers keep the connection; only a framing error
(:class:`~koord.nri.frames.ProtocolError`) ends it, because after one the byte stream
cannot be trusted.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as PbMessage

from koord.nri import ttrpc_pb2
from koord.nri.frames import Message, MessageDecoder, MessageType, ProtocolError, encode_message

log = logging.getLogger(__name__)

Send = Callable[[bytes], Awaitable[None]]
Handler = Callable[[Any], Awaitable[PbMessage]]


class Code(enum.IntEnum):
    """The gRPC status codes ttrpc carries in google.rpc.Status.code."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class RpcError(Exception):
    """A call that ended with a non-OK status; handlers raise it to choose the code sent."""

    def __init__(self, code: Code | int, message: str) -> None:
        try:
            code = Code(code)
        except ValueError:
            pass
        self.code = code
        self.message = message
        super().__init__(f"{code.name if isinstance(code, Code) else code}: {message}")


@dataclass(frozen=True)
class Method:
    request_type: type[PbMessage]
    handler: Handler


class TtrpcServer:
    """Serves unary calls arriving through :meth:`receive`; answers through ``send``."""

    def __init__(self, send: Send, methods: dict[tuple[str, str], Method], *,
                 handler_timeout: float = 1.5, max_in_flight: int = 16) -> None:
        self._send = send
        self._methods = methods
        self.handler_timeout = handler_timeout
        self._max_in_flight = max_in_flight
        self._decoder = MessageDecoder("ttrpc server")
        self._last_stream_id = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def receive(self, data: bytes) -> None:
        """Bytes of the connection, in order; raises ProtocolError on a framing error."""
        for message in self._decoder.feed(data):
            self._dispatch(message)

    def _dispatch(self, message: Message) -> None:
        sid = message.stream_id
        if message.type != MessageType.REQUEST:
            raise ProtocolError(f"ttrpc server: {message.type.name} message on stream {sid}; "
                                "only unary requests are served")
        if sid % 2 != 1 or sid <= self._last_stream_id:
            self._answer_soon(sid, Code.INVALID_ARGUMENT, f"stream id {sid} must be odd and above "
                              f"{self._last_stream_id}")
            return
        self._last_stream_id = sid
        request = ttrpc_pb2.Request()
        try:
            request.ParseFromString(message.payload)
        except DecodeError as err:
            raise ProtocolError(f"ttrpc server: stream {sid}: request envelope does not parse: {err}") from None
        if len(self._tasks) >= self._max_in_flight:
            log.error("ttrpc: %s/%s refused: %d calls already in flight", request.service, request.method,
                      len(self._tasks))
            self._answer_soon(sid, Code.RESOURCE_EXHAUSTED, f"{len(self._tasks)} calls already in flight")
            return
        self._spawn(self._serve(sid, request))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answer_soon(self, sid: int, code: Code, message: str) -> None:
        self._spawn(self._respond(sid, ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message))))

    async def _serve(self, sid: int, request: ttrpc_pb2.Request) -> None:
        name = f"{request.service}/{request.method}"
        method = self._methods.get((request.service, request.method))
        if method is None:
            log.warning("ttrpc: %s is not implemented; answering UNIMPLEMENTED", name)
            await self._respond(sid, _failure(Code.UNIMPLEMENTED, f"{name} is not implemented"))
            return
        argument = method.request_type()
        try:
            argument.ParseFromString(request.payload)
        except DecodeError as err:
            log.error("ttrpc: %s: request payload does not parse as %s: %s", name,
                      method.request_type.__name__, err)
            await self._respond(sid, _failure(Code.INVALID_ARGUMENT, f"{name}: payload does not parse: {err}"))
            return
        timeout = self.handler_timeout
        if request.timeout_nano > 0:
            timeout = min(timeout, request.timeout_nano / 1e9)
        try:
            result = await asyncio.wait_for(method.handler(argument), timeout)
        except TimeoutError:
            log.error("ttrpc: %s: handler did not answer within %.2fs", name, timeout)
            response = _failure(Code.DEADLINE_EXCEEDED, f"{name}: handler did not answer within {timeout:.2f}s")
        except RpcError as err:
            log.error("ttrpc: %s failed: %s", name, err)
            response = _failure(err.code, err.message)
        except Exception as err:
            log.exception("ttrpc: %s: handler raised %s", name, type(err).__name__)
            response = _failure(Code.UNKNOWN, f"{name}: {type(err).__name__}: {err}")
        else:
            response = ttrpc_pb2.Response(payload=result.SerializeToString())
        await self._respond(sid, response)

    async def _respond(self, sid: int, response: ttrpc_pb2.Response) -> None:
        try:
            await self._send(encode_message(sid, MessageType.RESPONSE, response.SerializeToString()))
        except (OSError, ValueError) as err:
            log.warning("ttrpc: cannot answer stream %d: %s", sid, err)

    def check_complete(self) -> None:
        """At end of stream: raises ProtocolError if a message was cut short."""
        self._decoder.close()

    def close(self) -> None:
        """End of the connection: cancels the calls in flight."""
        for task in list(self._tasks):
            task.cancel()


def _failure(code: Code | int, message: str) -> ttrpc_pb2.Response:
    return ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message))


R = TypeVar("R", bound=PbMessage)


class TtrpcClient:
    """Makes unary calls through ``send``; answers arrive through :meth:`receive`."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._decoder = MessageDecoder("ttrpc client")
        self._stream_ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._closed: Exception | None = None

    def receive(self, data: bytes) -> None:
        for message in self._decoder.feed(data):
            if message.type != MessageType.RESPONSE:
                raise ProtocolError(f"ttrpc client: {message.type.name} message on stream {message.stream_id}; "
                                    "only responses to unary calls are expected")
            response = ttrpc_pb2.Response()
            try:
                response.ParseFromString(message.payload)
            except DecodeError as err:
                raise ProtocolError(f"ttrpc client: stream {message.stream_id}: response envelope "
                                    f"does not parse: {err}") from None
            future = self._pending.pop(message.stream_id, None)
            if future is None:
                log.warning("ttrpc client: response on stream %d, which has no call waiting (it timed out?)",
                            message.stream_id)
            elif not future.done():
                future.set_result(response)

    async def call(self, service: str, method: str, request: PbMessage, response_type: type[R],
                   timeout: float) -> R:
        """One call; raises RpcError on a failure status or timeout, ConnectionError once closed."""
        if self._closed is not None:
            raise ConnectionError(f"ttrpc client closed: {self._closed}")
        sid = next(self._stream_ids)
        envelope = ttrpc_pb2.Request(service=service, method=method, payload=request.SerializeToString(),
                                     timeout_nano=int(timeout * 1e9))
        future: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[sid] = future
        try:
            await self._send(encode_message(sid, MessageType.REQUEST, envelope.SerializeToString()))
            response = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RpcError(Code.DEADLINE_EXCEEDED, f"{service}/{method}: no answer within {timeout:.2f}s") from None
        finally:
            self._pending.pop(sid, None)
        if response.HasField("status") and response.status.code != Code.OK:
            raise RpcError(response.status.code, response.status.message)
        result = response_type()
        try:
            result.ParseFromString(response.payload)
        except DecodeError as err:
            raise RpcError(Code.INTERNAL, f"{service}/{method}: response does not parse as "
                           f"{response_type.__name__}: {err}") from None
        return result

    def check_complete(self) -> None:
        """At end of stream: raises ProtocolError if a message was cut short."""
        self._decoder.close()

    def close(self, reason: Exception) -> None:
        """Fails every waiting call with ConnectionError naming ``reason``."""
        self._closed = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"ttrpc connection closed: {reason}"))
        self._pending.clear()
