"""The two kernel switches of the CPU QoS policies, under ``<proc-root>/sys/kernel``.

``sched_group_identity_enabled`` (Anolis / Alibaba Cloud Linux 26.4 and later) turns group
identity on: without it set to 1, ``cpu.bvt_warp_ns`` is accepted but does nothing.
``sched_core`` (Anolis) turns core scheduling on. The kernel refuses a bvt of -1 while core
scheduling is on, so each policy turns the other's switch off before its own on, as upstream
does. Mainline kernels have neither file: core scheduling is then a build option
(CONFIG_SCHED_CORE) that the prctl probe finds, and group identity does not exist.

Each value is 0 or 1; a file holding anything else is an error naming it, never a guess.
"""

from __future__ import annotations

from pathlib import Path

GROUP_IDENTITY = "kernel/sched_group_identity_enabled"
SCHED_CORE = "kernel/sched_core"
_MAX_BYTES = 64


class SysctlError(Exception):
    """A switch could not be read or written; the message names the file."""


def path(proc_root: Path, name: str) -> Path:
    return Path(proc_root) / "sys" / name


def exists(proc_root: Path, name: str) -> bool:
    """Whether this kernel has the switch at all."""
    return path(proc_root, name).is_file()


def enabled(proc_root: Path, name: str) -> bool:
    """True when the switch reads 1."""
    file = path(proc_root, name)
    try:
        with open(file, "rb") as f:
            text = f.read(_MAX_BYTES).decode("ascii", "replace").strip()
    except OSError as exc:
        raise SysctlError(f"{file}: {exc.strerror or exc}") from None
    if text not in ("0", "1"):
        raise SysctlError(f"{file}: {text[:20]!r} is neither 0 nor 1")
    return text == "1"


def switch(proc_root: Path, name: str, on: bool) -> bool:
    """Sets the switch to 1 or 0; True when it was written (False: it already was)."""
    if enabled(proc_root, name) == on:
        return False
    file = path(proc_root, name)
    try:
        file.write_text("1" if on else "0")
    except OSError as exc:
        raise SysctlError(f"{file}: cannot write {int(on)}: {exc.strerror or exc}") from None
    return True
