"""A fake cgroup v1 tree for tests of code that writes cgroup files.

Used where the real cgroup root cannot show the effect, e.g. ``cpu.bvt_warp_ns``, which
only Anolis kernels have.
"""

from __future__ import annotations

from pathlib import Path

V1_FILES = {"cpu": {"cpu.shares": "1024", "cpu.bvt_warp_ns": "0", "cpu.cfs_quota_us": "-1",
                    "cpu.cfs_period_us": "100000"},
            "memory": {"memory.limit_in_bytes": "9223372036854771712"},
            "cpuset": {"cpuset.cpus": "0-1", "cpuset.mems": "0"}}


def make_fake_v1_cgroup(root: Path, rel: str) -> Path:
    """Creates every level of ``rel`` in each subsystem with its files, as the kernel does;
    returns the cpu dir of ``rel``."""
    parts = rel.strip("/").split("/")
    for subsystem, files in V1_FILES.items():
        for depth in range(1, len(parts) + 1):
            d = root / subsystem / "/".join(parts[:depth])
            d.mkdir(parents=True, exist_ok=True)
            for name, value in files.items():
                (d / name).write_text(value + "\n")
    return root / "cpu" / "/".join(parts)
