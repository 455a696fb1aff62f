"""ttrpc message framing: the 10-byte header and a bounded, incremental decoder.

A ttrpc message is ``length:uint32 stream_id:uint32 type:uint8 flags:uint8`` (big-endian)
followed by ``length`` bytes. The decoder is sans-I/O (bytes in, messages out) so that the
same code serves the socket and the property tests, and so that every bound is checked in
one place: a header announcing more than :data:`MESSAGE_LENGTH_MAX` or an unknown type is
rejected the moment its 10 bytes are in, before any payload is buffered.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

HEADER = struct.Struct(">IIBB")
HEADER_LENGTH = HEADER.size
MESSAGE_LENGTH_MAX = 4 << 20
"""ttrpc's limit on one message's payload (containerd/ttrpc messageLengthMax)."""


class ProtocolError(Exception):
    """The peer broke the wire protocol; the connection cannot be trusted any more and is closed."""


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: MessageType
    flags: int
    payload: bytes


def encode_message(stream_id: int, type: MessageType, payload: bytes, flags: int = 0) -> bytes:
    """One message, header and payload; refuses what a peer would reject as oversized."""
    if len(payload) > MESSAGE_LENGTH_MAX:
        raise ValueError(f"ttrpc payload of {len(payload)} bytes exceeds the {MESSAGE_LENGTH_MAX}-byte limit")
    return HEADER.pack(len(payload), stream_id, type, flags) + payload


class MessageDecoder:
    """Turns a byte stream, fed in chunks of any size, into messages.

    Holds at most one header plus :data:`MESSAGE_LENGTH_MAX` bytes plus the last chunk fed,
    whatever the peer sends.
    """

    def __init__(self, what: str = "ttrpc") -> None:
        self._what = what
        self._buf = bytearray()
        self._expect: tuple[int, int, MessageType, int] | None = None

    def feed(self, data: bytes) -> list[Message]:
        """Messages completed by ``data``; raises ProtocolError on a header that breaks a bound."""
        self._buf += data
        out: list[Message] = []
        while True:
            if self._expect is None:
                if len(self._buf) < HEADER_LENGTH:
                    return out
                self._expect = self._parse_header(bytes(self._buf[:HEADER_LENGTH]))
                del self._buf[:HEADER_LENGTH]
            length, stream_id, type_, flags = self._expect
            if len(self._buf) < length:
                return out
            out.append(Message(stream_id, type_, flags, bytes(self._buf[:length])))
            del self._buf[:length]
            self._expect = None

    def _parse_header(self, raw: bytes) -> tuple[int, int, MessageType, int]:
        length, stream_id, type_, flags = HEADER.unpack(raw)
        if length > MESSAGE_LENGTH_MAX:
            raise ProtocolError(f"{self._what}: message length {length} exceeds the "
                                f"{MESSAGE_LENGTH_MAX}-byte limit (header {raw.hex()})")
        try:
            kind = MessageType(type_)
        except ValueError:
            raise ProtocolError(f"{self._what}: unknown message type {type_} on stream {stream_id} "
                                f"(header {raw.hex()})") from None
        return length, stream_id, kind, flags

    @property
    def buffered(self) -> int:
        """Bytes held that do not make a whole message yet."""
        return len(self._buf) + (HEADER_LENGTH if self._expect is not None else 0)

    def close(self) -> None:
        """At end of stream: raises ProtocolError if a message was cut short."""
        if self._expect is not None:
            raise ProtocolError(f"{self._what}: truncated message: stream ended after {len(self._buf)} of "
                                f"{self._expect[0]} payload bytes on stream {self._expect[1]}")
        if self._buf:
            raise ProtocolError(f"{self._what}: truncated message: stream ended inside a header "
                                f"({len(self._buf)} of {HEADER_LENGTH} bytes)")
