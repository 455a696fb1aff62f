"""The Docker Server: serves the Docker Engine API on a unix socket and relays it to dockerd.

One call, from arrival to answer (``_serve_connection`` -> ``_exchange``):

1. h11 parses the request head from the client's connection (bad bytes: a 400 in
   dockerd's ``{"message": ...}`` shape, and the connection closes).
2. ``Interceptor.route`` says whether the call is one of the lifecycle calls hooks ride
   on.  If not, the call is relayed as it streams: the head at once, the body chunk by
   chunk while the answer is relayed back chunk by chunk (``logs -f``, ``events``,
   ``stats``, ``docker load`` never sit in memory).  A ``101`` answer, or an unframed
   ``200`` to a request that asked for an upgrade (``attach``, ``exec start``), turns the
   connection into two raw byte pipes that pass half-closes on.
3. An intercepted call has its (bounded) body read, goes through the interceptor's
   handler (hooks, then dockerd through ``DockerCall.forward``), and its answer is sent
   back whole.

Each client connection has its own connection to dockerd, reused while both sides keep
the connection alive, so the relay never has to match answers to requests across clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Protocol

import h11

from koord.hookapi import SOCKET_MODE, prepare_socket

from ..dispatcher import HookFailed
from ..metrics import ProxyMetrics
from .backend import READ_CHUNK, BackendError, BackendUnreachable, Event, Peer, open_upstream

log = logging.getLogger(__name__)

MAX_INTERCEPTED_BODY = 4 << 20
"""A create/update body above this is refused with 413: real ones are a few KiB."""
MAX_INTERCEPTED_ANSWER = 4 << 20
_HOP_HEADERS = (b"content-length", b"transfer-encoding")


class ClientError(Exception):
    """The client's request cannot be served; answered with ``status`` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Reply:
    """A whole answer for the client: dockerd's (head and body) or the proxy's own."""

    head: h11.Response
    body: bytes

    @property
    def status(self) -> int:
        return self.head.status_code

    @classmethod
    def error(cls, status: int, message: str) -> Reply:
        """An error in dockerd's own shape, which docker clients print as is."""
        body = json.dumps({"message": message}).encode() + b"\n"
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        return cls(h11.Response(status_code=status, reason=reason, headers=[
            ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]), body)


@dataclass(slots=True)
class _Link:
    """One client connection and its dockerd connection."""

    client: Peer
    endpoint: str
    upstream: Peer | None = None
    busy: bool = False
    closing: bool = False
    """Set when this connection cannot carry another request (hijacked, broken, or answered early)."""

    async def open(self) -> Peer:
        """The dockerd connection; a kept-alive one dockerd has closed meanwhile (a restart) is replaced."""
        if self.upstream is not None and (self.upstream.reader.at_eof() or self.upstream.writer.is_closing()):
            self.drop_upstream()
        if self.upstream is None:
            self.upstream = await open_upstream(self.endpoint)
        return self.upstream

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


@dataclass(slots=True)
class DockerCall:
    """An intercepted call: its request head and whole body, and how to forward it to dockerd."""

    request: h11.Request
    body: bytes
    _link: _Link

    async def forward(self, body: bytes | None = None) -> Reply:
        """Sends the request (with ``body`` instead when a plugin changed it) and reads the whole answer."""
        data = self.body if body is None else body
        headers = [(k, v) for k, v in self.request.headers.raw_items() if k.lower() not in _HOP_HEADERS]
        headers.append((b"Content-Length", str(len(data)).encode()))
        up = await self._link.open()
        try:
            up.send(h11.Request(method=self.request.method, target=self.request.target, headers=headers),
                    h11.Data(data=data), h11.EndOfMessage())
            await up.drain()
            head: h11.Response | None = None
            parts: list[bytes] = []
            size = 0
            while True:
                event = await up.next_event()
                if isinstance(event, h11.Response):
                    head = event
                elif isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > MAX_INTERCEPTED_ANSWER:
                        raise BackendError(f"dockerd's answer is larger than {MAX_INTERCEPTED_ANSWER} bytes")
                    parts.append(event.data)
                elif isinstance(event, h11.EndOfMessage) and head is not None:
                    return Reply(head, b"".join(parts))
                elif isinstance(event, h11.ConnectionClosed):
                    raise BackendError("dockerd closed the connection before answering")
        except (h11.ProtocolError, ConnectionError) as exc:
            self._link.drop_upstream()
            raise BackendError(f"dockerd's answer to {self.request.method.decode()} "
                               f"{self.request.target.decode(errors='replace')}: {exc}") from None


