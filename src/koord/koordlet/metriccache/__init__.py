"""koordlet's metric cache (upstream's Storage): time series of node, pod and container
usage plus static KV (CPU topology), kept on disk across restarts and bounded by
retention and size. Collectors append from their threads; the NodeMetric reporter and
the QoS manager query from theirs.
"""

from .aggregate import Aggregation, percentile
from .flags import add_flags, from_args
from .kinds import *  # noqa: F403 - the metric kind and label constants are the API
from .kinds import SCHEMA
from .samples import MetricCacheError, Sample, Samples, SeriesKey, series_key
from .storage import MetricCache

__all__ = ["Aggregation", "MetricCache", "MetricCacheError", "SCHEMA", "Sample", "Samples", "SeriesKey", "add_flags",
           "from_args", "percentile", "series_key"]
