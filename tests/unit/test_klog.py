"""klog's formats (koord.klog): the text header on fixed records, multi-line messages and
tracebacks, component-base's JSON lines, ``-v`` onto Python's levels, and any message
read back whole by a klog parser."""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import threading
import time
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord import klog
from koord_testing.klogparse import Entry, error_lines, parse

# 2026-11-28 01:02:03.456789 UTC
CREATED = 1795827723.456789


@pytest.fixture
def utc(monkeypatch):
    """klog prints local time: the table's times are UTC's."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


PROXY_CLI = "/src/koord/runtimeproxy/cli.py"


def record(msg: str, level: int = logging.INFO, created: float = CREATED, pathname: str = PROXY_CLI,
           lineno: int = 42, args: tuple = (), exc_info=None) -> logging.LogRecord:
    r = logging.LogRecord("koord-runtime-proxy", level, pathname, lineno, msg, args, exc_info)
    r.created = created
    return r


@pytest.mark.parametrize("level, created, thread, pathname, lineno, want", [
    (logging.INFO, CREATED, 1234, "/a/cli.py", 42, "I1128 01:02:03.456789    1234 cli.py:42] hello"),
    (logging.DEBUG, CREATED, 1, "/a/b.py", 7, "I1128 01:02:03.456789       1 b.py:7] hello"),
    (logging.WARNING, CREATED, 4194304, "x.py", 1, "W1128 01:02:03.456789 4194304 x.py:1] hello"),
    (logging.ERROR, CREATED, 12345678, "/y.py", 1000, "E1128 01:02:03.456789 12345678 y.py:1000] hello"),
    (logging.CRITICAL, CREATED, 99, "/z.py", 3, "F1128 01:02:03.456789      99 z.py:3] hello"),
    # the first of a month, a whole second, and a fraction rounding up to the next second
    (logging.INFO, 1796083200.0, 5, "/a.py", 1, "I1201 00:00:00.000000       5 a.py:1] hello"),
    (logging.INFO, 1796083199.9999996, 5, "/a.py", 1, "I1201 00:00:00.000000       5 a.py:1] hello"),
    (logging.INFO, 1780000000.000001, 5, "/a.py", 1, "I0528 20:26:40.000001       5 a.py:1] hello"),
])
def test_text_header_on_fixed_records(utc, level, created, thread, pathname, lineno, want):
    formatter = klog.TextFormatter(thread_id=lambda: thread)
    assert formatter.format(record("hello", level, created, pathname, lineno)) == want


def boom() -> tuple:
    try:
        raise ValueError("bad value")
    except ValueError:
        return sys.exc_info()


@pytest.mark.parametrize("msg, args, exc, headers, want_lines", [
    ("pod %s/%s container %s", ("ns", "web", "app"), False, True,
     ["I1128 01:02:03.456789    1234 cli.py:42] pod ns/web container app"]),
    ("first\nsecond\n\tthird", (), False, True,
     ["I1128 01:02:03.456789    1234 cli.py:42] first", "\tsecond", "\t\tthird"]),
    ("two\nlines", (), False, False, ["two", "\tlines"]),
    ("plugin %s failed", ("rec",), True, True,
     ["I1128 01:02:03.456789    1234 cli.py:42] plugin rec failed", "\tTraceback (most recent call last):"]),
])
def test_text_messages_and_tracebacks(utc, msg, args, exc, headers, want_lines):
    formatter = klog.TextFormatter(headers, thread_id=lambda: 1234)
    out = formatter.format(record(msg, args=args, exc_info=boom() if exc else None)).split("\n")
    assert out[:len(want_lines)] == want_lines
    if exc:
        assert out[-1] == "\tValueError: bad value" and all(line.startswith("\t") for line in out[1:])
    else:
        assert len(out) == len(want_lines)


@pytest.mark.parametrize("level, pathname, want", [
    (logging.INFO, PROXY_CLI,
     {"ts": CREATED * 1000, "caller": "runtimeproxy/cli.py:42", "msg": "m", "v": 0}),
    (logging.WARNING, PROXY_CLI,
     {"ts": CREATED * 1000, "caller": "runtimeproxy/cli.py:42", "msg": "m", "v": 0}),
    (logging.DEBUG, PROXY_CLI,
     {"ts": CREATED * 1000, "caller": "runtimeproxy/cli.py:42", "msg": "m", "v": 4}),
    (logging.ERROR, PROXY_CLI, {"ts": CREATED * 1000, "caller": "runtimeproxy/cli.py:42", "msg": "m"}),
    (logging.CRITICAL, "cli.py", {"ts": CREATED * 1000, "caller": "cli.py:42", "msg": "m"}),
])
def test_json_lines_as_component_base(level, pathname, want):
    line = klog.JSONFormatter().format(record("m", level, pathname=pathname))
    assert json.loads(line) == want and list(json.loads(line)) == list(want)
    assert line.startswith('{"ts":1795827723456.789') and "\n" not in line


def test_json_error_carries_the_traceback_under_err():
    entry = json.loads(klog.JSONFormatter().format(record("m", logging.ERROR, exc_info=boom())))
    assert list(entry) == ["ts", "caller", "msg", "err"]
    assert entry["err"].startswith("Traceback") and entry["err"].endswith("ValueError: bad value")


def test_json_replaces_lone_surrogates():
    line = klog.JSONFormatter().format(record("file \udcff name"))
    assert json.loads(line.encode("utf-8"))["msg"] == "file \ufffd name"


@pytest.mark.parametrize("log_level, v, want", [
    (None, 0, logging.INFO), (None, 3, logging.INFO), (None, 4, logging.DEBUG), (None, 10, logging.DEBUG),
    ("warning", 4, logging.WARNING), ("debug", 0, logging.DEBUG), ("error", 0, logging.ERROR),
])
def test_python_level_from_log_level_and_v(log_level, v, want):
    assert klog.python_level(log_level, v) == want


@pytest.mark.parametrize("levelno, v", [
    (logging.DEBUG, 4), (5, 4), (logging.INFO, 0), (logging.WARNING, 0), (logging.ERROR, 0)])
def test_verbosity_of_a_record(levelno, v):
    assert klog.verbosity_of(levelno) == v


@pytest.mark.parametrize("text, want", [
    ("0", 0), ("4", 4), ("+4", 4), ("010", 10), (str(2**31 - 1), 2**31 - 1),
    ("-1", "want a level from 0"), (str(2**31), "want a level from 0"), ("four", "want a decimal level"),
    ("0x10", "want a decimal level"), ("1_0", "want a decimal level"), (" 4", "want a decimal level"),
    ("", "want a decimal level"),
])
def test_verbosity_flag(text, want):
    if isinstance(want, int):
        assert klog.verbosity(text) == want
        return
    with pytest.raises(argparse.ArgumentTypeError, match=want):
        klog.verbosity(text)


@pytest.mark.parametrize("text, ok", [("text", True), ("json", True), ("JSON", False), ("klog", False), ("", False)])
def test_logging_format_flag(text, ok):
    if ok:
        assert klog.logging_format(text) == text
        return
    with pytest.raises(argparse.ArgumentTypeError, match="want text or json"):
        klog.logging_format(text)


@pytest.mark.parametrize("text, problem", [
    ("I1128 01:02:03.456789    1 a.py:1] x", "the last line is not whole"),
    ("garbage\n", "line 1 is neither"),
    ("\tcontinuation first\n", "line 1 is neither"),
    ("I1128 01:02:03.456789    1 a.py:1] x\nX1128 01:02:03.456789 1 a.py:1] y\n", "line 2 is neither"),
    ("I1128 01:02:03.45678    1 a.py:1] short fraction\n", "line 1 is neither"),
])
def test_parser_names_the_line_it_cannot_read(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse(text)


@pytest.mark.parametrize("text, want", [
    ("\tmid-entry tail\nI1128 01:02:03.456789    1 a.py:1] ok\n", []),
    ("W1128 01:02:03.456789    1 a.py:1] ERROR in a warning\n", []),
    ("E1128 01:02:03.456789    1 a.py:1] bad\n\tTraceback\nF1128 01:02:03.456789    1 a.py:2] worse",
     ["E1128 01:02:03.456789    1 a.py:1] bad", "F1128 01:02:03.456789    1 a.py:2] worse"]),
])
def test_error_lines_of_a_tail(text, want):
    assert error_lines(text) == want


levels = st.sampled_from([logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL])


@given(message=st.text(), level=levels, thread=st.integers(1, 2**22),
       micros=st.integers(0, 2 * 10**15), lineno=st.integers(1, 10**6))
def test_any_message_round_trips_through_a_klog_parser(message, level, thread, micros, lineno):
    r = record("%s", level, micros / 1e6, lineno=lineno, args=(message,))
    text = klog.TextFormatter(thread_id=lambda: thread).format(r) + "\n"
    local = time.localtime(micros // 10**6)
    when = f"{time.strftime('%H:%M:%S', local)}.{micros % 10**6:06d}"
    assert parse(text) == [Entry(klog.severity_letter(level), local.tm_mon, local.tm_mday, when, thread, "cli.py",
                                 lineno, message)]


@given(message=st.text(), level=levels)
def test_any_message_round_trips_through_json(message, level):
    line = klog.JSONFormatter().format(record("%s", level, args=(message,)))
    assert "\n" not in line and json.loads(line)["msg"] == message


@given(messages=st.lists(st.text(), min_size=1, max_size=5))
def test_consecutive_entries_stay_apart(messages):
    formatter = klog.TextFormatter(thread_id=lambda: 1)
    text = "".join(formatter.format(record("%s", args=(m,))) + "\n" for m in messages)
    assert [e.message for e in parse(text)] == messages


@pytest.fixture
def configured(monkeypatch):
    """klog.configure on a string stream, with logging and the exception hooks put back after."""
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    klog.configure(logging.INFO, [logging.StreamHandler(stream)], klog.TEXT)
    yield stream
    logging.captureWarnings(False)
    root.handlers, root.level = saved


def test_warnings_and_uncaught_exceptions_become_klog_entries(configured):
    warnings.warn("old flag", DeprecationWarning, stacklevel=1)
    thread = threading.Thread(target=lambda: 1 / 0, name="collector")
    thread.start()
    thread.join()
    try:
        raise RuntimeError("the end")
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    entries = parse(configured.getvalue())
    assert [(e.severity, e.message.split("\n")[0].rsplit(": ", 2)[-2:]) for e in entries] == [
        ("W", ["DeprecationWarning", "old flag"]),
        ("E", ["uncaught exception in thread collector"]),
        ("F", ["uncaught exception"]),
    ]
    assert entries[0].message.startswith(__file__)
    assert entries[1].message.endswith("ZeroDivisionError: division by zero")
    assert entries[2].message.endswith("RuntimeError: the end")

