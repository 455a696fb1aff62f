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


def memory_stat_text(version: int, anon: int, file: int = 0, unevictable: int = 0) -> str:
    """A memory.stat whose usage without page cache is ``anon + unevictable`` (all of ``anon``
    inactive, as a freshly touched heap) and with page cache adds ``file``."""
    prefix = "total_" if version == 1 else ""
    values = {"inactive_anon": anon, "active_anon": 0, "unevictable": unevictable,
              "inactive_file": file, "active_file": 0}
    if version == 1:
        # v1 also has the cgroup's own (non-hierarchical) counters; they must be ignored.
        lines = [f"{k} 7" for k in values] + ["cache 0", "rss 0"]
    else:
        lines = ["anon 0", "file 0"]
    return "\n".join(lines + [f"{prefix}{k} {v}" for k, v in values.items()]) + "\n"


def write_usage(root: Path, rel: str, version: int, *, cpu_ns: int, memory_stat: str,
                nr_periods: int = 0, nr_throttled: int = 0) -> None:
    """Writes the files the metrics advisor reads for one cgroup (pod, container or QoS dir)."""
    rel = rel.strip("/")
    if version == 1:
        files = {root / "cpuacct" / rel / "cpuacct.usage": f"{cpu_ns}\n",
                 root / "memory" / rel / "memory.stat": memory_stat,
                 root / "cpu" / rel / "cpu.stat":
                     f"nr_periods {nr_periods}\nnr_throttled {nr_throttled}\nthrottled_time 0\n"}
    else:
        files = {root / rel / "cpu.stat":
                     f"usage_usec {cpu_ns // 1000}\nuser_usec 0\nsystem_usec 0\nnr_periods {nr_periods}\n"
                     f"nr_throttled {nr_throttled}\nthrottled_usec 0\n",
                 root / rel / "memory.stat": memory_stat}
        (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
