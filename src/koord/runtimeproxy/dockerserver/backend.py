"""HTTP/1.1 over dockerd's unix socket, framed by h11: the relay's upstream and the proxy's own calls.

``Peer`` is one h11 connection on an asyncio stream pair, used for both sides of the relay
(the client's connection in the server role, dockerd's in the client role).  ``DockerBackend``
makes the proxy's own requests (inspect, update, list, ping) on fresh connections, with
answers bounded in size: dockerd is trusted to speak HTTP, not to be small.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11

from .dockerjson import DockerJSONError, decode_object, encode

READ_CHUNK = 64 << 10
MAX_HEAD_BYTES = 64 << 10
"""Request/response heads larger than this are refused (Docker's are a few hundred bytes)."""
MAX_ANSWER_BYTES = 64 << 20
"""The largest answer the proxy reads whole for itself (a list of every container on a big node)."""

Event = Any
"""An h11 event or one of its sentinels (h11 types them loosely)."""


class BackendError(Exception):
    """dockerd could not be reached or answered something that is not HTTP; the message says which."""


class BackendUnreachable(BackendError):
    """dockerd's socket refused the connection: what /readyz reports until the next probe."""


class Peer:
    """One side of a relayed connection: an h11 state machine on an asyncio stream pair."""

    __slots__ = ("conn", "reader", "writer")

    def __init__(self, role: type[h11.CLIENT] | type[h11.SERVER], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.conn = h11.Connection(role, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.reader = reader
        self.writer = writer

    async def next_event(self) -> Event:
        """The next h11 event, reading as needed; EOF becomes ConnectionClosed or a protocol error."""
        conn = self.conn
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await self.reader.read(READ_CHUNK))

    def send(self, *events: Event) -> None:
        """Serialises ``events`` and queues them in one write; callers ``drain`` when streaming."""
        data = b"".join(self.conn.send(e) or b"" for e in events)
        if data:
            self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()

    @property
    def reusable(self) -> bool:
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE


async def open_upstream(endpoint: str) -> Peer:
    try:
        reader, writer = await asyncio.open_unix_connection(endpoint, limit=READ_CHUNK)
    except OSError as exc:
        raise BackendUnreachable(f"cannot connect to dockerd at {endpoint}: {exc.strerror or exc}") from None
    return Peer(h11.CLIENT, reader, writer)


class DockerBackend:
    """The proxy's own calls to dockerd; ``reachable`` is what /readyz reports."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.reachable = False

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   timeout: float = 30.0) -> tuple[int, bytes]:
        """One request on a fresh connection; (status, answer body). Raises BackendError."""
        try:
            return await asyncio.wait_for(self._call(method, path, body), timeout)
        except TimeoutError:
            raise BackendError(f"dockerd did not answer {method} {path} within {timeout:g}s") from None

    async def _call(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        peer = await open_upstream(self.endpoint)
        try:
            data = encode(body) if body is not None else b""
            headers = [("Host", "docker"), ("Content-Length", str(len(data)))]
            if body is not None:
                headers.append(("Content-Type", "application/json"))
            peer.send(h11.Request(method=method, target=path, headers=headers), h11.Data(data=data),
                      h11.EndOfMessage())
            status, answer = await read_answer(peer, MAX_ANSWER_BYTES)
            return status, answer
        except (h11.ProtocolError, ConnectionError) as exc:
            raise BackendError(f"dockerd's answer to {method} {path}: {exc}") from None
        finally:
            peer.close()

    async def json_object(self, method: str, path: str) -> tuple[int, Any]:
        """Like ``call`` with a 2xx answer decoded; one that is not a JSON object is a BackendError."""
        status, raw = await self.call(method, path)
        if not 200 <= status < 300:
            return status, raw
        try:
            return status, decode_object(raw, f"dockerd's answer to {method} {path}")
        except DockerJSONError as exc:
            raise BackendError(str(exc)) from None

    async def ping(self, timeout: float) -> bool:
        try:
            status, _ = await self.call("GET", "/_ping", timeout=timeout)
        except BackendError:
            return False
        return status == 200


async def read_answer(peer: Peer, limit: int) -> tuple[int, bytes]:
    """Reads one whole response (informational ones skipped); a body over ``limit`` is a BackendError."""
    status = 0
    parts: list[bytes] = []
    size = 0
    while True:
        event = await peer.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > limit:
                raise BackendError(f"dockerd's answer is larger than {limit} bytes")
            parts.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return status, b"".join(parts)
        elif isinstance(event, h11.ConnectionClosed):
            raise BackendError("dockerd closed the connection before answering")
