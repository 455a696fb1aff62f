"""Aggregations over the samples of a query window, computed as upstream koordlet does."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum


class Aggregation(Enum):
    AVG = "avg"
    LAST = "last"
    COUNT = "count"
    P50 = "p50"
    P90 = "p90"
    P95 = "p95"
    P99 = "p99"


_QUANTILE = {Aggregation.P50: 0.5, Aggregation.P90: 0.9, Aggregation.P95: 0.95, Aggregation.P99: 0.99}


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest rank without interpolation, upstream's rule: ascending sort, index
    int(n x p) - 1 clamped to 0. ValueError on an empty sequence."""
    if not values:
        raise ValueError("percentile of no samples")
    ordered = sorted(values)
    index = max(int(len(ordered) * p) - 1, 0)
    return ordered[index]


def aggregate(points: Sequence[tuple[float, float]], agg: Aggregation) -> float | None:
    """One number for (timestamp, value) points in ascending time order; None when empty."""
    if not points:
        return None
    if agg is Aggregation.COUNT:
        return float(len(points))
    if agg is Aggregation.LAST:
        # Newest timestamp wins; among equal timestamps (several series) the last one listed.
        return max(enumerate(points), key=lambda ip: (ip[1][0], ip[0]))[1][1]
    return aggregate_values([v for _, v in points], agg)


def aggregate_values(values: Sequence[float], agg: Aggregation) -> float:
    """COUNT, AVG or a percentile of non-empty values, in any order (fsum is exact whatever
    the order; a percentile sorts); LAST needs times, so it is not one of them."""
    if agg is Aggregation.COUNT:
        return float(len(values))
    if agg is Aggregation.AVG:
        return math.fsum(values) / len(values)
    if agg is Aggregation.LAST:
        raise ValueError("LAST needs the samples' times")
    return percentile(values, _QUANTILE[agg])
