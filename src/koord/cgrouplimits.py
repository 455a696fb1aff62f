"""What the kernel's cgroup files accept, written once for every writer and validator.

koordlet's executor checks a value against these bounds before it writes a cgroup
file, koordlet's plugins before they answer, and the proxy before it lets a plugin's
answer reach the backend (runc writes the same files).  A value the kernel would refuse
(or silently clamp, or overflow on) is an error naming the field, never a write.
"""

from __future__ import annotations

import enum

UNLIMITED = -1

MIN_SHARES, MAX_SHARES = 2, 262144
"""cpu.shares: the kernel clamps outside [2, 262144] (kubelet and runc clamp too)."""

MIN_CFS_PERIOD_US, MAX_CFS_PERIOD_US = 1000, 1_000_000
"""cpu.cfs_period_us: 1 ms to 1 s."""

MIN_CFS_QUOTA_US = 1000
MAX_CFS_QUOTA_US = (1 << 44) - 1
"""cpu.cfs_quota_us: -1, or 1 ms up to the kernel's max_cfs_runtime (2^44 - 1 µs, ~203 days)."""

MAX_CFS_BURST_US = MAX_CFS_QUOTA_US
"""cpu.cfs_burst_us (v1) / cpu.max.burst (v2): 0 up to max_cfs_runtime; the kernel also
refuses a burst above the cgroup's own limited quota (EINVAL), which only the writer,
knowing the quota, can check."""

MAX_MEMORY_BYTES = (1 << 63) - 1
"""memory.limit_in_bytes / memory.max: -1 (unlimited) or a positive int64."""

MIN_BVT, MAX_BVT = -1, 2
"""cpu.bvt_warp_ns (group identity)."""

MIN_OOM_SCORE_ADJ, MAX_OOM_SCORE_ADJ = -1000, 1000
"""/proc/<pid>/oom_score_adj, which runc writes for the container's first process."""


class Kind(enum.Enum):
    SHARES = "cpu shares"
    QUOTA = "cfs quota"
    BURST = "cfs burst"
    PERIOD = "cfs period"
    MEMORY = "memory limit"
    BVT = "group identity"
    OOM_SCORE_ADJ = "oom score adjustment"


def problem(kind: Kind, value: int) -> str | None:
    """None when the kernel file for ``kind`` accepts ``value``; otherwise why not.

    Zero is not special here: callers for which 0 means "not set" skip it themselves.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{value!r} is not an integer"
    if kind is Kind.SHARES:
        ok = MIN_SHARES <= value <= MAX_SHARES
        want = f"[{MIN_SHARES}, {MAX_SHARES}]"
    elif kind is Kind.PERIOD:
        ok = MIN_CFS_PERIOD_US <= value <= MAX_CFS_PERIOD_US
        want = f"[{MIN_CFS_PERIOD_US}, {MAX_CFS_PERIOD_US}]"
    elif kind is Kind.QUOTA:
        ok = value == UNLIMITED or MIN_CFS_QUOTA_US <= value <= MAX_CFS_QUOTA_US
        want = f"-1 (unlimited) or [{MIN_CFS_QUOTA_US}, {MAX_CFS_QUOTA_US}]"
    elif kind is Kind.BURST:
        ok = 0 <= value <= MAX_CFS_BURST_US
        want = f"[0, {MAX_CFS_BURST_US}]"
    elif kind is Kind.MEMORY:
        ok = value == UNLIMITED or 0 < value <= MAX_MEMORY_BYTES
        want = f"-1 (unlimited) or [1, {MAX_MEMORY_BYTES}]"
    elif kind is Kind.OOM_SCORE_ADJ:
        ok = MIN_OOM_SCORE_ADJ <= value <= MAX_OOM_SCORE_ADJ
        want = f"[{MIN_OOM_SCORE_ADJ}, {MAX_OOM_SCORE_ADJ}]"
    else:
        ok = MIN_BVT <= value <= MAX_BVT
        want = f"[{MIN_BVT}, {MAX_BVT}]"
    return None if ok else f"{value} is out of range: the kernel accepts {want}"
