"""RFC 3339 times as Kubernetes and Go write them (metav1.Time, time.Time in JSON)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

GO_ZERO_TIME = -62135596800.0
"""Go's zero time, 0001-01-01T00:00:00Z, in unix seconds."""
MAX_TEXT = 40
_FRACTION = re.compile(r"\.[0-9]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_time(seconds: float) -> str:
    """UTC with whole seconds, as metav1.Time marshals (Go's zero time for anything earlier)."""
    if seconds <= GO_ZERO_TIME:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any, where: str) -> float:
    """Unix seconds of an RFC 3339 time (``Z`` or an offset, up to nine fraction digits);
    ValueError naming ``where`` otherwise."""
    if not isinstance(text, str) or len(text) > MAX_TEXT or not text.isascii():
        raise ValueError(f"{where}: {text!r:.{MAX_TEXT}}: want an RFC 3339 time")
    # Go writes up to nine fraction digits; datetime takes six.
    normal = _FRACTION.sub(lambda m: m.group(0)[:7], text[:-1] + "+00:00" if text[-1:] in "Zz" else text)
    try:
        parsed = datetime.fromisoformat(normal)
    except ValueError:
        raise ValueError(f"{where}: {text!r}: want an RFC 3339 time") from None
    if parsed.tzinfo is None or "T" not in normal.upper():
        raise ValueError(f"{where}: {text!r}: want a date, a time and a zone (Z or an offset)")
    return (parsed - _EPOCH).total_seconds()
