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

Files written before ``head_ticks`` hold their head as one row per sample in ``head``: read
at open like the ticks, and emptied with them.

``series`` maps kind + sorted labels to a small integer id once; ``kv`` holds JSON values.
Bounds: chunks older than the retention are dropped, and while the used pages exceed the
size bound the oldest tenth of the stored span goes. Freed pages are reused, so the file
stops growing at the bound. In memory, a series idle for ``DEFAULT_IDLE_SECONDS`` (a pod
that left) is dropped; its rows stay until the retention.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .aggregate import Aggregation, aggregate, aggregate_values
from .chunks import Series, chunk_window, decode_chunk, decode_tick, encode_chunk, encode_tick
from .kinds import SCHEMA

log = logging.getLogger(__name__)

DB_NAME = "metrics.db"
LOCK_NAME = "LOCK"
DEFAULT_RETENTION_SECONDS = 12 * 3600.0
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
MIN_MAX_BYTES = 1024 * 1024
DEFAULT_CHUNK_SECONDS = 60.0
"""The in-memory head holds up to this much of every series (16 bytes a sample: 1.2 MiB a
minute at 100 pods x 3 containers); a cut of a minute's head costs ~26 ms of CPU there."""
MAX_LABEL_VALUE = 256
# Retention is enforced at most this often (and at open); the size bound after every write.
GC_INTERVAL_SECONDS = 60.0
DEFAULT_IDLE_SECONDS = 3600.0
"""A series without a sample for this long (a pod or container that left) is dropped from
memory: about half a kilobyte each, a dozen a pod, kept for the retention they would grow
with every pod a node ran in the last 12 hours. Its chunks stay on disk until the
retention, and a query reaching back that far reads them from there (koordlet's own
queries look back 30 minutes at most)."""
PAGE_CACHE_KIB = 512
# SQLite caps bound parameters; series ids are queried in chunks below it.
_IDS_PER_QUERY = 500
_AGGREGATE_BATCH = 32
"""Series whose points ``aggregate_by`` decodes and holds at once."""

