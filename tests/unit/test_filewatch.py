"""The one directory watcher: events, the periodic check, directories that appear late or are replaced."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from koord.filewatch import DirWatcher

DEADLINE = 3.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Recorder:
    def __init__(self) -> None:
        self.events = 0
        self.polls = 0
        self.lock = threading.Lock()

    def event(self) -> None:
        with self.lock:
            self.events += 1

    def poll(self) -> None:
        with self.lock:
            self.polls += 1


def run_until_checked(directory: Path, checks: int) -> Recorder:
    """A watcher of ``directory`` with a 50 ms periodic check, stopped after ``checks`` of them."""
    rec = Recorder()
    watcher = DirWatcher([directory], rec.event, name="test-watch", on_poll=rec.poll, poll_interval=0.05)
    watcher.start()
    try:
        wait_for(lambda: rec.polls >= checks, f"{checks} periodic checks")
    finally:
        watcher.stop()
    return rec


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Callable[..., tuple[DirWatcher, Recorder]]]:
    started: list[DirWatcher] = []

    def make(*dirs: Path, **kw) -> tuple[DirWatcher, Recorder]:
        rec = Recorder()
        watcher = DirWatcher(dirs, rec.event, name="test-watch", on_poll=rec.poll, **kw)
        watcher.start()
        started.append(watcher)
        return watcher, rec

    yield make
    for w in started:
        w.stop()


def test_a_file_renamed_into_place_is_one_event(tmp_path: Path, watch) -> None:
    """How careful writers (and plugins) replace a file: the temp file's events are filtered out and
    the rename's two inotify events (one syscall) become one call."""
    _, rec = watch(tmp_path, accept=lambda name: name.endswith(".json"), poll_interval=60)
    tmp = tmp_path / ".a.json.tmp"
    tmp.write_text("{}")
    tmp.rename(tmp_path / "a.json")
    wait_for(lambda: rec.events >= 1, "an event")
    time.sleep(0.3)
    assert rec.events == 1


def test_names_the_filter_rejects_are_not_events(tmp_path: Path, watch) -> None:
    _, rec = watch(tmp_path, accept=lambda name: name.endswith(".json"), poll_interval=60)
    (tmp_path / "notes.txt").write_text("x")
    time.sleep(0.4)
    assert rec.events == 0
    (tmp_path / "b.json").write_text("x")
    wait_for(lambda: rec.events >= 1, "the .json event")


def test_the_periodic_check_runs_without_events(tmp_path: Path, watch) -> None:
    _, rec = watch(tmp_path, poll_interval=0.1)
    wait_for(lambda: rec.polls >= 3, "three periodic checks")


def test_the_periodic_check_runs_while_events_keep_coming(tmp_path: Path, watch) -> None:
    _, rec = watch(tmp_path, poll_interval=0.2)
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        (tmp_path / "busy").write_text(str(time.monotonic()))
        time.sleep(0.03)
    assert rec.events >= 1 and rec.polls >= 4


def test_an_idle_watch_is_set_up_once_not_once_per_check(tmp_path: Path, monkeypatch) -> None:
    """The periodic check must not end the watch: setting inotify up again each time would
    cost a descriptor and a watch per check and open a window for missed events."""
    import koord.filewatch as filewatch
    made: list[object] = []
    real = filewatch.Inotify

    def counting() -> object:
        made.append(real())
        return made[-1]
    monkeypatch.setattr(filewatch, "Inotify", counting)
    run_until_checked(tmp_path, 6)
    assert len(made) == 1


def test_a_directory_created_later_is_watched(tmp_path: Path, watch) -> None:
    late = tmp_path / "late"
    _, rec = watch(late, poll_interval=0.1)
    late.mkdir()
    wait_for(lambda: rec.events >= 1, "the directory's appearance")
    before = rec.events
    (late / "x").write_text("1")
    wait_for(lambda: rec.events > before, "an event in the new directory")


def test_a_replaced_directory_is_watched_again(tmp_path: Path, watch) -> None:
    d = tmp_path / "d"
    d.mkdir()
    _, rec = watch(d, poll_interval=0.1)
    shutil.rmtree(d)
    d.mkdir()
    wait_for(lambda: rec.events >= 1, "the replacement")
    time.sleep(0.3)
    before = rec.events
    (d / "x").write_text("1")
    wait_for(lambda: rec.events > before, "an event in the replaced directory")


def test_a_failing_callback_does_not_end_the_watch(tmp_path: Path) -> None:
    calls: list[int] = []

    def boom() -> None:
        calls.append(1)
        raise RuntimeError("consumer bug")

    watcher = DirWatcher([tmp_path], boom, name="test-watch", on_poll=lambda: None, poll_interval=60)
    watcher.start()
    try:
        (tmp_path / "a").write_text("1")
        wait_for(lambda: len(calls) >= 1, "the first call")
        time.sleep(0.2)
        before = len(calls)
        (tmp_path / "b").write_text("1")
        wait_for(lambda: len(calls) > before, "a call after the failing one")
    finally:
        watcher.stop()


def test_stop_ends_the_watch_without_waiting_for_the_periodic_check(tmp_path: Path) -> None:
    """The check runs every hour here: only the stop event can end the watch (pytest's timeout guards a hang)."""
    watcher = DirWatcher([tmp_path], lambda: None, name="test-watch", poll_interval=3600)
    watcher.start()
    thread = watcher._thread
    watcher.stop()
    assert thread is not None and not thread.is_alive()


def test_without_inotify_the_periodic_check_is_all_there_is(tmp_path: Path, monkeypatch, caplog) -> None:
    def no_inotify(*args, **kwargs):
        raise OSError("OS file watch limit reached")

    monkeypatch.setattr("koord.filewatch.Inotify", no_inotify)
    run_until_checked(tmp_path, 5)
    warnings = [r for r in caplog.records if r.name == "koord.filewatch" and "watch limit" in r.getMessage()]
    assert len(warnings) == 1, "the problem is logged once, not on every retry"


def test_changes_are_not_logged_at_info(tmp_path: Path, watch, caplog: pytest.LogCaptureFixture) -> None:
    """A log file kept beside a watched file changes all the time: no line per change."""
    _, rec = watch(tmp_path, accept=lambda name: name.endswith(".json"), poll_interval=60)
    with caplog.at_level(logging.INFO):
        for i in range(3):
            (tmp_path / "koordlet.log").write_text(f"line {i}\n")
            (tmp_path / "a.json").write_text("{}")
            wait_for(lambda i=i: rec.events >= i + 1, f"event {i + 1}")
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO], caplog.text


def test_events_that_cannot_be_read_leave_the_periodic_check_and_a_warning(tmp_path: Path, monkeypatch,
                                                                         caplog) -> None:
    """Reading the inotify queue fails: said once, the watcher keeps checking and watching
    afresh instead of its thread ending."""
    def unreadable(self):
        raise OSError("inotify read failed")

    monkeypatch.setattr("koord.filewatch.Inotify.read", unreadable)
    rec = Recorder()
    watcher = DirWatcher([tmp_path], rec.event, name="test-watch", on_poll=rec.poll, poll_interval=0.05)
    watcher.start()
    try:
        (tmp_path / "f").write_text("1")  # an event to read
        wait_for(lambda: rec.polls >= 5, "5 periodic checks")
        assert watcher._thread is not None and watcher._thread.is_alive()
    finally:
        watcher.stop()
    warnings = [r for r in caplog.records if r.name == "koord.filewatch" and "inotify read failed" in r.getMessage()]
    assert len(warnings) == 1, "the problem is logged once, not on every retry"
