"""Durations in Go's syntax (``10s``, ``500ms``, ``1m30s``, ``1.5h``), as upstream's flags take them."""

from __future__ import annotations

import math
import re

_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")

MAX_TEXT = 64
"""A longer duration text is a mistake or an attack; Go's own durations fit in 20 characters."""

MAX_SECONDS = 290 * 365 * 24 * 3600.0
"""Go's time.Duration tops out at about 290 years."""


def parse_duration(text: str, *, bare_seconds: bool = False) -> float:
    """Seconds from a Go duration; ``0`` is zero. ValueError with an example otherwise.

    ``bare_seconds`` also takes a plain number as seconds (``5``, ``2.5``), for this
    project's own flags; upstream's flags keep Go's rule that a unit is required.
    """
    value = text.strip()
    if len(value) > MAX_TEXT:
        raise ValueError(f"not a duration: {value[:MAX_TEXT]!r}... is longer than {MAX_TEXT} characters")
    if value == "0":
        return 0.0
    if bare_seconds and _NUMBER.fullmatch(value):
        return _bounded(float(value), text)
    pos, total = 0, 0.0
    for m in _PART.finditer(value):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not value or pos != len(value):
        examples = "10s, 500ms, 1m30s" + (", 2.5" if bare_seconds else "")
        raise ValueError(f"not a duration: {text!r} (examples: {examples})")
    return _bounded(total, text)


def _bounded(seconds: float, text: str) -> float:
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise ValueError(f"duration {text!r} is longer than {MAX_SECONDS / (365 * 24 * 3600):.0f} years")
    return seconds
