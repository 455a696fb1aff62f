"""Parsers for the /proc, /sys and cgroup files the collectors read.

Every parser takes the text of one file and returns numbers, or raises ValueError saying
what is wrong; nothing else escapes, whatever the text. Readers bound the size first, so
a parser never sees more than ``read_bounded``'s limit.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from koord.hookapi import parse_cpuset

T = TypeVar("T")

# Cgroup and sysfs files are tiny; /proc/stat and /proc/cpuinfo grow with the CPU count.
SMALL_FILE_BYTES = 64 * 1024
PROC_FILE_BYTES = 4 * 1024 * 1024
# No counter the kernel keeps is this large; anything above is garbage, not data.
_MAX_COUNTER = 2**63 - 1
_MAX_LINES = 10_000


class FileProblem(Exception):
    """A file could not be read or parsed; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: Path, reason: str, missing: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.missing = missing


def read_bounded(path: Path, limit: int = SMALL_FILE_BYTES) -> str:
    """The file's text, at most ``limit`` bytes; FileProblem when missing, unreadable,
    larger than the limit or not UTF-8."""
    chunks: list[bytes] = []
    size = 0
    try:
        # os-level reads: this runs for a thousand cgroup files a second on a busy node.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while size <= limit:
                want = limit + 1 - size
                chunk = os.read(fd, want)
                chunks.append(chunk)
                size += len(chunk)
                if len(chunk) < want:  # a short read is the end (seq_file fills the buffer otherwise)
                    break
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise FileProblem(path, "missing", missing=True) from None
    except OSError as exc:
        raise FileProblem(path, f"read failed: {exc.strerror or exc}",
                          missing=exc.errno in (19, 20)) from None  # ENODEV, ENOTDIR: cgroup gone
    return decode_bounded(path, b"".join(chunks), limit)


def decode_bounded(path: Path, data: bytes, limit: int) -> str:
    """What was read of ``path`` (up to ``limit`` + 1 bytes) as text; FileProblem when it is
    larger than the limit or not UTF-8."""
    if len(data) > limit:
        raise FileProblem(path, f"larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileProblem(path, "not UTF-8 text") from None


def parse(path: Path, text_parser: Callable[[str], T], limit: int = SMALL_FILE_BYTES) -> T:
    """read_bounded + a parser, with the parser's ValueError turned into a FileProblem."""
    return parse_text(path, read_bounded(path, limit), text_parser)


def parse_text(path: Path, text: str, text_parser: Callable[[str], T]) -> T:
    """A parser on ``path``'s text, its ValueError turned into a FileProblem naming the file."""
    try:
        return text_parser(text)
    except ValueError as exc:
        raise FileProblem(path, str(exc)) from None


def _counter(token: str, what: str) -> int:
    if not token.isascii() or not token.isdigit():
        raise ValueError(f"{what}: {token[:40]!r} is not a non-negative integer")
    value = int(token) if len(token) <= 19 else _MAX_COUNTER + 1
    if value > _MAX_COUNTER:
        raise ValueError(f"{what}: {token[:40]!r} is out of range")
    return value


def _lines(text: str) -> list[str]:
    lines = text.splitlines()
    if len(lines) > _MAX_LINES:
        raise ValueError(f"{len(lines)} lines, more than {_MAX_LINES}")
    return lines


def parse_int(data: str | bytes) -> int:
    """A file holding one non-negative integer (cpuacct.usage), as text or as read."""
    if isinstance(data, bytes):
        # What a cgroup read gives: digits and a newline (18 digits always fit).
        if 1 < len(data) <= 19 and data[-1] == 10 and data[:-1].isdigit():
            return int(data)
        data = _text(data)
    token = data.strip()
    if len(token) <= 18 and token.isdigit() and token.isascii():  # 18 digits always fit
        return int(token)
    return _counter(token, "value")


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


def parse_flat_keyed(text: str, keys: Collection[str] | None = None) -> dict[str, int]:
    """"key value" lines (memory.stat, cpu.stat) -> {key: value}; only ``keys`` when given
    (the other lines are skipped unread), each of which must be present."""
    out: dict[str, int] = {}
    if keys is not None:
        keys = tuple(keys)
        return dict(zip(keys, counters(text, keys), strict=True))
    for line in _lines(text):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"line {line[:60]!r}: want 'key value'")
        out[parts[0]] = _counter(parts[1], parts[0])
    return out


