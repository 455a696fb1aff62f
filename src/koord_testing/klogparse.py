"""A reader of klog's text lines as a log pipeline reads them, for the tests of ``koord.klog``
and of the binaries' logs: a header starts an entry, tab-indented lines continue it."""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = re.compile(r"(?P<severity>[IWEF])(?P<month>\d\d)(?P<day>\d\d) "
                    r"(?P<time>\d\d:\d\d:\d\d\.\d{6}) +(?P<thread>\d+) (?P<file>\S+):(?P<line>\d+)\] ")
"""klog's header: severity, mmdd, hh:mm:ss.uuuuuu, thread id (padded to 7), file:line."""


@dataclass(frozen=True)
class Entry:
    severity: str
    month: int
    day: int
    time: str
    thread: int
    file: str
    line: int
    message: str


def parse(text: str) -> list[Entry]:
    """The entries of ``text`` (whole lines, each ending in a newline).

    Raises ValueError naming the first line that is neither a header nor a continuation."""
    if text and not text.endswith("\n"):
        raise ValueError(f"the last line is not whole: {text.rsplit(chr(10), 1)[-1]!r:.80}")
    entries: list[Entry] = []
    header: re.Match[str] | None = None
    lines: list[str] = []
    for number, raw in enumerate(text.split("\n")[:-1], 1):
        match = HEADER.match(raw)
        if match:
            if header is not None:
                entries.append(_entry(header, lines))
            header, lines = match, [raw[match.end():]]
        elif raw.startswith("\t") and header is not None:
            lines.append(raw[1:])
        else:
            raise ValueError(f"line {number} is neither a klog header nor a continuation: {raw!r:.120}")
    if header is not None:
        entries.append(_entry(header, lines))
    return entries


def _entry(header: re.Match[str], lines: list[str]) -> Entry:
    return Entry(header["severity"], int(header["month"]), int(header["day"]), header["time"],
                 int(header["thread"]), header["file"], int(header["line"]), "\n".join(lines))


def error_lines(text: str) -> list[str]:
    """The header lines of ERROR and FATAL entries in ``text``, which may start mid-entry (a tail)."""
    return [line for line in text.split("\n") if (match := HEADER.match(line)) and match["severity"] in "EF"]
