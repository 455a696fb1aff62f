"""The metric cache: koordlet's time series and static KV, in one SQLite file per node agent.

Why SQLite: it ships with Python and survives ``kill -9`` (WAL, one commit per collector
tick). Why this layout: a node with 110 pods x 3 containers writes ~1300 samples a second
to ~1000 series. Stored one row per sample clustered by series, every tick dirties one page
per series (measured: 20 ms of CPU and 7 MB written per tick). So samples are kept the
way Prometheus' TSDB keeps them, as a head plus chunks:

- ``head_ticks``: every tick's samples as they arrive, one row per tick (its time, its
  series ids and its values as two arrays: one insert a second, not one per sample), and
  mirrored in memory per series, which is what queries read for recent data;
- ``chunks``: every ``chunk_seconds`` the head is cut into one compressed blob per series
  (ms deltas + float64 values, zlib) keyed by (series, time span), so a window query
  on one pod reads only that pod's few rows; the head is then emptied.

``series`` maps kind + sorted labels to a small integer id once; ``kv`` holds JSON values
(``kv.py``). The file itself (schema, lock, damage, migration) is ``sqlitefile.py``; the
answers ``queries.py``; what a sample is and the checks it passes ``samples.py``.
Bounds: chunks older than the retention are dropped, and while the used pages exceed the
size bound the oldest tenth of the stored span goes. Freed pages are reused, so the file
stops growing at the bound. In memory, a series idle for ``DEFAULT_IDLE_SECONDS`` (a pod
that left) is dropped; its rows stay until the retention.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from . import sqlitefile
from .chunks import Series, decode_tick, encode_chunk, encode_tick
from .kv import KeyValues
from .queries import Queries
from .samples import (
    MetricCacheError,
    Sample,
    Samples,
    SeriesKey,
    check_number,
    known_floats,
    labels_json,
    series_key,
    to_ms,
    validate_sample,
)
from .sqlitefile import transaction

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 12 * 3600.0
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
MIN_MAX_BYTES = 1024 * 1024
DEFAULT_CHUNK_SECONDS = 60.0
"""The in-memory head holds up to this much of every series (16 bytes a sample: 1.2 MiB a
minute at 100 pods x 3 containers); a cut of a minute's head costs ~26 ms of CPU there."""
# Retention is enforced at most this often (and at open); the size bound after every write.
GC_INTERVAL_SECONDS = 60.0
DEFAULT_IDLE_SECONDS = 3600.0
"""A series without a sample for this long (a pod or container that left) is dropped from
memory: about half a kilobyte each, a dozen a pod, kept for the retention they would grow
with every pod a node ran in the last 12 hours. Its chunks stay on disk until the
retention, and a query reaching back that far reads them from there (koordlet's own
queries look back 30 minutes at most)."""

