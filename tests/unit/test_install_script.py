"""scripts/install.sh on a machine without Debian's package tools: one line, at once."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install.sh"


def test_without_apt_it_fails_with_one_line(tmp_path: Path) -> None:
    """Only the tools a bare non-Debian machine would have are on PATH."""
    for tool in ("bash", "id", "dirname"):
        found = shutil.which(tool)
        assert found, tool
        (tmp_path / tool).symlink_to(found)
    done = subprocess.run(["bash", str(SCRIPT)], env={"PATH": str(tmp_path)}, capture_output=True, text=True,
                          timeout=10)
    assert done.returncode == 1
    assert done.stdout == ""
    expected = ("install.sh: apt-get and dpkg not found: the demo and the tests need a Debian 12 (or later) machine"
                if os.geteuid() == 0 else "install.sh: must run as root (containerd, runc and cgroup files need it)")
    assert done.stderr.splitlines() == [expected]
