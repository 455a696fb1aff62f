"""The metric cache's in-memory head of a series, its on-disk chunk codec, and the codec of
one tick's samples as the head stores them.

A chunk is one series' points over a time span as a zlib blob: a header (first ts in ms,
sample count), ms deltas as int64, then the values as float64. About 6 bytes a sample on
disk for usage series sampled every second.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_CHUNK_HEADER = struct.Struct("<qI")  # first ts (ms), sample count


@dataclass(slots=True)
class Series:
    """One series' head: its samples not yet cut into a chunk, in arrival order (which is
    time order unless a sample arrived late: ``in_order`` says, so windows can bisect)."""

    id: int
    labels: dict[str, str]
    ts: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    newest: int = -1
    """The head's largest ts, the last cut's with an empty head (never below ``cut``), so
    in-order appends skip the duplicate search and the cut check."""
    in_order: bool = True
    cut: int = -1  # the largest ts already in a chunk: with an empty head, the series' last sample

    def add(self, ts_ms: int, value: float) -> bool:
        """False when the sample is at or before the last cut, and dropped: the chunks are
        not rewritten, and the sample kept beside them would be a second value at an
        instant already stored (the wall clock stepped back across a cut)."""
        if ts_ms > self.newest:  # the common case: the next sample in time
            self.newest = ts_ms
            self.ts.append(ts_ms)
            self.values.append(value)
            return True
        if ts_ms <= self.cut:
            return False
        if ts_ms in self.ts:
            self.values[self.ts.index(ts_ms)] = value  # the same instant again: the newer value wins
            return True
        self.in_order = False  # a late sample
        self.ts.append(ts_ms)
        self.values.append(value)
        return True

    def cut_at(self, ts_ms: int) -> None:
        """Samples up to ``ts_ms`` are in chunks: later ones at or before it are dropped."""
        self.cut = max(self.cut, ts_ms)
        self.newest = max(self.newest, self.cut)

    def window(self, lo: int, hi: int) -> tuple[Sequence[int], Sequence[float]]:
        """The head's (times, values) within [lo, hi] ms."""
        if self.in_order:
            i, j = bisect.bisect_left(self.ts, lo), bisect.bisect_right(self.ts, hi)
            return self.ts[i:j], self.values[i:j]
        kept = [(t, v) for t, v in zip(self.ts, self.values, strict=True) if lo <= t <= hi]
        return [t for t, _ in kept], [v for _, v in kept]

    def clear(self) -> None:
        del self.ts[:], self.values[:]
        self.newest, self.in_order = self.cut, True

    def last_ms(self) -> int:
        """At least the time of the series' newest sample (the head's newest or the last
        cut's), -1 without any: a window starting after it holds none of its samples."""
        return self.newest

    def drop_before(self, cutoff_ms: int) -> bool:
        """Forgets head samples older than the retention; True when there were any."""
        if not self.ts or (self.ts[0] if self.in_order else min(self.ts)) >= cutoff_ms:
            return False
        kept = [(t, v) for t, v in zip(self.ts, self.values, strict=True) if t >= cutoff_ms]
        self.ts = array("q", (t for t, _ in kept))
        self.values = array("d", (v for _, v in kept))
        return True


def chunk_window(times: Sequence[int], vals: array, lo: int, hi: int) -> tuple[Sequence[int], Sequence[float]]:
    """A decoded chunk's (times, values) within [lo, hi] ms (a chunk is in time order)."""
    i, j = bisect.bisect_left(times, lo), bisect.bisect_right(times, hi)
    return times[i:j], vals[i:j]


def encode_chunk(ts: Iterable[int], values: Iterable[float]) -> bytes:
    """Points sorted by time, one per ms, as a compressed blob (ms deltas + float64 values)."""
    times = array("q", ts)
    vals = array("d", values)
    deltas = array("q", (b - a for a, b in zip(times, times[1:], strict=False)))
    return zlib.compress(_CHUNK_HEADER.pack(times[0], len(times)) + deltas.tobytes() + vals.tobytes(), 1)


def decode_chunk(blob: bytes) -> tuple[array, array]:
    """The inverse of encode_chunk; ValueError when the blob is not one. The times are an
    int64 array, not a list: a report decodes every series' chunk of the window at once,
    and a hundred thousand int objects at a time left the allocator's arenas fragmented
    (the process grew by megabytes at every report)."""
    try:
        raw = zlib.decompress(blob)
        first, count = _CHUNK_HEADER.unpack_from(raw)
    except (zlib.error, struct.error) as exc:
        raise ValueError(f"bad chunk: {exc}") from None
    if len(raw) != _CHUNK_HEADER.size + 16 * count - 8 or count == 0:
        raise ValueError(f"bad chunk: {len(raw)} bytes for {count} samples")
    deltas = array("q")
    deltas.frombytes(raw[_CHUNK_HEADER.size:_CHUNK_HEADER.size + 8 * (count - 1)])
    vals = array("d")
    vals.frombytes(raw[_CHUNK_HEADER.size + 8 * (count - 1):])
    try:
        times = array("q", itertools.accumulate(deltas, initial=first))
    except OverflowError:
        raise ValueError("bad chunk: a time beyond int64") from None
    return times, vals


def encode_tick(series_ids: Sequence[int], values: Sequence[float]) -> tuple[bytes, bytes]:
    """A tick's series ids and values as two arrays (int64, float64) of the same length."""
    return array("q", series_ids).tobytes(), array("d", values).tobytes()


def decode_tick(ids_blob: bytes, values_blob: bytes) -> tuple[array, array]:
    """The inverse of encode_tick; ValueError when the blobs are not one."""
    if not isinstance(ids_blob, bytes) or not isinstance(values_blob, bytes):
        raise ValueError("not blobs")
    if len(ids_blob) % 8 or len(ids_blob) != len(values_blob):
        raise ValueError(f"{len(ids_blob)} bytes of series ids for {len(values_blob)} bytes of values")
    ids, values = array("q"), array("d")
    ids.frombytes(ids_blob)
    values.frombytes(values_blob)
    return ids, values
