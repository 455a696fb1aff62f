"""NRI's connection multiplexer: two logical byte streams over one socket.

NRI runs two ttrpc connections over one unix socket: the runtime calls the plugin's Plugin
service on connection 1 and the plugin calls the runtime's Runtime service on connection 2.
Each chunk of a logical stream travels as a frame ``conn_id:uint32 length:uint32``
(big-endian, containerd/nri pkg/net/multiplex) plus ``length`` bytes. Frame boundaries carry
no meaning: ttrpc messages may be split over frames or share one, so each connection's bytes
go on to its own :class:`~koord.nri.frames.MessageDecoder`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from koord.nri.frames import HEADER_LENGTH as TTRPC_HEADER_LENGTH
from koord.nri.frames import MESSAGE_LENGTH_MAX, ProtocolError

FRAME_HEADER = struct.Struct(">II")
FRAME_HEADER_LENGTH = FRAME_HEADER.size
FRAME_PAYLOAD_MAX = TTRPC_HEADER_LENGTH + MESSAGE_LENGTH_MAX
"""The largest frame upstream writes: one whole ttrpc message."""

PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
READ_CHUNK = 64 << 10


def encode_frames(conn_id: int, data: bytes) -> bytes:
    """``data`` as frames of at most FRAME_PAYLOAD_MAX bytes each, as upstream's writer splits it."""
    out = bytearray()
    for start in range(0, max(len(data), 1), FRAME_PAYLOAD_MAX):
        chunk = data[start:start + FRAME_PAYLOAD_MAX]
        out += FRAME_HEADER.pack(conn_id, len(chunk)) + chunk
    return bytes(out)


class FrameDecoder:
    """Splits the trunk's bytes into ``(conn_id, payload)``; bounded like MessageDecoder.

    A frame for a connection not in ``conn_ids`` is a protocol error: NRI opens only
    connections 1 and 2, so anything else is a confused or hostile peer.
    """

    def __init__(self, conn_ids: frozenset[int] = frozenset({PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN})) -> None:
        self._conn_ids = conn_ids
        self._buf = bytearray()
        self._expect: tuple[int, int] | None = None

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while True:
            if self._expect is None:
                if len(self._buf) < FRAME_HEADER_LENGTH:
                    return out
                raw = bytes(self._buf[:FRAME_HEADER_LENGTH])
                conn_id, length = FRAME_HEADER.unpack(raw)
                if length > FRAME_PAYLOAD_MAX:
                    raise ProtocolError(f"mux: frame length {length} exceeds the {FRAME_PAYLOAD_MAX}-byte limit "
                                        f"(header {raw.hex()})")
                if conn_id not in self._conn_ids:
                    raise ProtocolError(f"mux: frame for connection {conn_id}, which is not open "
                                        f"(open: {sorted(self._conn_ids)}; header {raw.hex()})")
                self._expect = (conn_id, length)
                del self._buf[:FRAME_HEADER_LENGTH]
            conn_id, length = self._expect
            if len(self._buf) < length:
                return out
            out.append((conn_id, bytes(self._buf[:length])))
            del self._buf[:length]
            self._expect = None

    @property
    def buffered(self) -> int:
        return len(self._buf) + (FRAME_HEADER_LENGTH if self._expect is not None else 0)

    def close(self) -> None:
        """At end of stream: raises ProtocolError if a frame was cut short."""
        if self._expect is not None:
            raise ProtocolError(f"mux: truncated frame: stream ended after {len(self._buf)} of "
                                f"{self._expect[1]} payload bytes for connection {self._expect[0]}")
        if self._buf:
            raise ProtocolError(f"mux: truncated frame: stream ended inside a header "
                                f"({len(self._buf)} of {FRAME_HEADER_LENGTH} bytes)")


Receiver = Callable[[bytes], None]


class Mux:
    """The trunk: routes incoming frames to one receiver per connection; frames outgoing writes.

    ``run()`` reads until end of stream and returns, or raises ProtocolError (from the frame
    decoder or a receiver's decoder) or OSError; the owner then closes everything.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 receivers: dict[int, Receiver]) -> None:
        self._reader = reader
        self._writer = writer
        self._receivers = receivers
        self._decoder = FrameDecoder(frozenset(receivers))
        self._write_lock = asyncio.Lock()

    async def run(self) -> None:
        while True:
            data = await self._reader.read(READ_CHUNK)
            if not data:
                self._decoder.close()
                return
            for conn_id, payload in self._decoder.feed(data):
                self._receivers[conn_id](payload)

    async def send(self, conn_id: int, data: bytes) -> None:
        """Writes ``data`` on connection ``conn_id``; one writer at a time keeps frames whole."""
        async with self._write_lock:
            self._writer.write(encode_frames(conn_id, data))
            await self._writer.drain()

    def close(self) -> None:
        self._writer.close()
