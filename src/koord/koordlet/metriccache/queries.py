"""The metric cache's answers: samples of a window, aggregations of them per series or per
label value, the newest sample per value. Recent windows are answered from the in-memory
head; chunks are read only for a window reaching back before the newest one."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence

from .aggregate import Aggregation, aggregate, aggregate_values
from .chunks import Series, chunk_window, decode_chunk
from .kinds import SCHEMA
from .samples import MetricCacheError, check_query, series_key, to_ms
from .state import CacheState

log = logging.getLogger(__name__)

# SQLite caps bound parameters; series ids are queried in chunks below it.
_IDS_PER_QUERY = 500
_AGGREGATE_BATCH = 32
"""Series whose points ``aggregate_by`` decodes and holds at once."""


class Queries(CacheState):
    def _recent(self, kind: str, lo: int) -> list[Series]:
        """The in-memory series of ``kind`` with a sample at or after ``lo`` ms: the others
        (pods that left within the idle hour) have none in a window starting there, and a
        node running short jobs holds thousands of them."""
        return [s for s in self._by_kind.get(kind, ()) if s.last_ms() >= lo]

    def _idle(self, kind: str, lo: int, hi: int) -> list[Series]:
        """The series of ``kind`` dropped from memory as idle that have chunks in [lo, hi]
        ms, read from disk for a query reaching back that far (none for a later window)."""
        if self._idle_newest < 0 or lo > self._idle_newest:
            return []
        out = []
        for sid, labels in self._conn().execute(
                "SELECT id, labels FROM series WHERE kind = ? AND id IN "
                "(SELECT series_id FROM chunks WHERE max_ts >= ? AND min_ts <= ?)", (kind, lo, hi)):
            if sid in self._by_id:
                continue
            try:
                out.append(Series(sid, json.loads(labels)))
            except ValueError:
                continue  # logged when the file was opened
        return out

    def query(self, kind: str, start: float, end: float,
              labels: Mapping[str, str] | None = None) -> list[tuple[float, float]]:
        """(timestamp, value) of every series of ``kind`` whose labels include ``labels``,
        merged in ascending time order, over [start, end] inclusive."""
        points = [(t, sid, v) for sid, parts in self._series_points(kind, start, end, labels).items()
                  for ts, vs in parts for t, v in zip(ts, vs, strict=True)]
        points.sort()
        return [(t / 1000, v) for t, _, v in points]

    def aggregates(self, kind: str, start: float, end: float, aggs: Iterable[Aggregation],
                   labels: Mapping[str, str] | None = None) -> dict[Aggregation, float]:
        """Several aggregations of one query (absent when there is no sample)."""
        points = self.query(kind, start, end, labels)
        return {agg: result for agg in aggs if (result := aggregate(points, agg)) is not None}

    def aggregate_by(self, kind: str, label: str, start: float, end: float,
                     aggs: Iterable[Aggregation]) -> dict[str, dict[Aggregation, float]]:
        """Per value of ``label``, each aggregation over [start, end] of its series: what
        ``aggregate`` gives for ``{label: value}``, for every value at once (one read of the
        chunks per batch of series, where one query per pod would scan all series each time).
        Only the newest sample needs time order (the merged order's last of the newest
        instant: the largest (ts, series id, value)); averages and percentiles are computed
        from the values as they come. Values without samples in the window are absent.

        The points of at most about ``_AGGREGATE_BATCH`` series are held at once: a report
        averages five minutes of every container, megabytes if decoded all together, and
        the allocator kept the holes such a spike left (the process grew at every report)."""
        check_query(kind, {label: ""})
        wanted = tuple(aggs)
        lo, hi = to_ms(start), to_ms(end)
        groups: dict[str, list[Series]] = {}
        with self._lock:
            for series in [*self._recent(kind, lo), *self._idle(kind, lo, hi)]:
                value = series.labels.get(label)
                if value is not None:
                    groups.setdefault(value, []).append(series)
        out: dict[str, dict[Aggregation, float]] = {}
        batch: list[tuple[str, list[Series]]] = []
        held = 0
        for value, members in groups.items():
            batch.append((value, members))
            held += len(members)
            if held >= _AGGREGATE_BATCH:
                self._aggregate_groups(kind, batch, lo, hi, wanted, out)
                batch, held = [], 0
        if batch:
            self._aggregate_groups(kind, batch, lo, hi, wanted, out)
        return out

    def _aggregate_groups(self, kind: str, groups: list[tuple[str, list[Series]]], lo: int, hi: int,
                          wanted: tuple[Aggregation, ...], out: dict[str, dict[Aggregation, float]]) -> None:
        """``aggregate_by`` of some values (each with its series), into ``out``."""
        parts_of = self._points(kind, [s for _, members in groups for s in members], lo, hi)
        for value, members in groups:
            group = [(s.id, ts, vs) for s in members for ts, vs in parts_of.get(s.id, ()) if len(ts)]
            values = [v for _, _, vs in group for v in vs]
            if not values:
                continue
            found: dict[Aggregation, float] = {}
            for agg in wanted:
                if agg is Aggregation.LAST:
                    found[agg] = max((t, sid, v) for sid, ts, vs in group
                                     for t, v in zip(ts, vs, strict=True))[2]
                else:
                    found[agg] = aggregate_values(values, agg)
            out[value] = found

    def last_by(self, kind: str, label: str, values: Iterable[str], start: float, end: float) -> dict[str, float]:
        """Per value of ``label``, the newest sample within [start, end] of its series: what
        ``aggregate_by`` gives as LAST, for the values that have one.

        The QoS strategies ask this every second about every pod or container. When
        ``label`` is the kind's only label, each value has one series, looked up by its key;
        its newest sample is the head's last when the head is in time order, newer than any
        chunk and that sample lies in the window. Any value the head cannot answer so is
        left to ``aggregate_by``."""
        check_query(kind, {label: ""})
        if SCHEMA[kind] != (label,):
            found = self.aggregate_by(kind, label, start, end, (Aggregation.LAST,))
            return {v: found[v][Aggregation.LAST] for v in values if v in found}
        lo, hi = to_ms(start), to_ms(end)
        out: dict[str, float] = {}
        rest = []
        with self._lock:
            series, chunks_newest = self._series, self._chunks_newest
            for value in values:
                one = series.get(series_key(kind, {label: value}))
                if one is None:
                    if lo <= self._idle_newest:  # maybe dropped from memory as idle: ask the chunks
                        rest.append(value)
                    continue  # no series: no sample
                if one.in_order and one.ts and lo <= one.newest <= hi and one.newest > chunks_newest:
                    out[value] = one.values[-1]
                else:
                    rest.append(value)
        if rest:
            found = self.aggregate_by(kind, label, start, end, (Aggregation.LAST,))
            out.update((v, found[v][Aggregation.LAST]) for v in rest if v in found)
        return out

    def _series_points(self, kind: str, start: float, end: float, labels: Mapping[str, str] | None
                       ) -> dict[int, list[tuple[Sequence[int], Sequence[float]]]]:
        """By series id, the (ms times, values) parts within [start, end] of each series of
        ``kind`` whose labels include ``labels``."""
        check_query(kind, labels)
        want = dict(labels or {})
        lo, hi = to_ms(start), to_ms(end)
        with self._lock:
            if want and len(want) == len(SCHEMA[kind]):  # every label given: one series at most
                try:
                    one = self._series.get(series_key(kind, want))
                except (TypeError, MetricCacheError):  # an unhashable or unsortable value names no series
                    one = None
                matching = [one] if one is not None else [s for s in self._idle(kind, lo, hi) if s.labels == want]
            else:
                matching = [s for s in [*self._recent(kind, lo), *self._idle(kind, lo, hi)]
                            if all(s.labels.get(k) == v for k, v in want.items())]
        return self._points(kind, matching, lo, hi)

    def _points(self, kind: str, matching: list[Series], lo: int, hi: int
                ) -> dict[int, list[tuple[Sequence[int], Sequence[float]]]]:
        """By series id, the (ms times, values) parts within [lo, hi] ms of each of
        ``matching``: the head's, then each chunk's. The head and the chunks are read
        under one hold of the lock (a cut moves samples from one to the other); the
        chunks are decoded after it. A series forgotten meanwhile has nothing left."""
        ids = [s.id for s in matching]
        found: dict[int, list[tuple[Sequence[int], Sequence[float]]]] = {}
        blobs: list[tuple[int, bytes]] = []
        with self._lock:
            db = self._conn()
            for i in range(0, len(ids) if lo <= self._chunks_newest else 0, _IDS_PER_QUERY):
                chunk = ids[i:i + _IDS_PER_QUERY]
                marks = ",".join("?" * len(chunk))
                blobs += db.execute(
                    f"SELECT series_id, data FROM chunks WHERE series_id IN ({marks}) "
                    "AND max_ts >= ? AND min_ts <= ?", (*chunk, lo, hi)).fetchall()
            for s in matching:
                found[s.id] = [s.window(lo, hi)]
        for sid, blob in blobs:
            try:
                times, vals = decode_chunk(blob)
            except ValueError as exc:
                log.error("metric cache: %s series %d: %s; skipped", kind, sid, exc)
                continue
            found[sid].append(chunk_window(times, vals, lo, hi))
        return found

    def series_labels(self, kind: str) -> list[dict[str, str]]:
        """The label sets of every series of ``kind`` the cache holds (old ones included)."""
        with self._lock:
            return [dict(s.labels) for s in [*self._by_kind.get(kind, ()), *self._idle(kind, -1, 2**62)]]

    def aggregate(self, kind: str, start: float, end: float, agg: Aggregation,
                  labels: Mapping[str, str] | None = None) -> float | None:
        return aggregate(self.query(kind, start, end, labels), agg)

    def time_range(self, kind: str, start: float, end: float,
                   labels: Mapping[str, str] | None = None) -> float:
        """Last minus first sample time in the window; 0 with fewer than two samples."""
        points = self.query(kind, start, end, labels)
        if len(points) < 2:
            return 0.0
        return points[-1][0] - points[0][0]
