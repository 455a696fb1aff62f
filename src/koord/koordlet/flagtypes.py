"""argparse types shared by koordlet's flags (every module registers its own flags).

Each turns a bad value into an ``ArgumentTypeError`` naming it, so argparse exits 2 with
the flag's name and the reason.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from koord.hookapi import parse_duration


def go_duration(text: str) -> float:
    """Seconds from a Go duration ("10s", "500ms", "1m30s", "0"), for argparse."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; 0 disables") from None


def positive_duration(text: str) -> float:
    """A Go duration ("12h", "1s") that must be > 0."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a positive duration such as 12h")
    return seconds


def choice(*allowed: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        """argparse's ``choices`` would print the choices twice with a metavar; this names them once."""
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r}: want one of {', '.join(allowed)}")
        return text
    return check


def flag_bool(text: str) -> bool:
    """Go's flag.Bool spellings."""
    value = text.strip().lower()
    if value in ("1", "t", "true"):
        return True
    if value in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: want true or false")


def port_number(text: str) -> int:
    """A TCP port, ASCII digits only (``str.isdigit`` also takes other scripts' digits)."""
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: want a port in 1-65535")
    return int(text)
