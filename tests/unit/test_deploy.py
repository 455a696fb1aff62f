"""The systemd units in deploy/: limits a busy node needs."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

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
