"""The metric cache's command-line flags (upstream's names and defaults)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..flagtypes import positive_duration
from .storage import DEFAULT_MAX_BYTES, DEFAULT_RETENTION_SECONDS, MIN_MAX_BYTES, MetricCache

# Persistent by default (upstream mounts an emptyDir at /metric-data/): history survives a
# koordlet restart. Each koordlet on a machine needs its own directory.
DEFAULT_TSDB_PATH = "/var/lib/koordlet/metric-data"


def _max_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a number of bytes") from None
    if value < MIN_MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{text}: want at least {MIN_MAX_BYTES} bytes")
    return value


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("metric cache")
    group.add_argument("--tsdb-path", type=Path, default=Path(DEFAULT_TSDB_PATH),
                       help="directory of the metric cache (default %(default)s)")
    group.add_argument("--tsdb-retention-duration", type=positive_duration, default=DEFAULT_RETENTION_SECONDS,
                       metavar="DURATION", help="how long samples are kept (default 12h)")
    group.add_argument("--tsdb-max-bytes", type=_max_bytes, default=DEFAULT_MAX_BYTES,
                       metavar="BYTES", help="size bound of the metric cache (default 100 MiB)")


def from_args(args: argparse.Namespace) -> MetricCache:
    """Opens the metric cache the flags describe (raises MetricCacheError when it cannot)."""
    return MetricCache(args.tsdb_path, retention_seconds=args.tsdb_retention_duration,
                       max_bytes=args.tsdb_max_bytes)
