"""Go ``flag`` package command lines, as upstream koordlet parses them, turned into
argparse's ``--name=value`` form.

Go's rules (``flag.FlagSet.parseOne``): one or two dashes are the same; ``-name=value``;
``-name value`` for every flag that is not boolean (the next argument is taken whatever
it looks like); booleans only as ``-name`` or ``-name=<bool>``; parsing stops at ``--``
or at the first argument that is not a flag, and the rest is not parsed; ``-h`` and
``-help`` ask for the usage. Every value is then checked by the argparse type of its flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

MAX_ARGS = 1000
MAX_ARG_CHARS = 64 * 1024

MERGED_FLAGS = frozenset({"feature-gates", "runtime-hooks-disable-stages", "qos-extension-plugins"})
"""Flags whose repeats add up in upstream (map and slice flag types) instead of the last winning."""


class GoFlagError(ValueError):
    """A command line Go's flag package refuses; the message is Go's wording."""


def known_flags(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Every long flag name of ``parser`` -> whether it is boolean (takes no separate value)."""
    known: dict[str, bool] = {}
    for action in parser._actions:
        is_bool = action.nargs == 0 or (action.nargs == "?" and action.const is True)
        for option in action.option_strings:
            if option.startswith("--"):
                known[option[2:]] = is_bool
    return known


def parse(argv: Sequence[str], known: dict[str, bool]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(flag name, value or None for a bare boolean) in order, and the arguments left unparsed."""
    if len(argv) > MAX_ARGS:
        raise GoFlagError(f"more than {MAX_ARGS} arguments")
    args = list(argv)
    out: list[tuple[str, str | None]] = []
    while args:
        s = args[0]
        if len(s) > MAX_ARG_CHARS:
            raise GoFlagError(f"argument longer than {MAX_ARG_CHARS} characters: {s[:40]!r}...")
        if len(s) < 2 or s[0] != "-":
            break
        dashes = 2 if s[1] == "-" else 1
        if s == "--":
            args.pop(0)
            break
        name = s[dashes:]
        if not name or name[0] in "-=":
            raise GoFlagError(f"bad flag syntax: {s[:80]}")
        args.pop(0)
        value: str | None = None
        if "=" in name[1:]:
            name, _, value = name.partition("=")
        if name in ("h", "help") and name not in known:
            out.append(("help", None))
            continue
        if name not in known:
            raise GoFlagError(f"flag provided but not defined: -{name[:80]}")
        if not known[name] and value is None:
            if not args:
                raise GoFlagError(f"flag needs an argument: -{name}")
            value = args.pop(0)
        out.append((name, value))
    return out, args


def to_argparse(pairs: Iterable[tuple[str, str | None]], known: dict[str, bool],
                store_true: frozenset[str] = frozenset()) -> list[str]:
    """``--name=value`` tokens argparse reads unambiguously; merged flags joined by commas.

    A bare boolean becomes ``--name=true`` (argparse would take the next argument as its
    value); ``store_true`` names flags argparse knows only bare (``--help``, ``--version``).
    """
    merged: dict[str, list[str]] = {}
    tokens: list[str] = []
    for name, value in pairs:
        if name in store_true:
            tokens.append(f"--{name}")
        elif name in MERGED_FLAGS and value is not None:
            if name not in merged:
                merged[name] = []
                tokens.append(name)  # placeholder: the joined value goes where the flag first was
            merged[name].append(value)
        else:
            tokens.append(f"--{name}={'true' if value is None and known.get(name) else value}")
    return [f"--{t}={','.join(merged[t])}" if t in merged else t for t in tokens]
