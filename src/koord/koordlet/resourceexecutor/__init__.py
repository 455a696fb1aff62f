"""koordlet's resource executor: the one writer of cgroup files, for runtime hooks and the QoS manager."""
