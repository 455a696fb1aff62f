"""The metric cache's SQLite file: its schema, how a connection is set up, the lock that
keeps a second koordlet out of the directory, a damaged file moved aside, and the one-time
migration of a file written by an older koordlet.

Tables: ``series`` maps kind + sorted labels to a small integer id; ``head_ticks`` holds
every tick's samples since the last cut, one row per tick (its time, its series ids and its
values as two arrays); ``chunks`` one compressed blob per series and time span; ``kv``
JSON values.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from .chunks import encode_tick
from .samples import MetricCacheError

log = logging.getLogger(__name__)

DB_NAME = "metrics.db"
LOCK_NAME = "LOCK"
PAGE_CACHE_KIB = 512

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    labels TEXT NOT NULL,
    UNIQUE (kind, labels)
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


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN ... COMMIT, rolled back when the body raises (the error goes on)."""
    db.execute("BEGIN")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def connect(target: str, journal_limit: int) -> sqlite3.Connection:
    """A connection to ``target`` (a file or ``:memory:``) with the schema in place and a
    file of an older koordlet migrated; sqlite3 errors go to the caller."""
    db = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives a process crash (kill -9), not a power cut.
        db.execute("PRAGMA synchronous=NORMAL")
        # SQLite's default page cache is 2 MiB; the hot data lives in memory (the head
        # mirror) and a report reads each chunk once, so 512 KiB serves as well.
        db.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
        db.execute(f"PRAGMA journal_size_limit={journal_limit}")
        page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
        db.execute(f"PRAGMA wal_autocheckpoint={max(journal_limit // page_size, 16)}")
        db.executescript(SCHEMA_SQL)
        db.execute("SELECT count(*) FROM series").fetchone()
        migrate_sample_rows(db)
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def migrate_sample_rows(db: sqlite3.Connection) -> None:
    """A file written before ticks were stored one row each keeps its head as one row per
    sample in ``head``: those become ticks, before the ticks already stored (they are
    older), and the table goes. Once per file, in one transaction."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'head'").fetchone() is None:
        return
    ticks: dict[int, tuple[list[int], list[float]]] = {}
    for sid, ts, value in db.execute("SELECT series_id, ts, value FROM head ORDER BY rowid"):
        ids, values = ticks.setdefault(int(ts), ([], []))
        ids.append(int(sid))
        values.append(float(value))
    with transaction(db):
        newer = db.execute("SELECT ts, series, vals FROM head_ticks ORDER BY rowid").fetchall()
        db.execute("DELETE FROM head_ticks")
        db.executemany("INSERT INTO head_ticks VALUES (?, ?, ?)",
                       [(ts, *encode_tick(ids, values)) for ts, (ids, values) in ticks.items()])
        db.executemany("INSERT INTO head_ticks VALUES (?, ?, ?)", newer)
        db.execute("DROP TABLE head")
    log.info("metric cache: %d samples of an older file's head moved into %d ticks",
             sum(len(ids) for ids, _ in ticks.values()), len(ticks))


def move_aside(db_file: Path, exc: Exception) -> None:
    """Keeps the damaged file (and its WAL) for a human under a name that says when."""
    aside = db_file.with_name(f"{DB_NAME}.corrupt-{int(time.time())}")
    log.error("metric cache %s is damaged (%s); moved to %s, starting empty", db_file, exc, aside)
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(db_file) + suffix)
        if src.exists():
            src.rename(Path(str(aside) + suffix))


def take_dir_lock(path: Path) -> int:
    """An exclusive lock on ``path``'s LOCK file, holding this process's pid; its fd."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise MetricCacheError(
            f"metric cache dir {path} is in use by another process (pid {holder}); "
            "give each koordlet its own --tsdb-path") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd
