"""Go durations, the project's own bare seconds, and bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import parse_duration


@pytest.mark.parametrize("text, seconds, bare", [
    ("10s", 10.0, False), ("500ms", 0.5, False), ("1m30s", 90.0, False), ("1.5h", 5400.0, False),
    ("0", 0.0, False), ("250us", 0.00025, False), ("250µs", 0.00025, False), ("3ns", 3e-9, False),
    (" 2s ", 2.0, False), ("5", 5.0, True), ("2.5", 2.5, True), ("1m", 60.0, True),
])
def test_good(text: str, seconds: float, bare: bool) -> None:
    assert parse_duration(text, bare_seconds=bare) == pytest.approx(seconds)


@pytest.mark.parametrize("text, bare, problem", [
    ("10", False, "not a duration: '10'"),
    ("5x", False, "not a duration"),
    ("", False, "not a duration"),
    ("s", False, "not a duration"),
    ("1s2", False, "not a duration"),
    ("-1s", False, "not a duration"),
    ("\u0661s", False, "not a duration"),
    ("9" * 400 + "h", False, "longer than 64 characters"),
    ("9" * 60 + "h", False, "longer than 290 years"),
    ("1e9", True, "not a duration"),
])
def test_bad(text: str, bare: bool, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_duration(text, bare_seconds=bare)


@given(st.text(max_size=70), st.booleans())
def test_any_text_is_a_finite_non_negative_duration_or_a_value_error(text: str, bare: bool) -> None:
    try:
        seconds = parse_duration(text, bare_seconds=bare)
    except ValueError:
        return
    assert 0 <= seconds < float("inf")


@given(st.integers(0, 10**6), st.sampled_from(["ms", "s", "m", "h"]))
def test_integers_with_units(number: int, unit: str) -> None:
    factor = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    assert parse_duration(f"{number}{unit}") == pytest.approx(number * factor)
