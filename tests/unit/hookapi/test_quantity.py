"""Kubernetes quantities: exact values, bounded before arithmetic, errors naming the input."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import parse_quantity
from koord.hookapi.quantity import MAX_VALUE


@pytest.mark.parametrize("text, value", [
    ("2Gi", 2 * 2**30), ("500m", Fraction(1, 2)), ("1e3", 1000), ("1E3", 1000), ("-5", -5), ("+7", 7),
    (" 1Ki ", 1024), ("0.5", Fraction(1, 2)), (".5", Fraction(1, 2)), ("1e-3", Fraction(1, 1000)),
    ("7Ei", 7 * 2**60), ("100n", Fraction(1, 10**7)), (0, 0),
])
def test_good(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text, problem", [
    ("1e999999999", "exponent 999999999 is beyond"),
    ("1e31", "exponent 31 is beyond"),
    ("9" * 100, "longer than 64 characters"),
    ("16Ei", f"larger than {MAX_VALUE}"),
    (2**64, f"larger than {MAX_VALUE}"),
    ("\u0661", "bad quantity"),          # ARABIC-INDIC DIGIT ONE
    ("1Gb", "bad quantity"),
    ("e3", "bad quantity"),
    (None, "neither a string nor an integer"),
    (1.5, "neither a string nor an integer"),
    (False, "neither a string nor an integer"),
])
def test_bad_names_the_input(text: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        parse_quantity(text)


@given(st.integers(-MAX_VALUE, MAX_VALUE), st.sampled_from(["", "k", "Ki", "m", "n", "M", "Gi"]))
def test_integers_with_suffixes(number: int, suffix: str) -> None:
    try:
        value = parse_quantity(f"{number}{suffix}")
    except ValueError as exc:
        assert "larger than" in str(exc)
        return
    assert abs(value) <= MAX_VALUE


@given(st.text(max_size=80))
def test_any_text_is_bounded_or_a_value_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except ValueError:
        return
    assert abs(value) <= MAX_VALUE