def counters(data: str | bytes, keys: tuple[str, ...]) -> tuple[int, ...]:
    """The values of the ``keys`` lines of a "key value" file, in the keys' order, from its
    text or its bytes as read; ValueError naming the keys missing or malformed."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    found = find_keyed(raw, keys)
    if found is not None:
        return found
    scanned = scan_keyed(_text(data) if isinstance(data, bytes) else data, keys)
    return tuple(scanned[k] for k in keys)


def scan_keyed(text: str, keys: Collection[str]) -> dict[str, int]:
    """Only the wanted lines, found by one regex scan (memory.stat has ~40 lines, 3-5 wanted);
    the last line of a key counts (an earlier one is not read). ValueError naming the keys
    missing or malformed."""
    last = dict(_keyed_lines(tuple(keys)).findall(text))
    out = {key: _counter(value, key) for key, value in last.items()}
    missing = [k for k in keys if k not in out]
    if missing:
        raise ValueError(f"no well-formed {', '.join(sorted(missing))} line")
    return out


def find_keyed(data: bytes, keys: tuple[str, ...]) -> tuple[int, ...] | None:
    """The fast path of ``counters`` for the files the collectors read every second: for
    each key, the last line that starts with it and one space (``rfind`` of newline, key,
    space: a memory search, not a regex over every line), whose rest must be the digits of
    a counter. None when anything is unusual (a tab anywhere, a key missing, its last line
    not a plain in-range counter right after one space): ``scan_keyed`` then decides and
    says what is wrong, so both paths accept and reject exactly the same texts."""
    if b"\t" in data:  # a tab may separate a later line of a key: the scan decides
        return None
    buf = b"\n" + data
    out = []
    for needle in _line_starts(keys):
        i = buf.rfind(needle)
        if i < 0:
            return None
        i += len(needle)
        j = buf.find(b"\n", i)
        token = buf[i:j] if j >= 0 else buf[i:]
        if len(token) > 18 or not token.isdigit():  # ASCII digits only, for bytes; 18 always fit
            return None
        out.append(int(token))
    return tuple(out)


@functools.lru_cache(maxsize=32)
def _line_starts(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    """Newline, key and a space: where a wanted line starts (the text gets a leading newline)."""
    return tuple(b"\n" + k.encode("utf-8", "surrogatepass") + b" " for k in keys)


@functools.lru_cache(maxsize=32)
def _keyed_lines(keys: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(k) for k in keys)
    return re.compile(rf"^({names})[ \t]+(\S+)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class CpuTicks:
    busy: int   # user + nice + system + irq + softirq (iowait and steal are not usage)
    total: int


def parse_proc_stat(text: str) -> dict[str, CpuTicks]:
    """The ``cpu`` and ``cpuN`` lines of /proc/stat, by name."""
    out: dict[str, CpuTicks] = {}
    for line in _lines(text):
        if not line.startswith("cpu"):
            continue
        parts = line.split()
        name = parts[0]
        if name != "cpu" and not (name[3:].isascii() and name[3:].isdigit()):
            raise ValueError(f"line {line[:60]!r}: bad cpu name")
        if len(parts) < 8:
            raise ValueError(f"line {line[:60]!r}: want at least 7 counters")
        nums = [_counter(t, name) for t in parts[1:]]
        out[name] = CpuTicks(busy=nums[0] + nums[1] + nums[2] + nums[5] + nums[6], total=sum(nums))
    if "cpu" not in out:
        raise ValueError("no 'cpu' line")
    return out


_MEMINFO_LINE = re.compile(r"^(?:Node \d+ )?([A-Za-z0-9_()]+):\s+(\d+)(?: kB)?\s*$")


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo or a NUMA node's meminfo ("Node 0 MemTotal: ... kB") -> kB by key."""
    out: dict[str, int] = {}
    for line in _lines(text):
        if not line.strip():
            continue
        m = _MEMINFO_LINE.match(line)
        if m is None:
            raise ValueError(f"line {line[:60]!r}: want 'Key: N kB'")
        out[m.group(1)] = _counter(m.group(2), m.group(1))
    return out


def node_memory_bytes(meminfo: Mapping[str, int]) -> tuple[int, int]:
    """(usage without page cache, with page cache) in bytes from /proc/meminfo:
    MemTotal - MemAvailable, and MemTotal - MemFree."""
    try:
        total, available, free = meminfo["MemTotal"], meminfo["MemAvailable"], meminfo["MemFree"]
    except KeyError as exc:
        raise ValueError(f"no {exc.args[0]} line") from None
    return max(total - available, 0) * 1024, max(total - free, 0) * 1024


def numa_memory_bytes(meminfo: Mapping[str, int]) -> int:
    """A NUMA node's used memory: MemTotal - (MemFree + Active(file) + Inactive(file) + SReclaimable)."""
    try:
        used = meminfo["MemTotal"] - (meminfo["MemFree"] + meminfo["Active(file)"]
                                      + meminfo["Inactive(file)"] + meminfo["SReclaimable"])
    except KeyError as exc:
        raise ValueError(f"no {exc.args[0]} line") from None
    return max(used, 0) * 1024


