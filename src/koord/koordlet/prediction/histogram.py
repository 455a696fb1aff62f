"""Decaying histograms with exponential buckets, as the peak predictor keeps them.

A sample lands in one bucket; a percentile is the END of the bucket where the cumulative
weight first reaches it (no interpolation), so predictions err high by at most one bucket
(5 % with the predictor's ratio of 1.05). Newer samples weigh more: a sample's weight is
multiplied by 2^((t - reference) / half-life), so each half-life halves the importance of
the past. The reference time moves forward (rescaling every weight) before the exponent
could overflow.

Checkpoints are upstream's JSON: ``referenceTimestamp`` (RFC 3339), ``bucketWeights``
(bucket index -> weight scaled so the heaviest bucket is 10000) and ``totalWeight``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..rfc3339 import GO_ZERO_TIME, format_time, parse_time

MAX_CHECKPOINT_WEIGHT = 10000
MAX_DECAY_EXPONENT = 100


class HistogramError(ValueError):
    """A checkpoint that does not fit the histogram; the message says what."""


__all__ = ["DecayingHistogram", "ExponentialOptions", "Histogram", "HistogramError", "format_time",
           "parse_time"]


@dataclass(frozen=True)
class ExponentialOptions:
    """Bucket n >= 1 starts at first * (ratio^n - 1) / (ratio - 1); bucket 0 is [0, first).
    The last bucket starts at or above ``max_value`` and has no end."""

    max_value: float
    first_bucket_size: float
    ratio: float
    epsilon: float

    def __post_init__(self) -> None:
        if not (self.max_value > 0 and self.first_bucket_size > 0 and self.ratio > 1 and self.epsilon > 0):
            raise HistogramError("max value, first bucket size and epsilon must be > 0, ratio > 1")

    @property
    def num_buckets(self) -> int:
        return int(math.ceil(math.log(self.max_value * (self.ratio - 1) / self.first_bucket_size + 1)
                             / math.log(self.ratio))) + 1

    def find_bucket(self, value: float) -> int:
        if value < self.first_bucket_size:
            return 0
        bucket = int(math.log(value * (self.ratio - 1) / self.first_bucket_size + 1) / math.log(self.ratio))
        return min(bucket, self.num_buckets - 1)

    def bucket_start(self, bucket: int) -> float:
        if not 0 <= bucket < self.num_buckets:
            raise IndexError(f"bucket {bucket} out of range [0..{self.num_buckets - 1}]")
        if bucket == 0:
            return 0.0
        return self.first_bucket_size * (self.ratio ** bucket - 1) / (self.ratio - 1)


class Histogram:
    """Bucket weights; empty buckets (weight below epsilon) are outside [min_bucket, max_bucket]."""

    def __init__(self, options: ExponentialOptions) -> None:
        self.options = options
        self._n = options.num_buckets
        self.weights = [0.0] * self._n
        self.total = 0.0
        self.min_bucket = self._n - 1
        self.max_bucket = 0

    def add(self, value: float, weight: float) -> None:
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        self.weights[bucket] += weight
        self.total += weight
        if self.weights[bucket] >= self.options.epsilon:
            self.min_bucket = min(self.min_bucket, bucket)
            self.max_bucket = max(self.max_bucket, bucket)

    def is_empty(self) -> bool:
        return self.weights[self.min_bucket] < self.options.epsilon

    def percentile(self, p: float) -> float:
        """The end of the bucket where the cumulative weight reaches p x total; 0 when empty."""
        if self.is_empty():
            return 0.0
        threshold = p * self.total
        partial = 0.0
        bucket = self.min_bucket
        while bucket < self.max_bucket:
            partial += self.weights[bucket]
            if partial >= threshold:
                break
            bucket += 1
        if bucket < self._n - 1:
            return self.options.bucket_start(bucket + 1)
        return self.options.bucket_start(bucket)  # the last bucket has no end

    def scale(self, factor: float) -> None:
        for bucket in range(self.min_bucket, self.max_bucket + 1):
            self.weights[bucket] *= factor
        self.total *= factor
        self._update_min_max()

    def _update_min_max(self) -> None:
        eps, last = self.options.epsilon, self._n - 1
        while self.weights[self.min_bucket] < eps and self.min_bucket < last:
            self.min_bucket += 1
        while self.weights[self.max_bucket] < eps and self.max_bucket > 0:
            self.max_bucket -= 1

    def save(self) -> dict[str, Any]:
        heaviest = max(self.weights[self.min_bucket:self.max_bucket + 1], default=0.0)
        buckets: dict[str, int] = {}
        if heaviest > 0:
            ratio = MAX_CHECKPOINT_WEIGHT / heaviest
            for bucket in range(self.min_bucket, self.max_bucket + 1):
                weight = int(math.floor(self.weights[bucket] * ratio + 0.5))
                if weight > 0:
                    buckets[str(bucket)] = weight
        out: dict[str, Any] = {}
        if buckets:
            out["bucketWeights"] = buckets
        if self.total:
            out["totalWeight"] = self.total
        return out

    def load(self, checkpoint: Any) -> None:
        """Adds a checkpoint's samples; HistogramError (nothing added) when it is malformed."""
        if not isinstance(checkpoint, dict):
            raise HistogramError("histogram checkpoint: want an object")
        total = checkpoint.get("totalWeight", 0.0)
        if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total) or total < 0:
            raise HistogramError(f"histogram checkpoint: totalWeight {total!r:.40}: want a non-negative number")
        raw = checkpoint.get("bucketWeights")
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise HistogramError("histogram checkpoint: bucketWeights: want an object")
        buckets: dict[int, int] = {}
        for key, weight in raw.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 6):
                raise HistogramError(f"histogram checkpoint: bucket {key!r:.20}: want an index")
            if int(key) >= self._n:
                raise HistogramError(f"histogram checkpoint: bucket {key} exceeds the {self._n} buckets")
            if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 2**32 - 1:
                raise HistogramError(f"histogram checkpoint: bucket {key} weight {weight!r:.20}: "
                                     "want an unsigned 32-bit integer")
            buckets[int(key)] = weight
        weight_sum = sum(buckets.values())
        if weight_sum == 0:
            return
        ratio = total / weight_sum
        for bucket, weight in buckets.items():
            self.min_bucket = min(self.min_bucket, bucket)
            self.max_bucket = max(self.max_bucket, bucket)
            self.weights[bucket] += weight * ratio
        self.total += total


