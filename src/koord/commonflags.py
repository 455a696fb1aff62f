"""What both binaries' command lines share: ``--version`` (this package's version and the
upstream Koordinator release whose behaviour, flags and objects they follow) and the
``--log-level`` values."""

from __future__ import annotations

import argparse

LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level(text: str) -> str:
    """``debug``, ``info``, ``warning`` or ``error``, in any case."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want {', '.join(LOG_LEVELS)}")
    return text.lower()


UPSTREAM_VERSION = "v1.8.0"
"""Koordinator release followed (main at a7a1b76b, July 2026: v1.8.0 plus 61 commits)."""
UPSTREAM_COMMIT = "a7a1b76bbf81abd26f9c377de1f31a60dd965f6e"


def package_version() -> str:
    # Imported here: only --version asks, and importlib.metadata (with csv and zipfile)
    # is a megabyte of a node agent's memory for the rest of its life.
    from importlib import metadata

    try:
        return metadata.version("koord-runtime")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def version_text(prog: str) -> str:
    return (f"{prog} {package_version()} (koord-runtime, Python); follows Koordinator "
            f"{UPSTREAM_VERSION} (commit {UPSTREAM_COMMIT[:8]})")


class PrintVersion(argparse.Action):
    """``--version``: prints ``version_text`` on one line (argparse's own action re-wraps it)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text(parser.prog))
        parser.exit(0)
