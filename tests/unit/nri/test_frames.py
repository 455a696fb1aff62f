"""ttrpc message framing and NRI mux framing: round trips, any chunking, bounds, hostile bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.nri.frames import (
    HEADER_LENGTH,
    MESSAGE_LENGTH_MAX,
    Message,
    MessageDecoder,
    MessageType,
    ProtocolError,
    encode_message,
)
from koord.nri.mux import FRAME_HEADER_LENGTH, FRAME_PAYLOAD_MAX, FrameDecoder, encode_frames

messages = st.builds(Message, st.integers(0, 2**32 - 1), st.sampled_from(list(MessageType)),
                     st.integers(0, 255), st.binary(max_size=300))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(st.lists(messages, max_size=8), st.lists(st.integers(0, 10_000), max_size=12))
def test_messages_round_trip_through_any_chunking(sent: list[Message], cuts: list[int]) -> None:
    wire = b"".join(encode_message(m.stream_id, m.type, m.payload, m.flags) for m in sent)
    decoder = MessageDecoder()
    got = [m for chunk in chunked(wire, cuts) for m in decoder.feed(chunk)]
    assert got == sent
    decoder.close()


def test_header_is_big_endian_length_stream_type_flags() -> None:
    assert encode_message(3, MessageType.REQUEST, b"xy", 0x4) == bytes.fromhex("00000002" "00000003" "01" "04") + b"xy"


@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=6))
def test_arbitrary_bytes_give_messages_or_a_protocol_error_within_the_bound(data: bytes, cuts: list[int]) -> None:
    decoder = MessageDecoder()
    try:
        for chunk in chunked(data, cuts):
            decoder.feed(chunk)
            assert decoder.buffered <= HEADER_LENGTH + MESSAGE_LENGTH_MAX
        decoder.close()
    except ProtocolError as err:
        assert str(err).startswith("ttrpc")


def test_oversized_length_is_rejected_from_the_header_alone() -> None:
    decoder = MessageDecoder()
    with pytest.raises(ProtocolError, match=r"message length 4194305 exceeds the 4194304-byte limit"):
        decoder.feed(struct.pack(">IIBB", MESSAGE_LENGTH_MAX + 1, 1, 1, 0))
    assert decoder.buffered == HEADER_LENGTH  # the header only: nothing reserved for the payload


def test_unknown_type_is_named() -> None:
    with pytest.raises(ProtocolError, match="unknown message type 9 on stream 5"):
        MessageDecoder().feed(struct.pack(">IIBB", 0, 5, 9, 0))


def test_truncated_message_is_reported_at_close() -> None:
    decoder = MessageDecoder()
    assert decoder.feed(encode_message(1, MessageType.REQUEST, b"abcdef")[:-2]) == []
    with pytest.raises(ProtocolError, match="truncated message: stream ended after 4 of 6 payload bytes on stream 1"):
        decoder.close()
    header_only = MessageDecoder()
    header_only.feed(b"\0\0\0")
    with pytest.raises(ProtocolError, match="inside a header"):
        header_only.close()


def test_a_message_of_the_maximum_size_passes() -> None:
    payload = bytes(MESSAGE_LENGTH_MAX)
    [message] = MessageDecoder().feed(encode_message(1, MessageType.DATA, payload))
    assert len(message.payload) == MESSAGE_LENGTH_MAX
    with pytest.raises(ValueError, match="exceeds"):
        encode_message(1, MessageType.DATA, payload + b"x")


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=8),
       st.lists(st.integers(0, 10_000), max_size=12))
def test_mux_frames_round_trip_through_any_chunking(sent: list[tuple[int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(encode_frames(conn, data) for conn, data in sent)
    decoder = FrameDecoder()
    got = [f for chunk in chunked(wire, cuts) for f in decoder.feed(chunk)]
    assert got == sent
    decoder.close()


def test_mux_header_is_big_endian_conn_and_length() -> None:
    assert encode_frames(2, b"abc") == bytes.fromhex("00000002" "00000003") + b"abc"


def test_mux_splits_a_write_larger_than_a_frame() -> None:
    data = bytes(range(256)) * ((FRAME_PAYLOAD_MAX // 256) + 3)
    frames = FrameDecoder().feed(encode_frames(1, data))
    assert [len(p) for _, p in frames] == [FRAME_PAYLOAD_MAX, len(data) - FRAME_PAYLOAD_MAX]
    assert b"".join(p for _, p in frames) == data


@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=6))
def test_mux_arbitrary_bytes_give_frames_or_a_protocol_error_within_the_bound(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder()
    try:
        for chunk in chunked(data, cuts):
            decoder.feed(chunk)
            assert decoder.buffered <= FRAME_HEADER_LENGTH + FRAME_PAYLOAD_MAX
        decoder.close()
    except ProtocolError as err:
        assert str(err).startswith("mux")


def test_mux_rejects_huge_frames_and_unknown_connections_from_the_header() -> None:
    with pytest.raises(ProtocolError, match="frame length 4294967295 exceeds the 4194314-byte limit"):
        FrameDecoder().feed(b"\0\0\0\1\xff\xff\xff\xff")
    with pytest.raises(ProtocolError, match="frame for connection 7, which is not open"):
        FrameDecoder().feed(b"\0\0\0\7\0\0\0\1")
    truncated = FrameDecoder()
    truncated.feed(encode_frames(2, b"abcd")[:-1])
    with pytest.raises(ProtocolError, match="truncated frame: stream ended after 3 of 4 payload bytes for conn"):
        truncated.close()