class DecayingHistogram(Histogram):
    """A histogram whose samples lose half their weight every ``half_life`` seconds."""

    def __init__(self, options: ExponentialOptions, half_life: float) -> None:
        super().__init__(options)
        if not half_life > 0:
            raise HistogramError(f"half-life {half_life!r}: want a positive duration")
        self.half_life = half_life
        self.reference = GO_ZERO_TIME

    def add_sample(self, value: float, weight: float, when: float) -> None:
        """``when`` in unix seconds."""
        self.add(value, weight * self._decay_factor(when))

    def _decay_factor(self, when: float) -> float:
        if when > self.reference + self.half_life * MAX_DECAY_EXPONENT:
            self._shift_reference(when)
        return 2.0 ** ((when - self.reference) / self.half_life)

    def _shift_reference(self, when: float) -> None:
        # A multiple of the half-life since Go's zero time, halfway values rounded up.
        periods = math.floor((when - GO_ZERO_TIME) / self.half_life + 0.5)
        new_reference = GO_ZERO_TIME + periods * self.half_life
        exponent = math.floor((self.reference - new_reference) / self.half_life + 0.5)
        self.scale(math.ldexp(1.0, exponent))
        self.reference = new_reference

    def save(self) -> dict[str, Any]:
        out = super().save()
        out["referenceTimestamp"] = format_time(self.reference)
        return out

    def load(self, checkpoint: Any) -> None:
        stamp = checkpoint.get("referenceTimestamp") if isinstance(checkpoint, dict) else None
        try:
            reference = (self.reference if stamp is None
                         else parse_time(stamp, "histogram checkpoint: referenceTimestamp"))
        except ValueError as exc:
            raise HistogramError(str(exc)) from None
        super().load(checkpoint)
        self.reference = reference

