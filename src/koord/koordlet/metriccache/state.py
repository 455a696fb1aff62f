"""What the metric cache's parts share: the connection, the lock every access holds, and the
in-memory index of series (by key, by id, by kind) with the two marks that let a query
skip the chunks or the series dropped from memory."""

from __future__ import annotations

import sqlite3
import threading

from .chunks import Series
from .samples import MetricCacheError, SeriesKey


class CacheState:
    """Set up by ``MetricCache.__init__``; ``Queries`` and ``KeyValues`` read it."""

    _lock: threading.Lock
    _db: sqlite3.Connection | None
    _series: dict[SeriesKey, Series]
    _by_id: dict[int, Series]
    _by_kind: dict[str, list[Series]]
    _idle_newest: int
    """The newest sample (ms) of any series dropped from memory as idle: a query window
    starting after it finds every series it needs in memory."""
    _chunks_newest: float
    """The largest ``max_ts`` of any chunk written (ms; -1 with none): a query window
    starting after it, as every "last few seconds" query does, needs no chunk lookup."""

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise MetricCacheError("metric cache is closed")
        return self._db
