"""Limits a busy node needs: in the systemd units in deploy/, and set by the processes themselves."""

from __future__ import annotations

import configparser
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from koord_testing.fakecri import FakeCRI
from koord_testing.proxy import RuntimeProxy

UNITS = sorted((Path(__file__).parents[2] / "deploy").glob("*.service"))


def _service(unit: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(unit.read_text())
    return parser["Service"]


def test_there_are_units() -> None:
    assert {u.name for u in UNITS} >= {"koord-runtime-proxy.service", "koordlet.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_open_file_limit_is_raised(unit: Path) -> None:
    # 1000 kubelet connections used 1018 fds of the default soft limit of 1024.
    value = _service(unit).get("LimitNOFILE", "")
    assert value == "infinity" or (value.isascii() and value.isdigit() and int(value) >= 65536), value


def test_the_proxy_raises_its_own_open_file_limit(tmp_path: Path) -> None:
    """Started outside systemd with the default soft limit of 1024, the proxy raises it itself."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # inherited by the child
    try:
        with FakeCRI(tmp_path / "cri.sock") as backend:
            proxy = RuntimeProxy(tmp_path / "proxy", str(backend.socket)).start()
            try:
                limits = Path(f"/proc/{proxy.pid}/limits").read_text()
            finally:
                proxy.stop()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    assert int(line.split()[3]) == min(hard, 1 << 20) > 1024, line


def test_raise_open_file_limit_stays_within_the_hard_limit() -> None:
    script = ("import resource\n"
              "from koord import rlimits\n"
              "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))\n"
              "print(rlimits.raise_open_file_limit())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["4096"]