Handler = Callable[[DockerCall], Awaitable[Reply]]


class Router(Protocol):
    """What the server asks the interceptor: the handler for a call, or None to relay it as it streams."""

    def route(self, method: bytes, target: bytes) -> Handler | None: ...


class DockerServer:
    def __init__(self, backend_endpoint: str, router: Router, metrics: ProxyMetrics,
                 on_backend_down: Callable[[], None]) -> None:
        self.backend_endpoint = backend_endpoint
        self.router = router
        self.metrics = metrics
        self.on_backend_down = on_backend_down
        self._server: asyncio.Server | None = None
        self._links: dict[asyncio.Task[None], _Link] = {}
        self._draining = False

    async def start(self, path: str) -> None:
        prepare_socket(Path(path))
        self._server = await asyncio.start_unix_server(self._accept, path, limit=READ_CHUNK)
        os.chmod(path, SOCKET_MODE)

    async def stop(self, grace: float) -> None:
        """Stops accepting, closes idle connections, gives calls in flight ``grace`` seconds."""
        self._draining = True
        if self._server is not None:
            self._server.close()
        for task, link in list(self._links.items()):
            if not link.busy:
                task.cancel()
        pending = list(self._links)
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        link = _Link(Peer(h11.SERVER, reader, writer), self.backend_endpoint)
        self._links[task] = link
        try:
            await self._serve_connection(link)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug: say so, close this connection, keep serving the others
            log.exception("docker API connection failed inside the proxy")
        finally:
            del self._links[task]
            link.drop_upstream()
            link.client.close()

    async def _serve_connection(self, link: _Link) -> None:
        client = link.client
        while not self._draining:
            try:
                event = await client.next_event()
            except h11.RemoteProtocolError as exc:
                reply = Reply.error(exc.error_status_hint, f"koord-runtime-proxy: bad request: {exc}")
                self._send_if_possible(link, reply)
                await _flush(client)
                return
            if not isinstance(event, h11.Request):
                return  # the client closed the connection (or sent bytes after a close)
            link.busy = True
            start = time.perf_counter()
            label, status = _label(event), 0
            try:
                status = await self._exchange(link, event)
            finally:
                self.metrics.observe_cri(label, str(status), time.perf_counter() - start)
                link.busy = False
            if link.closing or not client.reusable:
                return
            client.conn.start_next_cycle()
            if link.upstream is not None:
                if link.upstream.reusable:
                    link.upstream.conn.start_next_cycle()
                else:
                    link.drop_upstream()

    async def _exchange(self, link: _Link, request: h11.Request) -> int:
        """Serves one request; returns the status sent (0 when none could be sent)."""
        routed = self.router.route(request.method, request.target)
        try:
            if routed is None:
                return await self._relay(link, request)
            body = await _read_body(link.client, request, MAX_INTERCEPTED_BODY)
            try:
                reply = await routed(DockerCall(request, body, link))
            except HookFailed as exc:
                reply = Reply.error(500, str(exc))
            except (BackendError, ClientError):
                raise
            except Exception as exc:  # a bug: answer in dockerd's shape and say so, never die silently
                log.exception("%s failed inside the proxy", _label(request))
                link.closing = True
                reply = Reply.error(500, f"koord-runtime-proxy: {_label(request)}: {type(exc).__name__}: {exc}")
        except ClientError as exc:
            link.closing = True
            sent = self._send_if_possible(link, Reply.error(exc.status, f"koord-runtime-proxy: {exc}"))
            await _flush(link.client)
            return exc.status if sent else 0
        except BackendError as exc:
            log.warning("%s", exc)
            if isinstance(exc, BackendUnreachable):
                self.on_backend_down()
            link.closing = True
            link.drop_upstream()
            sent = self._send_if_possible(link, Reply.error(502, f"koord-runtime-proxy: {exc}"))
            await _flush(link.client)
            return 502 if sent else 0
        link.client.send(reply.head, h11.Data(data=reply.body), h11.EndOfMessage())
        await _flush(link.client)
        return reply.status

    def _send_if_possible(self, link: _Link, reply: Reply) -> bool:
        """Sends a proxy-made answer unless an answer has started already (then only closing is left)."""
        if link.client.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return False
        try:
            link.client.send(reply.head, h11.Data(data=reply.body), h11.EndOfMessage())
        except h11.LocalProtocolError:
            return False
        return True

    # ------------------------------------------------------------ the streaming relay

    async def _relay(self, link: _Link, request: h11.Request) -> int:
        up = await link.open()
        client = link.client
        up.send(h11.Request(method=request.method, target=request.target, headers=request.headers))
        try:
            first: Event = client.conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise ClientError(exc.error_status_hint, f"bad request body: {exc}") from None
        upload: asyncio.Task[None] | None = None
        if isinstance(first, h11.EndOfMessage):
            up.send(first)
        else:
            upload = asyncio.create_task(_upload(client, up, first))
        try:
            await up.drain()
            return await self._relay_answer(link, request, up, upload)
        except (h11.ProtocolError, ConnectionError) as exc:
            if _failed(upload) or client.writer.transport.is_closing():
                link.closing = True
                return 0  # the client broke off its request or went away mid-answer: nothing to answer
            raise BackendError(f"relaying {request.method.decode()} "
                               f"{request.target.decode(errors='replace')}: {exc}") from None
        finally:
            if upload is not None and not upload.done():
                upload.cancel()  # dockerd answered before taking the whole body: the connection ends
                link.closing = True
                link.drop_upstream()

    async def _relay_answer(self, link: _Link, request: h11.Request, up: Peer,
                            upload: asyncio.Task[None] | None) -> int:
        client = link.client
        while True:
            event = await _answer_event(up, upload)
            if isinstance(event, h11.InformationalResponse):
                if event.status_code == 101:
                    return await self._hijack(link, up, event, upload)
                client.send(event)
                continue
            if isinstance(event, h11.Response):
                break
            raise BackendError("dockerd closed the connection before answering")
        if event.status_code == 200 and _asks_upgrade(request) and _unframed(event):
            return await self._hijack(link, up, event, upload)
        client.send(event)
        while True:
            chunk = await _answer_event(up, upload)
            if isinstance(chunk, h11.Data):
                client.send(chunk)
                await client.drain()
            elif isinstance(chunk, h11.EndOfMessage):
                client.send(chunk)
                await client.drain()
                if upload is not None:
                    await upload
                return event.status_code
            else:
                raise BackendError("dockerd closed the connection in the middle of its answer")

    async def _hijack(self, link: _Link, up: Peer, head: h11.Response | h11.InformationalResponse,
                      upload: asyncio.Task[None] | None) -> int:
        """From here on the connection is two raw byte streams: ``attach`` and ``exec`` stdio."""
        if upload is not None:
            await upload
        client = link.client
        client.writer.write(_raw_head(head) + up.conn.trailing_data[0])
        pending = client.conn.trailing_data[0]
        if pending:
            up.writer.write(pending)
        link.closing = True
        await asyncio.gather(_pipe(client.reader, up.writer), _pipe(up.reader, client.writer))
        return head.status_code


