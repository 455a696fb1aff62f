"""klog's log formats for both binaries, so the log pipelines built for upstream read ours.

Text (the default) is klog's header, ``Lmmdd hh:mm:ss.uuuuuu threadid file:line] msg``:
severity letter I/W/E/F, local time to the microsecond, the OS thread id right-aligned in 7
columns, the source file's base name and line. A multi-line message or a traceback goes on
lines of its own, each indented with a tab as klog indents a multi-line value, so no line of
a message can pass for a header and a parser joins them back exactly.

JSON (``--logging-format=json``, component-base's flag and format, which kube components
share) is one object per line: ``ts`` (milliseconds since the epoch, a float), ``caller``
(``dir/file:line``), ``msg``, then ``v`` (the verbosity) for everything below ERROR, or
``err`` (the traceback) for an error logged with one. As klog through component-base, no
key carries the severity: warnings are ``"v":0`` like INFO.

klog's ``-v`` maps onto Python's levels: INFO and above are V(0), DEBUG is
V(``DEBUG_VERBOSITY``); so ``--v=4`` (upstream's chart) shows DEBUG, the default 0 stays at
INFO, 1 to 3 show what 0 does and 5 and above what 4 does (there is no finer level here).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

DEBUG_VERBOSITY = 4
"""klog ``-v`` from which the DEBUG records show (upstream logs each hook call at V(4) and up)."""
TEXT, JSON = "text", "json"
FORMATS = (TEXT, JSON)
_SURROGATES = re.compile("[\ud800-\udfff]")
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_log = logging.getLogger(__name__)


def verbosity(text: str) -> int:
    """klog's ``-v``: a decimal level (Go's ParseInt base 10) from 0 to int32's maximum."""
    if not _DECIMAL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want a decimal level")
    value = int(text)
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want a level from 0 to {2**31 - 1}")
    return value


def logging_format(text: str) -> str:
    if text not in FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want {' or '.join(FORMATS)}")
    return text


def add_flags(add: Callable[..., Any]) -> None:
    """``--v`` and ``--logging-format``, with ``add`` an argparse parser's or group's add_argument."""
    add("--v", type=verbosity, default=0, metavar="LEVEL",
        help=f"klog verbosity: >= {DEBUG_VERBOSITY} shows DEBUG records (default: 0); "
        "--log-level wins when given")
    add("--logging-format", type=logging_format, default=TEXT, metavar="|".join(FORMATS),
        help="text: klog's header lines; json: component-base's JSON lines (default: text)")


def python_level(log_level: str | None, v: int) -> int:
    """The root logger's level: ``--log-level`` when given, else what ``--v`` shows."""
    if log_level is not None:
        return int(logging.getLevelName(log_level.upper()))
    return logging.DEBUG if v >= DEBUG_VERBOSITY else logging.INFO


def verbosity_of(levelno: int) -> int:
    """The klog V level a record of this Python level stands for."""
    return 0 if levelno >= logging.INFO else DEBUG_VERBOSITY


def severity_letter(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "F"
    if levelno >= logging.ERROR:
        return "E"
    if levelno >= logging.WARNING:
        return "W"
    return "I"


class TextFormatter(logging.Formatter):
    """klog's text lines; without ``headers`` (``-skip_headers``) the message alone."""

    def __init__(self, headers: bool = True, thread_id: Callable[[], int] = threading.get_native_id) -> None:
        super().__init__()
        self.headers = headers
        # Handlers format in the thread that logged, so the current thread's id is the record's.
        self.thread_id = thread_id

    def header(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        micros = int(round((record.created - seconds) * 1_000_000))
        if micros == 1_000_000:
            seconds, micros = seconds + 1, 0
        t = time.localtime(seconds)
        return (f"{severity_letter(record.levelno)}{t.tm_mon:02d}{t.tm_mday:02d} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d} "
                f"{self.thread_id():7d} {record.filename}:{record.lineno}] ")

    def format(self, record: logging.LogRecord) -> str:
        body = "\n\t".join(_full_message(self, record).split("\n"))
        return self.header(record) + body if self.headers else body


class JSONFormatter(logging.Formatter):
    """component-base's JSON lines (zap's encoder as ``--logging-format=json`` sets it up)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": record.created * 1000,
            "caller": f"{_short_path(record.pathname)}:{record.lineno}",
            "msg": _SURROGATES.sub("\ufffd", record.getMessage()),
        }
        if record.levelno < logging.ERROR:
            entry["v"] = verbosity_of(record.levelno)
        traceback = _traceback(self, record)
        if traceback:
            entry["err"] = _SURROGATES.sub("\ufffd", traceback)
        return json.dumps(entry, ensure_ascii=False, separators=(",", ":"))


def formatter(fmt: str, headers: bool = True) -> logging.Formatter:
    """The formatter ``--logging-format`` names (``headers`` only shapes the text format)."""
    return JSONFormatter() if fmt == JSON else TextFormatter(headers)


def configure(level: int, handlers: list[logging.Handler], fmt: str, headers: bool = True) -> None:
    """The root logger at ``level`` writing to ``handlers`` in format ``fmt``.

    Python's warnings and the tracebacks of uncaught exceptions go through logging too:
    printed raw, they would be the lines in the log that a klog parser cannot read."""
    shared = formatter(fmt, headers)
    for handler in handlers:
        handler.setFormatter(shared)
    logging.basicConfig(level=level, handlers=handlers, force=True)
    logging.captureWarnings(True)
    sys.excepthook = log_uncaught
    threading.excepthook = log_uncaught_in_thread


def log_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook``: the exception that ends the process, as klog's fatal line."""
    _log.critical("uncaught exception", exc_info=(kind, value, tb))


def log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: an exception that ends a thread (the process goes on)."""
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "unknown"
    _log.error("uncaught exception in thread %s", name, exc_info=args.exc_value)


def _short_path(pathname: str) -> str:
    """zap's short caller: the file and the directory holding it."""
    path = Path(pathname)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _traceback(fmt: logging.Formatter, record: logging.LogRecord) -> str:
    parts = []
    if record.exc_info:
        if not record.exc_text:
            record.exc_text = fmt.formatException(record.exc_info)
    if record.exc_text:
        parts.append(record.exc_text)
    if record.stack_info:
        parts.append(fmt.formatStack(record.stack_info))
    return "\n".join(parts)


def _full_message(fmt: logging.Formatter, record: logging.LogRecord) -> str:
    message = record.getMessage()
    traceback = _traceback(fmt, record)
    return f"{message}\n{traceback}" if traceback else message
