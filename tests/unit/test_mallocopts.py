"""The malloc settings koordlet makes at start."""

from __future__ import annotations

import subprocess
import sys


def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    # CI runs on glibc: a refused or missing mallopt would silently leave the threshold moving.
    # In a child process: the setting lasts for the whole process.
    code = "from koord import mallocopts; raise SystemExit(0 if mallocopts.fix_mmap_threshold() else 1)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
