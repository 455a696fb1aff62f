"""The log-once helper's forgetting rules, as a table of (time, call) steps and what each says."""

from __future__ import annotations

import logging

import pytest

from koord.logonce import LogOnce

# A step: (clock, action, key, message); action "say" or "clear"; the step's expected result
# is whether it logged (say) or whether a problem was held (clear).
Step = tuple[float, str, str, str, bool]

CASES: dict[str, tuple[dict[str, float | int | None], list[Step]]] = {
    "the same problem is said once": ({}, [
        (0, "say", "k", "m", True), (1, "say", "k", "m", False), (9999, "say", "k", "m", False)]),
    "a changed message is said": ({}, [
        (0, "say", "k", "m1", True), (1, "say", "k", "m2", True), (2, "say", "k", "m1", True),
        (3, "say", "k", "m1", False)]),
    "keys are apart": ({}, [
        (0, "say", "a", "m", True), (0, "say", "b", "m", True), (1, "say", "a", "m", False)]),
    "cleared then back is said again": ({}, [
        (0, "say", "k", "m", True), (1, "clear", "k", "", True), (2, "clear", "k", "", False),
        (3, "say", "k", "m", True)]),
    "not reported for forget_after is said again": ({"forget_after": 100}, [
        (0, "say", "k", "m", True), (50, "say", "k", "m", False), (140, "say", "k", "m", False),
        (241, "say", "k", "m", True)]),
    "past max_keys the stale are dropped first": ({"forget_after": 100, "max_keys": 2}, [
        (0, "say", "old", "m", True), (150, "say", "live", "m", True), (160, "say", "new", "m", True),
        (170, "say", "live", "m", False), (171, "say", "old", "m", True)]),
    "past max_keys with none stale all are dropped": ({"max_keys": 2}, [
        (0, "say", "a", "m", True), (1, "say", "b", "m", True), (2, "say", "c", "m", True),
        (3, "say", "a", "m", True), (4, "say", "c", "m", False), (5, "say", "b", "m", True),
        (6, "say", "c", "m", True)]),
}


@pytest.mark.parametrize("options, steps", CASES.values(), ids=CASES.keys())
def test_forgetting_rules(options: dict, steps: list[Step]) -> None:
    now = [0.0]
    said = LogOnce(logging.getLogger("t"), clock=lambda: now[0], **options)
    for clock, action, key, message, want in steps:
        now[0] = clock
        got = said.say(key, message) if action == "say" else said.clear(key)
        assert got == want, (clock, action, key, message)


def test_args_are_not_part_of_the_problem_and_are_formatted(caplog: pytest.LogCaptureFixture) -> None:
    said = LogOnce(logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"):
        assert said.say("k", "went backwards (%d -> %d)", 5, 3, level=logging.INFO)
        assert not said.say("k", "went backwards (%d -> %d)", 9, 1)
        assert said.say("k", "100% sure, no args")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "went backwards (5 -> 3)"), (logging.WARNING, "100% sure, no args")]


def test_keep_only_forgets_the_keys_that_left() -> None:
    said = LogOnce(logging.getLogger("t"))
    for key in ("a", "b", "c"):
        said.say(key, "m")
    said.keep_only({"b"})
    assert (said.holds("a"), said.holds("b"), said.holds("c"), len(said)) == (False, True, False, 1)


def test_the_line_names_the_caller_not_the_helper(caplog: pytest.LogCaptureFixture) -> None:
    """klog prints each record's file:line: it must point where the problem was met."""
    with caplog.at_level(logging.WARNING, logger="t"):
        LogOnce(logging.getLogger("t")).say("k", "m")
    assert caplog.records[0].filename == "test_logonce.py"
