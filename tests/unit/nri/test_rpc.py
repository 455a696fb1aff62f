"""The ttrpc server and client over a socketpair: calls, every error answer, timeouts, bad peers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from koord.nri import api_pb2 as api
from koord.nri import ttrpc_pb2
from koord.nri.frames import MessageDecoder, MessageType, ProtocolError, encode_message
from koord.nri.rpc import Code, Method, RpcError, TtrpcClient, TtrpcServer

SERVICE = "test.Echo"


async def echo(request: api.KeyValue) -> api.KeyValue:
    return api.KeyValue(key=request.key, value=request.value.upper())


async def boom(request: api.KeyValue) -> api.KeyValue:
    raise ValueError("no such key")


async def refuse(request: api.KeyValue) -> api.KeyValue:
    raise RpcError(Code.INVALID_ARGUMENT, "bad key")


async def slow(request: api.KeyValue) -> api.KeyValue:
    await asyncio.sleep(10)
    return request


METHODS = {(SERVICE, name): Method(api.KeyValue, fn)
           for name, fn in {"Echo": echo, "Boom": boom, "Refuse": refuse, "Slow": slow}.items()}


async def pump(reader: asyncio.StreamReader, receive: Callable[[bytes], None]) -> None:
    while data := await reader.read(4096):
        receive(data)


def sender(writer: asyncio.StreamWriter) -> Callable[[bytes], Awaitable[None]]:
    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()
    return send


async def with_pair(body: Callable[[TtrpcClient, asyncio.StreamWriter], Awaitable[None]],
                    handler_timeout: float = 0.3) -> None:
    left, right = socket.socketpair()
    s_reader, s_writer = await asyncio.open_unix_connection(sock=left)
    c_reader, c_writer = await asyncio.open_unix_connection(sock=right)
    server = TtrpcServer(sender(s_writer), METHODS, handler_timeout=handler_timeout)
    client = TtrpcClient(sender(c_writer))
    tasks = [asyncio.ensure_future(pump(s_reader, server.receive)),
             asyncio.ensure_future(pump(c_reader, client.receive))]
    try:
        await body(client, c_writer)
    finally:
        for task in tasks:
            task.cancel()
        s_writer.close()
        c_writer.close()


def run(body: Callable[[TtrpcClient, asyncio.StreamWriter], Awaitable[None]]) -> None:
    asyncio.run(with_pair(body))


def test_a_call_is_answered() -> None:
    async def body(client: TtrpcClient, _: asyncio.StreamWriter) -> None:
        for word in ("a", "bc", "def"):
            reply = await client.call(SERVICE, "Echo", api.KeyValue(key="k", value=word), api.KeyValue, 2)
            assert reply == api.KeyValue(key="k", value=word.upper())
    run(body)


@pytest.mark.parametrize(("method", "code", "text"), [
    ("Nope", Code.UNIMPLEMENTED, "test.Echo/Nope is not implemented"),
    ("Boom", Code.UNKNOWN, "test.Echo/Boom: ValueError: no such key"),
    ("Refuse", Code.INVALID_ARGUMENT, "bad key"),
    ("Slow", Code.DEADLINE_EXCEEDED, "handler did not answer within 0.30s"),
])
def test_failures_are_answered_with_a_status(method: str, code: Code, text: str) -> None:
    async def body(client: TtrpcClient, _: asyncio.StreamWriter) -> None:
        with pytest.raises(RpcError) as caught:
            await client.call(SERVICE, method, api.KeyValue(key="k"), api.KeyValue, 2)
        assert caught.value.code == code
        assert text in caught.value.message
        # The connection still serves.
        assert (await client.call(SERVICE, "Echo", api.KeyValue(value="x"), api.KeyValue, 2)).value == "X"
    run(body)


async def answers_to(*messages: bytes) -> dict[int, ttrpc_pb2.Response]:
    """The server's answers, by stream id, to raw ttrpc messages."""
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    server = TtrpcServer(send, METHODS)
    for message in messages:
        server.receive(message)
    await asyncio.sleep(0.1)
    decoder = MessageDecoder()
    return {m.stream_id: ttrpc_pb2.Response.FromString(m.payload) for data in sent for m in decoder.feed(data)}


def request(payload: bytes, method: str = "Echo") -> bytes:
    return ttrpc_pb2.Request(service=SERVICE, method=method, payload=payload).SerializeToString()


def test_a_payload_that_does_not_parse_is_invalid_argument() -> None:
    answers = asyncio.run(answers_to(encode_message(1, MessageType.REQUEST, request(b"\x0a\xff"))))
    assert answers[1].status.code == Code.INVALID_ARGUMENT
    assert "test.Echo/Echo: payload does not parse" in answers[1].status.message


def test_client_timeout_and_late_answer() -> None:
    async def body(client: TtrpcClient, _: asyncio.StreamWriter) -> None:
        with pytest.raises(RpcError) as caught:
            await client.call(SERVICE, "Slow", api.KeyValue(), api.KeyValue, 0.1)
        assert caught.value.code == Code.DEADLINE_EXCEEDED
        assert "no answer within 0.10s" in caught.value.message
        await asyncio.sleep(0.4)  # the server's own deadline answer arrives late and is dropped
        assert (await client.call(SERVICE, "Echo", api.KeyValue(value="y"), api.KeyValue, 2)).value == "Y"
    run(body)


def test_client_fails_waiting_calls_when_closed() -> None:
    async def body(client: TtrpcClient, _: asyncio.StreamWriter) -> None:
        call = asyncio.ensure_future(client.call(SERVICE, "Slow", api.KeyValue(), api.KeyValue, 5))
        await asyncio.sleep(0.05)
        client.close(EOFError("gone"))
        with pytest.raises(ConnectionError, match="gone"):
            await call
        with pytest.raises(ConnectionError, match="closed"):
            await client.call(SERVICE, "Echo", api.KeyValue(), api.KeyValue, 1)
    run(body)


def test_bad_stream_ids_are_refused_and_the_stream_goes_on() -> None:
    echo_z = request(api.KeyValue(value="z").SerializeToString())
    answers = asyncio.run(answers_to(
        encode_message(2, MessageType.REQUEST, echo_z),  # even: a server-side id
        encode_message(5, MessageType.REQUEST, echo_z),
        encode_message(3, MessageType.REQUEST, echo_z),  # not above 5
    ))
    assert answers[2].status.code == Code.INVALID_ARGUMENT
    assert answers[3].status.code == Code.INVALID_ARGUMENT
    assert answers[5].status.code == Code.OK
    assert api.KeyValue.FromString(answers[5].payload).value == "Z"


def test_framing_errors_end_the_connection() -> None:
    async def ignore(data: bytes) -> None:
        pass

    server = TtrpcServer(ignore, METHODS)
    with pytest.raises(ProtocolError, match="DATA message on stream 1; only unary requests are served"):
        server.receive(encode_message(1, MessageType.DATA, b""))
    with pytest.raises(ProtocolError, match="request envelope does not parse"):
        TtrpcServer(ignore, METHODS).receive(encode_message(1, MessageType.REQUEST, b"\x0a\xff"))
    client = TtrpcClient(ignore)
    with pytest.raises(ProtocolError, match="REQUEST message on stream 1"):
        client.receive(encode_message(1, MessageType.REQUEST, b""))
