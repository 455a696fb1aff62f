"""koordlet's metrics advisor: collectors of node, pod, container, system and BE usage,
CPU topology, throttling and PSI, each on its own interval, writing the metric cache."""

from .advisor import MetricsAdvisor
from .config import FEATURE_GATES, AdvisorConfig, add_flags, from_args

__all__ = ["FEATURE_GATES", "AdvisorConfig", "MetricsAdvisor", "add_flags", "from_args"]