_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    labels TEXT NOT NULL,
    UNIQUE (kind, labels)
);
CREATE TABLE IF NOT EXISTS head (
    series_id INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    value REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS head_ticks (
    ts INTEGER NOT NULL,
    series BLOB NOT NULL,
    vals BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    series_id INTEGER NOT NULL,
    max_ts INTEGER NOT NULL,
    min_ts INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (series_id, max_ts)
);
CREATE INDEX IF NOT EXISTS chunks_by_time ON chunks (max_ts);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class MetricCacheError(Exception):
    """The metric cache cannot open, or a sample or query is invalid; the message says which."""


@dataclass(frozen=True)
class Sample:
    """One sample, for callers storing a few at a time (tests, tools); a collector's tick
    builds ``Samples`` instead."""

    kind: str
    labels: Mapping[str, str]
    timestamp: float  # unix seconds
    value: float


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""A series' identity: its kind and its labels as sorted (name, value) pairs."""


def series_key(kind: str, labels: Mapping[str, str]) -> SeriesKey:
    """MetricCacheError when the labels cannot be a key (not a mapping of sortable names)."""
    try:
        items = tuple(labels.items())
        # Most series have one label (a pod uid, a container id): nothing to sort.
        return kind, items if len(items) < 2 else tuple(sorted(items))
    except (TypeError, AttributeError):
        raise MetricCacheError(f"sample of {kind!r}: labels {labels!r} are not a mapping of "
                               "names to strings") from None


class Samples:
    """One tick's samples, all taken at ``timestamp``: series keys and values side by side.

    What a collector builds every second for a thousand series: a caller that knows its
    series makes each key once with ``series_key`` and reuses it, so a sample costs two
    list appends, and the metric cache checks a known series' value and nothing else.
    Iterating gives ``Sample`` objects (for tests and logs)."""

    __slots__ = ("keys", "timestamp", "values")

    def __init__(self, timestamp: float) -> None:
        self.timestamp = timestamp
        self.keys: list[SeriesKey] = []
        self.values: list[float] = []

    def add(self, kind: str, labels: Mapping[str, str], value: float) -> None:
        self.keys.append(series_key(kind, labels))
        self.values.append(value)

    def add_keyed(self, key: SeriesKey, value: float) -> None:
        self.keys.append(key)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[Sample]:
        for (kind, labels), value in zip(self.keys, self.values, strict=True):
            yield Sample(kind, dict(labels), self.timestamp, value)

    def __repr__(self) -> str:
        return f"Samples(at {self.timestamp}, {len(self.keys)} samples)"


def _known_floats(known: Mapping[SeriesKey, Series], tick: Samples) -> bool:
    """Every sample of ``tick`` is of a known series and a finite float: what a collectors'
    tick nearly always is, checked in C-level passes (a sum of finite floats that is finite
    proves them all finite; a sum that overflows only sends the tick to the full check)."""
    values = tick.values
    return (len(values) == len(tick.keys) and all(map(known.__contains__, tick.keys))
            and set(map(type, values)) <= {float} and math.isfinite(sum(values)))


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN ... COMMIT, rolled back when the body raises (the error goes on)."""
    db.execute("BEGIN")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _labels_json(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"))


def _ms(ts: float) -> int:
    return round(ts * 1000)


def _check_number(sample: Sample) -> None:
    ts, value = sample.timestamp, sample.value
    if type(ts) is float and type(value) is float and 0 <= ts < math.inf and -math.inf < value < math.inf:
        return  # what every collector sends, checked without the loop below (NaN fails here)
    for what, number in (("timestamp", sample.timestamp), ("value", sample.value)):
        try:
            finite = not isinstance(number, bool) and isinstance(number, (int, float)) and math.isfinite(number)
        except OverflowError:  # an int beyond any float
            finite = False
        if not finite:
            raise MetricCacheError(f"sample {sample!r}: {what} must be a finite number")
    if sample.timestamp < 0:
        raise MetricCacheError(f"sample {sample!r}: negative timestamp")


def validate_sample(sample: Sample) -> None:
    """Raises MetricCacheError naming the sample when it does not fit its kind's schema."""
    names = SCHEMA.get(sample.kind)
    if names is None:
        raise MetricCacheError(f"sample {sample!r}: unknown metric kind {sample.kind!r}")
    if len(sample.labels) != len(names) or set(sample.labels) != set(names):
        raise MetricCacheError(
            f"sample {sample!r}: kind {sample.kind!r} needs exactly the labels {sorted(names)}, "
            f"got {sorted(sample.labels)}")
    for name, value in sample.labels.items():
        if not isinstance(value, str) or not value or len(value) > MAX_LABEL_VALUE:
            raise MetricCacheError(
                f"sample {sample!r}: label {name!r} must be a non-empty string of at most "
                f"{MAX_LABEL_VALUE} characters")
    _check_number(sample)


def _check_query(kind: str, labels: Mapping[str, str] | None) -> None:
    names = SCHEMA.get(kind)
    if names is None:
        raise MetricCacheError(f"query: unknown metric kind {kind!r}")
    unknown = set(labels or ()) - set(names)
    if unknown:
        raise MetricCacheError(
            f"query {kind!r}: unknown labels {sorted(unknown)}; this kind has {sorted(names)}")


class MetricCache:
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
            self._use(self._connect(":memory:"))
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MetricCacheError(f"metric cache dir {self.path}: {exc.strerror or exc}") from None
        self._take_dir_lock()
        db_file = self.path / DB_NAME
        try:
            try:
                self._use(self._connect(str(db_file)), check=True)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError):
                    raise
                self._close_db()
                self._move_aside(db_file, exc)
                self._use(self._connect(str(db_file)))
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

    @staticmethod
    def _move_aside(db_file: Path, exc: Exception) -> None:
        """Keeps the damaged file (and its WAL) for a human under a name that says when."""
        aside = db_file.with_name(f"{DB_NAME}.corrupt-{int(time.time())}")
        log.error("metric cache %s is damaged (%s); moved to %s, starting empty",
                  db_file, exc, aside)
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(db_file) + suffix)
            if src.exists():
                src.rename(Path(str(aside) + suffix))

    def _take_dir_lock(self) -> None:
        assert self.path is not None
        fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise MetricCacheError(
                f"metric cache dir {self.path} is in use by another process (pid {holder}); "
                "give each koordlet its own --tsdb-path") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _release_dir_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _connect(self, target: str) -> sqlite3.Connection:
        db = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a process crash (kill -9), not a power cut.
            db.execute("PRAGMA synchronous=NORMAL")
            # SQLite's default page cache is 2 MiB; the hot data lives in memory (the head
            # mirror) and a report reads each chunk once, so 512 KiB serves as well.
            db.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
            db.execute(f"PRAGMA journal_size_limit={self._journal_limit}")
            page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
            db.execute(f"PRAGMA wal_autocheckpoint={max(self._journal_limit // page_size, 16)}")
            db.executescript(_SCHEMA_SQL)
            db.execute("SELECT count(*) FROM series").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

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

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise MetricCacheError("metric cache is closed")
        return self._db

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
        for sid, ts, value in db.execute("SELECT series_id, ts, value FROM head ORDER BY rowid"):
            series = by_id.get(sid)
            if series is not None:
                series.add(ts, value)
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
                    _check_number(Sample(key[0], dict(key[1]), ts, value))
            count += len(tick.keys)
            if _known_floats(known, tick):
                continue
            for key, value in zip(tick.keys, tick.values, strict=True):
                if not (type(value) is float and -math.inf < value < math.inf) or key not in known:
                    sample = Sample(key[0], dict(key[1]), ts, value)
                    if key in known:
                        _check_number(sample)  # its labels already passed as this series'
                    else:
                        validate_sample(sample)
        if not count:
            return
        with self._lock:
            db = self._conn()
            created: list[SeriesKey] = []
            stored: list[tuple[int, list[Series], list[float]]] = []
            try:
                with _transaction(db):
                    for tick in ticks:
                        if not tick.keys:
                            continue
                        ms = _ms(tick.timestamp)
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
        text = _labels_json(labels)
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
            with _transaction(db):
                db.executemany("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)", rows())
                db.execute("DELETE FROM head")
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
                total += (self.path / (DB_NAME + suffix)).stat().st_size
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
            self._delete_before(db, _ms(now - self.retention_seconds), thorough=force)
            self._drop_idle(_ms(now - self.idle_seconds))
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
            with _transaction(db):
                db.execute("DELETE FROM chunks WHERE max_ts < ?", (cutoff_ms,))
                if head_expired or thorough:
                    db.execute("DELETE FROM head WHERE ts < ?", (cutoff_ms,))
                    db.execute("DELETE FROM head_ticks WHERE ts < ?", (cutoff_ms,))
                if thorough:
                    keep = {sid for sid, series in self._by_id.items() if series.ts}
                    keep.update(sid for (sid,) in db.execute("SELECT DISTINCT series_id FROM chunks"))
                    keep.update(sid for (sid,) in db.execute("SELECT DISTINCT series_id FROM head"))
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

    # ---- queries ------------------------------------------------------------------------

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
        _check_query(kind, {label: ""})
        wanted = tuple(aggs)
        lo, hi = _ms(start), _ms(end)
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
        _check_query(kind, {label: ""})
        if SCHEMA[kind] != (label,):
            found = self.aggregate_by(kind, label, start, end, (Aggregation.LAST,))
            return {v: found[v][Aggregation.LAST] for v in values if v in found}
        lo, hi = _ms(start), _ms(end)
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
        _check_query(kind, labels)
        want = dict(labels or {})
        lo, hi = _ms(start), _ms(end)
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

    # ---- KV -----------------------------------------------------------------------------

    def set_kv(self, key: str, value: Any) -> None:
        try:
            text = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise MetricCacheError(f"kv {key!r}: value is not JSON-serialisable: {exc}") from None
        with self._lock:
            try:
                self._conn().execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, text))
            except sqlite3.Error as exc:
                raise MetricCacheError(f"kv {key!r}: write failed: {exc}") from None

    def get_kv(self, key: str) -> Any | None:
        with self._lock:
            row = self._conn().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except ValueError:
            log.error("metric cache: kv %r holds unreadable JSON; treated as absent", key)
            return None
