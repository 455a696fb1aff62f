"""koordlet's QoS Manager: CPU suppress of BE pods and the CPU/memory evictions."""
