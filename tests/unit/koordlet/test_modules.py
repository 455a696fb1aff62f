"""ModuleStarter: a module that cannot start is retried with back-off until it runs."""

from __future__ import annotations

import threading
import time

import pytest

from koord.koordlet.modules import ModuleStarter
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


@pytest.mark.parametrize("failures", [0, 1, 4])
def test_module_runs_after_its_failures(failures, caplog):
    up: list[tuple[str, bool]] = []
    started: list[object] = []
    starter = ModuleStarter(lambda name, ok: up.append((name, ok)), first_retry=0.01, max_retry=0.05)
    start = Flaky("m", failures)
    starter.run("m", start, started.append)
    wait_for(lambda: started, "the module to run", timeout=10)
    starter.stop()
    assert started == ["m"] and start.calls == failures + 1 and starter.down() == []
    assert up[-1] == ("m", True) and up.count(("m", False)) == failures
    text = caplog.text
    assert text.count("module m cannot start: not yet") == (1 if failures else 0), "logged once per cause"
    assert ("module m running after" in text) == bool(failures)


def test_down_lists_pending_modules_in_start_order_and_stop_ends_retries():
    starter = ModuleStarter(lambda name, ok: None, first_retry=0.01, max_retry=0.02)
    a, b = Flaky("a", 10**9), Flaky("b", 10**9)
    starter.run("a", a)
    starter.run("ok", lambda: "fine")
    starter.run("b", b)
    assert starter.down() == ["a", "b"]
    wait_for(lambda: a.calls > 3, "a few retries", timeout=10)
    starter.stop()
    calls = a.calls
    time.sleep(0.1)
    assert a.calls == calls, "no retry after stop"


def test_back_off_doubles_up_to_the_cap():
    delays: list[float] = []
    attempts = Flaky("m", 6)
    starter = ModuleStarter(lambda name, ok: None, first_retry=1.0, max_retry=8.0)

    def no_wait(timeout: float | None = None) -> bool:
        delays.append(float(timeout or 0))
        return False
    starter._wake.wait = no_wait  # type: ignore[method-assign]  # the delays, without sleeping
    starter.run("m", attempts)
    wait_for(lambda: not starter.down(), "the seventh attempt", timeout=10)
    starter.stop()
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_a_module_started_by_the_retry_thread_is_handed_over_once():
    got: list[object] = []
    lock = threading.Lock()

    def started(value: object) -> None:
        with lock:
            got.append(value)
    starter = ModuleStarter(lambda name, ok: None, first_retry=0.01, max_retry=0.01)
    for name in ("x", "y", "z"):
        starter.run(name, Flaky(name, 2), started)
    wait_for(lambda: len(got) == 3, "all three", timeout=10)
    time.sleep(0.05)
    starter.stop()
    assert sorted(got) == ["x", "y", "z"]  # type: ignore[type-var]
