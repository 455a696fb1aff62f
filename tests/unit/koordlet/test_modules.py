"""ModuleStarter: modules started in order, one that cannot start retried with back-off
until it runs, a required one's failure raised, the running ones stopped in reverse."""

from __future__ import annotations

import threading
import time

import pytest

from koord.koordlet.modules import ModuleStarter, Started
from koord_testing.wait import wait_for


class Flaky:
    """Fails ``failures`` times (with ``error``), then returns ``name``."""

    def __init__(self, name: str, failures: int, error: str = "not yet") -> None:
        self.name, self.failures, self.error, self.calls = name, failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(self.error)
        return self.name


def module(name: str, failures: int = 0, stopped: list[str] | None = None, reason: str = "",
           required: bool = False) -> Started[str]:
    """A module that fails ``failures`` starts; its stop is recorded in ``stopped``."""
    return Started(name, Flaky(name, failures), (stopped if stopped is not None else []).append,
                   lambda: reason, required)


@pytest.mark.parametrize("failures", [0, 1, 4])
def test_module_runs_after_its_failures(failures, caplog):
    up: list[tuple[str, bool]] = []
    m = module("m", failures)
    starter = ModuleStarter([m], lambda name, ok: up.append((name, ok)), first_retry=0.01, max_retry=0.05)
    starter.start()
    wait_for(lambda: m.running, "the module to run", timeout=10)
    assert m.running == "m" and starter.down() == []
    starter.stop()
    assert m.running is None
    assert up[-1] == ("m", True) and up.count(("m", False)) == failures
    text = caplog.text
    assert text.count("module m cannot start: not yet") == (1 if failures else 0), "logged once per cause"
    assert ("module m running after" in text) == bool(failures)


def test_down_lists_pending_modules_in_start_order_and_stop_ends_retries():
    a, b = module("a", 10**9), module("b", 10**9)
    starter = ModuleStarter([a, module("ok"), b], lambda name, ok: None, first_retry=0.01, max_retry=0.02)
    starter.start()
    assert starter.down() == ["a", "b"]
    attempts = a.run
    assert isinstance(attempts, Flaky)
    wait_for(lambda: attempts.calls > 3, "a few retries", timeout=10)
    starter.stop()
    calls = attempts.calls
    time.sleep(0.1)
    assert attempts.calls == calls, "no retry after stop"


def test_back_off_doubles_up_to_the_cap():
    delays: list[float] = []
    starter = ModuleStarter([module("m", 6)], lambda name, ok: None, first_retry=1.0, max_retry=8.0)

    def no_wait(timeout: float | None = None) -> bool:
        delays.append(float(timeout or 0))
        return False
    starter._wake.wait = no_wait  # type: ignore[method-assign]  # the delays, without sleeping
    starter.start()
    wait_for(lambda: not starter.down(), "the seventh attempt", timeout=10)
    starter.stop()
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_modules_started_by_the_retry_thread_run_once_each():
    modules = [module(name, 2) for name in ("x", "y", "z")]
    starter = ModuleStarter(modules, lambda name, ok: None, first_retry=0.01, max_retry=0.01)
    starter.start()
    wait_for(lambda: all(m.running for m in modules), "all three", timeout=10)
    time.sleep(0.05)
    starter.stop()
    assert [m.run.calls for m in modules] == [3, 3, 3]  # type: ignore[attr-defined]


@pytest.mark.parametrize("failures, stopped", [
    ({}, ["c", "b", "a"]),  # reverse start order
    ({"b": 10**9}, ["c", "a"]),  # a module that never ran is not stopped
])
def test_stop_reverses_the_start_order_of_the_running_modules(failures: dict[str, int], stopped: list[str]):
    seen: list[str] = []
    starter = ModuleStarter([module(n, failures.get(n, 0), seen) for n in "abc"], lambda name, ok: None,
                            first_retry=60, max_retry=60)
    starter.start()
    starter.stop()
    starter.stop()  # a second stop stops nothing again
    assert seen == stopped


def test_a_required_module_that_cannot_start_ends_the_start():
    seen: list[str] = []
    up: list[tuple[str, bool]] = []
    modules = [module("a", stopped=seen), module("hooks", 1, seen, required=True), module("later", stopped=seen)]
    starter = ModuleStarter(modules, lambda name, ok: up.append((name, ok)))
    with pytest.raises(RuntimeError, match="not yet"):
        starter.start()
    assert up == [("a", True)] and starter.down() == [] and modules[2].running is None
    starter.stop()
    assert seen == ["a"]


@pytest.mark.parametrize("failures, reasons, want", [
    ({}, {}, (True, "")),
    ({}, {"b": "b is warming up", "c": "c too"}, (False, "b is warming up")),  # the first in start order
    ({"c": 10**9, "a": 10**9}, {"b": "b is warming up"}, (False, "modules not running: a, c")),
])
def test_ready_names_the_modules_down_first_then_the_first_reason(failures, reasons, want):
    starter = ModuleStarter([module(n, failures.get(n, 0), reason=reasons.get(n, "")) for n in "abc"],
                            lambda name, ok: None, first_retry=60, max_retry=60)
    starter.start()
    try:
        assert starter.ready() == want
    finally:
        starter.stop()


def test_ready_before_start_asks_the_modules():
    starter = ModuleStarter([module("informer", reason="not synced")], lambda name, ok: None)
    assert starter.ready() == (False, "not synced")


def test_a_retry_racing_stop_leaves_nothing_running():
    gate = threading.Event()
    seen: list[str] = []

    def slow() -> str:
        gate.wait(5)
        return "slow"
    calls = Flaky("m", 1)
    m = Started("m", lambda: calls() and slow(), seen.append)
    starter = ModuleStarter([m], lambda name, ok: None, first_retry=0.01, max_retry=0.01)
    starter.start()
    wait_for(lambda: calls.calls == 2, "the retry to begin", timeout=10)
    threading.Timer(0.1, gate.set).start()
    starter.stop()  # waits for the retry in progress, then stops what it started
    assert seen == ["slow"] and m.running is None
