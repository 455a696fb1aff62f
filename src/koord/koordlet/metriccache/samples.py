"""What the metric cache stores and answers about: samples, their series keys, and the
checks a sample or a query passes before it reaches the store.

A collectors' tick is a ``Samples``: series keys and values side by side, the keys made
once by the collector and reused, so storing a known series' sample costs a range check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .chunks import Series
from .kinds import SCHEMA

MAX_LABEL_VALUE = 256


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


def known_floats(known: Mapping[SeriesKey, Series], tick: Samples) -> bool:
    """Every sample of ``tick`` is of a known series and a finite float: what a collectors'
    tick nearly always is, checked in C-level passes (a sum of finite floats that is finite
    proves them all finite; a sum that overflows only sends the tick to the full check)."""
    values = tick.values
    return (len(values) == len(tick.keys) and all(map(known.__contains__, tick.keys))
            and set(map(type, values)) <= {float} and math.isfinite(sum(values)))


def labels_json(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"))


def to_ms(ts: float) -> int:
    return round(ts * 1000)


def check_number(sample: Sample) -> None:
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
    check_number(sample)


def check_query(kind: str, labels: Mapping[str, str] | None) -> None:
    names = SCHEMA.get(kind)
    if names is None:
        raise MetricCacheError(f"query: unknown metric kind {kind!r}")
    unknown = set(labels or ()) - set(names)
    if unknown:
        raise MetricCacheError(
            f"query {kind!r}: unknown labels {sorted(unknown)}; this kind has {sorted(names)}")
