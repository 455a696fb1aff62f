"""The one cpu-list parser: kernel syntax, ASCII only, bounded ids and length, errors naming the input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import MAX_CPU_ID, format_cpuset, parse_cpuset
from koord.hookapi.cpuset import MAX_TEXT


@pytest.mark.parametrize("text, cpus", [
    ("0-3,5", [0, 1, 2, 3, 5]),
    ("5,0,1,2", [0, 1, 2, 5]),
    ("", []),
    ("\n", []),
    ("7", [7]),
    ("0-3\n", [0, 1, 2, 3]),          # as read from a cgroup file
    ("0-3, 5", [0, 1, 2, 3, 5]),      # spaces around commas, as hand-written answers have
    ("4095", [4095]),
    ("3-3", [3]),
    ("1,1,1", [1]),
])
def test_good(text: str, cpus: list[int]) -> None:
    assert parse_cpuset(text) == cpus


@pytest.mark.parametrize("text, problem", [
    ("0-", "'' is not a cpu id"),
    ("-1", "'' is not a cpu id"),
    ("1,,2", "'' is not a cpu id"),
    ("a", "'a' is not a cpu id"),
    ("0 1", "'0 1' is not a cpu id"),
    ("4-2", "range 4-2 runs backwards"),
    ("0-4000000000", "cpu id 4000000000 is above the limit 4095"),
    ("4096", "above the limit 4095"),
    ("9" * 5000, "above the limit 4095"),
    ("\u0663", "is not a cpu id"),           # ARABIC-INDIC DIGIT THREE: \d would take it
    ("\uff11-\uff13", "is not a cpu id"),    # FULLWIDTH digits
    ("1.5", "is not a cpu id"),
    ("+1", "is not a cpu id"),
    ("0x1", "is not a cpu id"),
    ("1-2-3", "is not a cpu id"),
    (",".join(["0"] * (MAX_TEXT // 2 + 1)), f"longer than {MAX_TEXT} characters"),
])
def test_bad_names_the_input(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cpuset(text)
    assert problem in str(info.value)
    assert "bad cpuset" in str(info.value) and repr(text[:20])[:-1] in str(info.value)


def test_caller_gives_the_node_cpu_bound() -> None:
    assert parse_cpuset("0-7", max_cpu=7) == list(range(8))
    with pytest.raises(ValueError, match="cpu id 8 is above the limit 7"):
        parse_cpuset("0-8", max_cpu=7)


@pytest.mark.parametrize("cpus, compact", [
    ([0, 1, 2, 3, 5], "0-3,5"), ([], ""), ([7], "7"), ({5, 0, 1, 2}, "0-2,5"), ([1, 3, 5], "1,3,5"),
])
def test_format(cpus: list[int], compact: str) -> None:
    assert format_cpuset(cpus) == compact


@given(st.sets(st.integers(0, MAX_CPU_ID), max_size=300))
def test_format_then_parse_round_trips(cpus: set[int]) -> None:
    assert parse_cpuset(format_cpuset(cpus)) == sorted(cpus)


@given(st.text(max_size=200))
def test_any_text_is_a_bounded_list_or_a_value_error(text: str) -> None:
    try:
        cpus = parse_cpuset(text)
    except ValueError as exc:
        assert "bad cpuset" in str(exc)
        return
    assert len(cpus) <= MAX_CPU_ID + 1
    assert all(0 <= c <= MAX_CPU_ID for c in cpus)
    assert cpus == sorted(set(cpus))


@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_huge_ranges_fail_fast(lo: int, hi: int) -> None:
    text = f"{lo}-{hi}"
    try:
        cpus = parse_cpuset(text)
    except ValueError:
        assert hi < lo or hi > MAX_CPU_ID
        return
    assert cpus == list(range(lo, hi + 1))
