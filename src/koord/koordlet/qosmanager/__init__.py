"""koordlet's QoS Manager: CPU suppress of BE pods and the CPU/memory evictions.

``QOSManager(config, states_informer, metric_cache, executor).start()/stop()``; its flags
through ``add_flags(parser)``.
"""

from .framework import QOSConfig, add_flags
from .manager import QOSManager

__all__ = ["QOSConfig", "QOSManager", "add_flags"]
