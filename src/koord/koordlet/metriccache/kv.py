"""The metric cache's static values (the CPU topology, the predictor's state): JSON by key."""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any

from .samples import MetricCacheError
from .state import CacheState

log = logging.getLogger(__name__)


class KeyValues(CacheState):
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