class MetricCache(Queries, KeyValues):
    """Thread-safe store of metric samples and KV values.

    ``path`` is a directory (created) holding ``metrics.db``; ``None`` keeps everything in
    memory (tests). One process at a time may open a directory: a second gets a
    MetricCacheError instead of sharing (and corrupting) another koordlet's data.
    """

    def __init__(self, path: Path | None, retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                 max_bytes: int = DEFAULT_MAX_BYTES, *, chunk_seconds: float = DEFAULT_CHUNK_SECONDS,
                 idle_seconds: float = DEFAULT_IDLE_SECONDS, clock: Callable[[], float] = time.time) -> None:
        if not (math.isfinite(retention_seconds) and retention_seconds > 0):
            raise MetricCacheError(f"retention {retention_seconds!r} s: want a positive duration")
        if max_bytes < MIN_MAX_BYTES:
            raise MetricCacheError(f"max bytes {max_bytes}: want at least {MIN_MAX_BYTES}")
        self.path = None if path is None else Path(path)
        self.retention_seconds = float(retention_seconds)
        self.max_bytes = int(max_bytes)
        self.chunk_seconds = float(chunk_seconds)
        self.idle_seconds = float(idle_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._series: dict[SeriesKey, Series] = {}
        self._by_id: dict[int, Series] = {}
        self._by_kind: dict[str, list[Series]] = {}
        self._last_gc = -math.inf
        self._idle_newest = -1
        """The newest sample (ms) of any series dropped from memory as idle: a query window
        starting after it finds every series it needs in memory."""
        self._chunks_newest: float = math.inf
        """The largest ``max_ts`` of any chunk written (ms; -1 with none): a query window
        starting after it, as every "last few seconds" query does, needs no chunk lookup."""
        self._last_cut = clock()
        # The WAL may grow to this before it is truncated; it counts against the size bound.
        self._journal_limit = min(4 * 1024 * 1024, self.max_bytes // 8)
        self._failed_writes = 0  # appends failed in a row (disk full, I/O errors)
        self._diverged = False  # a failed expiry left rows the in-memory heads no longer hold
        self._db: sqlite3.Connection | None = None
        self._page_size = 4096
        self._open()

    # ---- open / close -------------------------------------------------------------------

    def _open(self) -> None:
        """Opens, checks and loads the database; a damaged file is moved aside, not fatal.

        Damage (SQLite's "malformed" or "not a database", or a failed ``PRAGMA
        quick_check``) can surface at the first page read, when the series and head are
        loaded, or at the first maintenance, so all of these run here. Operational errors
        (disk full, permissions, locks) are raised instead: the file may be fine, and the
        caller retries later.
        """
        if self.path is None:
            self._use(sqlitefile.connect(":memory:", self._journal_limit))
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MetricCacheError(f"metric cache dir {self.path}: {exc.strerror or exc}") from None
        self._lock_fd = sqlitefile.take_dir_lock(self.path)
        db_file = self.path / sqlitefile.DB_NAME
        try:
            try:
                self._use(sqlitefile.connect(str(db_file), self._journal_limit), check=True)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError):
                    raise
                self._close_db()
                sqlitefile.move_aside(db_file, exc)
                self._use(sqlitefile.connect(str(db_file), self._journal_limit))
        except sqlite3.Error as exc:
            self._close_db()
            self._release_dir_lock()
            raise MetricCacheError(f"metric cache {db_file}: cannot open: {exc}") from None

    def _use(self, db: sqlite3.Connection, check: bool = False) -> None:
        """Makes ``db`` the connection and loads it; sqlite3 errors go to the caller."""
        self._db = db
        if check:
            result = db.execute("PRAGMA quick_check(1)").fetchone()
            if not result or result[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {result[0] if result else 'no answer'}")
        self._page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
        self._load_series()
        with self._lock:
            self._maintain(force=True)

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _release_dir_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        with self._lock:
            if self._db is None:
                return
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("metric cache: checkpoint at close failed: %s", exc)
            self._close_db()
            self._release_dir_lock()

    def _load_series(self) -> None:
        """Series and the head from disk, once at open."""
        self._series.clear()
        self._by_id.clear()
        self._by_kind.clear()
        db = self._conn()
        for sid, kind, labels in db.execute("SELECT id, kind, labels FROM series"):
            try:
                parsed = json.loads(labels)
            except ValueError:
                log.error("metric cache: series %d of %s has unreadable labels %r; ignored",
                          sid, kind, labels[:100])
                continue
            self._add_series(kind, Series(sid, parsed))
        newest = db.execute("SELECT max(max_ts) FROM chunks").fetchone()[0]
        self._chunks_newest = -1 if newest is None else int(newest)
        by_id = self._by_id
        for sid, cut in db.execute("SELECT series_id, max(max_ts) FROM chunks GROUP BY series_id"):
            series = by_id.get(sid)
            if series is not None:
                series.cut_at(int(cut))
        for ts, sids, values in db.execute("SELECT ts, series, vals FROM head_ticks ORDER BY rowid"):
            try:
                decoded = decode_tick(sids, values)
            except ValueError as exc:
                log.error("metric cache: the samples stored at %s ms are unreadable (%s); skipped", ts, exc)
                continue
            for sid, value in zip(*decoded, strict=True):
                series = by_id.get(sid)
                if series is not None:
                    series.add(ts, value)

    def _add_series(self, kind: str, series: Series) -> None:
        self._series[series_key(kind, series.labels)] = series
        self._by_id[series.id] = series
        self._by_kind.setdefault(kind, []).append(series)

    # ---- append -------------------------------------------------------------------------

    def append(self, samples: Iterable[Sample]) -> None:
        """Stores a batch in one transaction: all of it, or (on an invalid sample) none."""
        ticks: list[Samples] = []
        for sample in samples:
            if not ticks or ticks[-1].timestamp != sample.timestamp:
                ticks.append(Samples(sample.timestamp))
            ticks[-1].add(sample.kind, sample.labels, sample.value)
        self.append_ticks(ticks)

    def append_ticks(self, ticks: Sequence[Samples]) -> None:
        """Stores ticks' samples in one transaction: all of them or, when a sample does not
        fit its kind (MetricCacheError naming it), none.

        A collectors' tick brings over a thousand samples a second, nearly all of series
        already known, with float values: those cost a dict lookup and a range check here
        and are stored without building an object per sample; anything else is validated
        in full."""
        known = self._series
        count = 0
        for tick in ticks:
            ts = tick.timestamp
            if not (type(ts) is float and 0 <= ts < math.inf):
                for key, value in zip(tick.keys, tick.values, strict=True):
                    check_number(Sample(key[0], dict(key[1]), ts, value))
            count += len(tick.keys)
            if known_floats(known, tick):
                continue
            for key, value in zip(tick.keys, tick.values, strict=True):
                if not (type(value) is float and -math.inf < value < math.inf) or key not in known:
                    sample = Sample(key[0], dict(key[1]), ts, value)
                    if key in known:
                        check_number(sample)  # its labels already passed as this series'
                    else:
                        validate_sample(sample)
        if not count:
            return
        with self._lock:
            db = self._conn()
            created: list[SeriesKey] = []
            stored: list[tuple[int, list[Series], list[float]]] = []
            try:
                with transaction(db):
                    for tick in ticks:
                        if not tick.keys:
                            continue
                        ms = to_ms(tick.timestamp)
                        series = [known.get(key) or self._new_series(db, key, created) for key in tick.keys]
                        db.execute("INSERT INTO head_ticks VALUES (?, ?, ?)",
                                   (ms, *encode_tick([s.id for s in series], tick.values)))
                        stored.append((ms, series, tick.values))
            except sqlite3.Error as exc:
                self._forget_series(created)  # the rollback undid their rows; nothing else changed
                self._failed_writes += 1
                # No "metric cache:" prefix: callers name the cache in their own message.
                raise MetricCacheError(f"append of {count} samples failed: {exc}") from None
            if self._failed_writes:
                log.info("metric cache: writes succeed again after %d failed appends",
                         self._failed_writes)
                self._failed_writes = 0
            dropped = 0
            for ms, series, values in stored:
                for one, value in zip(series, values, strict=True):
                    if not one.add(ms, value):
                        dropped += 1
            if dropped:
                log.warning("metric cache: %d samples at %s dropped: their series are stored up to a "
                            "later instant (the clock stepped back?)", dropped,
                            ", ".join(f"{ms} ms" for ms, _, _ in stored[:3]))
            self._maintain()

    def _new_series(self, db: sqlite3.Connection, key: SeriesKey, created: list[SeriesKey]) -> Series:
        """A series not in memory: new, or one dropped as idle that has samples again (its
        row and chunks are still there)."""
        kind, labels = key[0], dict(key[1])
        text = labels_json(labels)
        cur = db.execute("INSERT OR IGNORE INTO series (kind, labels) VALUES (?, ?)", (kind, text))
        if cur.rowcount:
            sid = int(cur.lastrowid or 0)
        else:
            sid = int(db.execute("SELECT id FROM series WHERE kind = ? AND labels = ?", (kind, text)).fetchone()[0])
        series = Series(sid, labels)
        self._add_series(kind, series)
        created.append(key)
        return series

    def _forget_series(self, keys: Iterable[SeriesKey]) -> None:
        """Drops these series from memory: one pass over each kind's list for all of them
        (an expiry or an idle hour may drop thousands), not a list removal a series."""
        kinds = set()
        for key in keys:
            del self._by_id[self._series.pop(key).id]
            kinds.add(key[0])
        for kind in kinds:
            self._by_kind[kind] = [s for s in self._by_kind[kind] if s.id in self._by_id]

    def _cut_chunks(self, db: sqlite3.Connection) -> None:
        """Moves the whole head into one chunk per series and empties the head table. The
        rows are made one at a time as SQLite takes them: a hundred pods' thousand blobs
        made at once were a megabyte-sized spike every cut, and the allocator kept the
        holes it left between longer-lived objects (the process grew at every cut)."""
        newest = self._chunks_newest
        cuts: list[tuple[Series, int]] = []

        def rows() -> Iterator[tuple[int, int, int, bytes]]:
            nonlocal newest
            for series in self._by_id.values():
                if not series.ts:
                    continue
                if series.in_order:  # as appended: increasing, one per ms (Series.add keeps it so)
                    last, first, blob = series.ts[-1], series.ts[0], encode_chunk(series.ts, series.values)
                else:
                    points = dict(sorted(zip(series.ts, series.values, strict=True)))  # a late sample: sort
                    last, first, blob = max(points), min(points), encode_chunk(points, points.values())
                newest = max(newest, last)
                cuts.append((series, last))
                yield series.id, last, first, blob

        try:
            with transaction(db):
                db.executemany("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)", rows())
                db.execute("DELETE FROM head_ticks")
        except sqlite3.Error as exc:
            log.error("metric cache: writing chunks failed (the head is kept): %s", exc)
            return
        self._chunks_newest = newest
        for series, last in cuts:
            series.cut_at(last)
        for series in self._by_id.values():
            series.clear()

    # ---- bounds -------------------------------------------------------------------------

    def used_bytes(self) -> int:
        """Bytes of the database pages in use (what the size bound limits)."""
        with self._lock:
            return self._used_bytes()

    def disk_bytes(self) -> int:
        """Bytes on disk: the database file and its WAL (0 in memory)."""
        if self.path is None:
            return 0
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += (self.path / (sqlitefile.DB_NAME + suffix)).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def _used_bytes(self) -> int:
        db = self._conn()
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
        return (pages - free) * self._page_size

    def flush(self) -> None:
        """Cuts the head into chunks now (normally every ``chunk_seconds``)."""
        with self._lock:
            self._cut_chunks(self._conn())
            self._maintain()

    def _maintain(self, force: bool = False) -> None:
        """Cuts chunks when due, drops expired chunks (every GC interval) and the oldest
        ones while over the size bound."""
        now = self._clock()
        db = self._conn()
        if now - self._last_cut >= self.chunk_seconds:
            self._last_cut = now
            self._cut_chunks(db)
        if force or now - self._last_gc >= GC_INTERVAL_SECONDS:
            self._last_gc = now
            self._delete_before(db, to_ms(now - self.retention_seconds), thorough=force)
            self._drop_idle(to_ms(now - self.idle_seconds))
        target = self.max_bytes - self._journal_limit
        while self._used_bytes() > target:
            oldest, newest, first_end = db.execute(
                "SELECT min(min_ts), max(max_ts), min(max_ts) FROM chunks").fetchone()
            if oldest is None:
                if not any(s.ts for s in self._by_id.values()):
                    break
                self._cut_chunks(db)  # everything is in the head: make it deletable
                continue
            # The oldest tenth of the span, and at least the chunk that ends first.
            cutoff = max(oldest + (newest - oldest) // 10, first_end + 1)
            log.info("metric cache over %d bytes: dropping samples older than %.3f",
                     self.max_bytes, cutoff / 1000)
            self._delete_before(db, cutoff)

    def _drop_idle(self, horizon_ms: int) -> None:
        """Drops from memory the series whose last sample is older than ``horizon_ms`` (see
        ``DEFAULT_IDLE_SECONDS``); their rows stay."""
        idle = [(key, series) for key, series in self._series.items() if not series.ts and series.cut < horizon_ms]
        for _, series in idle:
            self._idle_newest = max(self._idle_newest, series.cut)
        self._forget_series([key for key, _ in idle])

    def _delete_before(self, db: sqlite3.Connection, cutoff_ms: int, thorough: bool = False) -> None:
        """Drops chunks that end before the cutoff, head samples older than it, and series
        left without samples.

        Which series are left is asked of the chunks' index only for the series whose
        in-memory head is empty (the head tables hold exactly what the in-memory heads
        hold). ``thorough`` (at open, and after a failed expiry) asks about every series, so
        rows nothing in memory stands for (a series whose labels could not be read) go too.
        The head tables are touched only when some in-memory head held older samples."""
        thorough = thorough or self._diverged
        head_expired = False
        for series in self._by_id.values():  # first: the empty heads are then known
            head_expired |= series.drop_before(cutoff_ms)
        try:
            with transaction(db):
                db.execute("DELETE FROM chunks WHERE max_ts < ?", (cutoff_ms,))
                if head_expired or thorough:
                    db.execute("DELETE FROM head_ticks WHERE ts < ?", (cutoff_ms,))
                if thorough:
                    keep = {sid for sid, series in self._by_id.items() if series.ts}
                    keep.update(sid for (sid,) in db.execute("SELECT DISTINCT series_id FROM chunks"))
                    gone = [(sid,) for (sid,) in db.execute("SELECT id FROM series").fetchall() if sid not in keep]
                    db.executemany("DELETE FROM series WHERE id = ?", gone)
                else:
                    db.executemany("DELETE FROM series WHERE id = ? AND NOT EXISTS "
                                   "(SELECT 1 FROM chunks WHERE series_id = ?)",
                                   [(sid, sid) for sid, series in self._by_id.items() if not series.ts])
                    if self._idle_newest >= 0:  # and the idle ones dropped from memory
                        db.executemany("DELETE FROM series WHERE id = ?", [
                            (sid,) for (sid,) in db.execute(
                                "SELECT id FROM series WHERE id NOT IN (SELECT series_id FROM chunks)").fetchall()
                            if sid not in self._by_id])
        except sqlite3.Error as exc:
            log.error("metric cache: dropping old samples failed: %s", exc)
            self._diverged = True  # memory dropped what the tables kept: ask SQLite next time
            return
        self._diverged = False
        alive = {sid for (sid,) in db.execute("SELECT id FROM series")}
        self._forget_series([key for key, series in self._series.items() if series.id not in alive])
