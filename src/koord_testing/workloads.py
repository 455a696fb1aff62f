"""Commands for test containers that use a known amount of CPU or memory.

Both are subcommands of the test image's one static binary (``pause.c``), so a pod that
burns one CPU or holds 200 MiB needs no other image: tests compare what koordlet measures
from real cgroup files with what these programs are known to use.
"""

from __future__ import annotations

PAUSE = "/pause"


def burn_command(cores: float) -> list[str]:
    """Keeps ``cores`` CPUs busy (0.5 = half of one, as 50 ms of every 100 ms) until SIGTERM."""
    if not 0 < cores <= 1024:
        raise ValueError(f"cores {cores!r}: want (0, 1024]")
    return [PAUSE, "burn", f"{cores:g}"]


def hold_command(mib: int) -> list[str]:
    """Allocates and touches ``mib`` MiB of anonymous memory, keeps it until SIGTERM."""
    if not 0 < mib <= 1048576:
        raise ValueError(f"mib {mib!r}: want [1, 1048576]")
    return [PAUSE, "hold", str(mib)]