# memory.stat's keys: three of anonymous memory, then two of page cache (v1: hierarchical totals).
_V1_KEYS = ("total_inactive_anon", "total_active_anon", "total_unevictable", "total_inactive_file",
            "total_active_file")
_V2_KEYS = ("inactive_anon", "active_anon", "unevictable", "inactive_file", "active_file")


def parse_memory_stat(data: str | bytes, version: int) -> tuple[int, int]:
    """memory.stat -> (usage without page cache, with page cache): inactive_anon +
    active_anon + unevictable, plus active_file + inactive_file (v1: the total_ keys)."""
    inactive_anon, active_anon, unevictable, inactive_file, active_file = counters(
        data, _V1_KEYS if version == 1 else _V2_KEYS)
    without = inactive_anon + active_anon + unevictable
    return without, without + inactive_file + active_file


_THROTTLE_KEYS = ("nr_periods", "nr_throttled")


def parse_throttle(data: str | bytes) -> tuple[int, int]:
    """cpu.stat -> (nr_periods, nr_throttled), either version."""
    periods, throttled = counters(data, _THROTTLE_KEYS)
    return periods, throttled


def cgroup_cpu_ns(data: str | bytes, version: int) -> int:
    """CPU time used in ns: v1 cpuacct.usage, v2 cpu.stat usage_usec x 1000."""
    if version == 1:
        return parse_int(data)
    return counters(data, ("usage_usec",))[0] * 1000


def parse_cpu_quota(text: str, version: int, period_text: str | None = None) -> tuple[int, int]:
    """(quota, period) in µs; quota -1 means unlimited. v2 reads "max 100000" from cpu.max,
    v1 the quota file plus ``period_text``."""
    if version == 2:
        parts = text.split()
        if len(parts) != 2:
            raise ValueError(f"cpu.max {text.strip()[:40]!r}: want '<quota|max> <period>'")
        quota = -1 if parts[0] == "max" else _counter(parts[0], "quota")
        return quota, _counter(parts[1], "period")
    raw = text.strip()
    quota = -1 if raw == "-1" else _counter(raw, "quota")
    if period_text is None:
        raise ValueError("no period")
    return quota, _counter(period_text.strip(), "period")


def parse_cpu_list(text: str) -> list[int]:
    """A kernel cpu list ("0-3,8"), bounded by the shared cpuset parser."""
    return parse_cpuset(text)


PSI_WINDOWS = ("avg10", "avg60", "avg300")
"""The averages of a pressure line, as the kernel writes them (upstream's precisions)."""


def parse_psi(text: str) -> dict[str, tuple[float, float, float]]:
    """A pressure file -> {"some": (avg10, avg60, avg300), "full": (...)}; "full" absent
    when the kernel has none. A line missing one of the three averages is refused, as
    upstream's scan of the line refuses it."""
    out: dict[str, tuple[float, float, float]] = {}
    for line in _lines(text):
        parts = line.split()
        if not parts:
            continue
        if parts[0] not in ("some", "full"):
            raise ValueError(f"line {line[:60]!r}: want 'some ...' or 'full ...'")
        fields = dict(p.partition("=")[::2] for p in parts[1:])
        values = []
        for window in PSI_WINDOWS:
            try:
                value = float(fields[window])
            except (KeyError, ValueError):
                raise ValueError(f"line {line[:60]!r}: no numeric {window}") from None
            if not (math.isfinite(value) and 0 <= value <= 100):
                raise ValueError(f"line {line[:60]!r}: {window} {value} outside [0, 100]")
            values.append(value)
        out[parts[0]] = (values[0], values[1], values[2])
    if "some" not in out:
        raise ValueError("no 'some' line")
    return out


def parse_cpuinfo(text: str) -> list[dict[str, int]]:
    """/proc/cpuinfo -> per processor {"cpu", "socket", "core"} (physical id / core id
    default to 0 where the kernel does not show them, as on many VMs and ARM)."""
    procs: list[dict[str, int]] = []
    current: dict[str, int] = {}
    for line in _lines(text) + [""]:
        if not line.strip():
            if current:
                if "cpu" not in current:
                    raise ValueError("a processor block without 'processor'")
                procs.append({"cpu": current["cpu"], "socket": current.get("socket", 0),
                              "core": current.get("core", current["cpu"])})
                current = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        field = {"processor": "cpu", "physical id": "socket", "core id": "core"}.get(key)
        if field is not None:
            current[field] = _counter(value.strip(), key)
    if len({p["cpu"] for p in procs}) != len(procs):
        raise ValueError("a processor number appears twice")
    return procs
