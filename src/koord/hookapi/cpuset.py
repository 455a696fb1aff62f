"""CPU lists in the kernel's syntax (``0-3,5``): parsed once, bounded, for answers, annotations and cgroups.

Inputs come from plugins, pod and node annotations and cgroup files, so the parser is
bounded before it allocates: ASCII digits only (``\\d`` would also take other scripts'
digits), CPU ids up to ``max_cpu`` (the kernel's default NR_CPUS limit, or the node's own
count when the caller knows it), and a bounded text length. ``0-4000000000`` is an error
naming the input, never a four-billion-element set.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_CPU_ID = 4095
"""Highest CPU id accepted unless the caller gives its own bound."""

MAX_TEXT = 32 * 1024
"""Every id up to 4095 listed one by one fits in 20 KiB."""

_DIGITS = frozenset("0123456789")
_SPACE = " \t"


def _shown(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _number(token: str, text: str, max_cpu: int) -> int:
    token = token.strip(_SPACE)
    if not token or not set(token) <= _DIGITS:
        raise ValueError(f"bad cpuset {_shown(text)}: {token!r} is not a cpu id; want a list like '0-3,5'")
    if len(token) > len(str(max_cpu)) or int(token) > max_cpu:
        raise ValueError(f"bad cpuset {_shown(text)}: cpu id {token[:20]} is above the limit {max_cpu}")
    return int(token)


def parse_cpuset(text: str, *, max_cpu: int = MAX_CPU_ID) -> list[int]:
    """Kernel list syntax to sorted cpu ids; ``""`` is the empty set. ValueError naming the input if malformed.

    Spaces around ids and commas are tolerated (``0-3, 5``); anything else is not.
    """
    if len(text) > MAX_TEXT:
        raise ValueError(f"bad cpuset {_shown(text)}: longer than {MAX_TEXT} characters")
    if not text.strip(_SPACE + "\n"):
        return []
    cpus: set[int] = set()
    for part in text.strip(_SPACE + "\n").split(","):
        lo, dash, hi = part.partition("-")
        first = _number(lo, text, max_cpu)
        last = _number(hi, text, max_cpu) if dash else first
        if last < first:
            raise ValueError(f"bad cpuset {_shown(text)}: range {part.strip(_SPACE)} runs backwards")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def cpuset_value(value: object, where: str, error: type[Exception] = ValueError) -> str:
    """A JSON value that must be a cpu list (from an annotation): the text, validated; ``error`` naming ``where``."""
    if not isinstance(value, str):
        raise error(f"{where}={value!r} is not a string; want a cpu list like 0-3,5")
    try:
        parse_cpuset(value)
    except ValueError as exc:
        raise error(f"{where}: {exc}") from None
    return value


def format_cpuset(cpus: Iterable[int]) -> str:
    """Ids to the compact kernel form: [0, 1, 2, 3, 5] -> ``0-3,5``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