async def _answer_event(up: Peer, upload: asyncio.Task[None] | None) -> Event:
    """The next answer event; a failed upload (the client broke off) ends the wait at once."""
    if upload is None or upload.done():
        if _failed(upload):
            raise ConnectionError("the client broke off the request body")
        return await up.next_event()
    reading = asyncio.ensure_future(up.next_event())
    await asyncio.wait((reading, upload), return_when=asyncio.FIRST_COMPLETED)
    if not reading.done():
        if _failed(upload):
            reading.cancel()
            raise ConnectionError("the client broke off the request body")
        return await reading
    return reading.result()


def _failed(upload: asyncio.Task[None] | None) -> bool:
    """Whether the body upload ended in an error (the client broke off, or dockerd stopped reading)."""
    return upload is not None and upload.done() and (upload.cancelled() or upload.exception() is not None)


async def _upload(client: Peer, up: Peer, event: Event) -> None:
    """Streams the request body to dockerd as it arrives, with backpressure."""
    try:
        while True:
            if isinstance(event, h11.Data):
                up.send(event)
                await up.drain()
            elif isinstance(event, h11.EndOfMessage):
                up.send(event)
                await up.drain()
                return
            elif event is not h11.NEED_DATA:
                raise ConnectionError("the client closed the connection in the middle of its request body")
            event = await client.next_event()
    except BaseException:
        up.writer.transport.abort()  # dockerd must see a broken request, not wait for the rest
        raise


