"""koordlet's metrics advisor: collectors of node, pod, container, system and BE usage,
CPU topology, throttling and PSI, each on its own interval, writing the metric cache."""

from .advisor import MetricsAdvisor
from .config import AdvisorConfig, add_flags, from_args

__all__ = ["AdvisorConfig", "MetricsAdvisor", "add_flags", "from_args"]