async def _read_body(client: Peer, request: h11.Request, limit: int) -> bytes:
    """The whole body of an intercepted request, refused before reading when it is too large."""
    for name, value in request.headers:
        if name == b"content-length" and int(value) > limit:
            raise ClientError(413, f"request body of {int(value)} bytes is larger than the "
                              f"{limit} bytes allowed for {request.method.decode()} "
                              f"{request.target.decode(errors='replace')}")
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            event = await client.next_event()
        except h11.RemoteProtocolError as exc:
            raise ClientError(exc.error_status_hint, f"bad request body: {exc}") from None
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > limit:
                raise ClientError(413, f"request body is larger than the {limit} bytes allowed for "
                                  f"{request.method.decode()} {request.target.decode(errors='replace')}")
            parts.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        else:
            raise ClientError(400, "the connection closed in the middle of the request body")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies bytes until EOF, then half-closes the other side so it sees the EOF too."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(READ_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _flush(peer: Peer) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        await peer.drain()


def _asks_upgrade(request: h11.Request) -> bool:
    return any(name == b"upgrade" for name, _ in request.headers)


def _unframed(response: h11.Response) -> bool:
    return not any(name in _HOP_HEADERS for name, _ in response.headers)


def _raw_head(head: h11.Response | h11.InformationalResponse) -> bytes:
    lines = [b"HTTP/%s %d %s\r\n" % (head.http_version, head.status_code, head.reason)]
    lines += [b"%s: %s\r\n" % (name, value) for name, value in head.headers.raw_items()]
    return b"".join(lines) + b"\r\n"


_RESOURCES = frozenset({"containers", "images", "exec", "networks", "volumes", "plugins", "swarm", "services",
                        "nodes", "tasks", "secrets", "configs", "distribution", "session", "build", "system",
                        "events", "info", "version", "_ping", "auth", "commit"})
_VERBS = frozenset({"json", "create", "start", "stop", "update", "logs", "stats", "attach", "exec", "wait", "kill",
                    "restart", "pause", "unpause", "resize", "top", "changes", "export", "archive", "rename",
                    "load", "prune", "get", "push", "tag", "history", "search", "df"})


def _label(request: h11.Request) -> str:
    """``docker POST /containers/{id}/start``-like metric label from a fixed vocabulary (no ids, no names)."""
    parts = [p for p in request.target.split(b"?", 1)[0].decode("ascii", "replace").split("/") if p]
    if parts and parts[0].startswith("v") and parts[0][1:2].isdigit():
        parts = parts[1:]
    shape = ""
    if parts:
        shape = "/" + (parts[0] if parts[0] in _RESOURCES else "…")
        if len(parts) == 2 and parts[1] in _VERBS:
            shape += "/" + parts[1]
        elif len(parts) >= 2:
            shape += "/{id}" + ("/" + parts[-1] if len(parts) > 2 and parts[-1] in _VERBS else "")
    return f"docker {request.method.decode('ascii', 'replace')[:10]} {shape or '/'}"
