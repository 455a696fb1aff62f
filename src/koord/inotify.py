"""inotify through libc (ctypes): the one file-event mechanism of both processes, under
koordlet's PLEG (cgroup directories that come and go) and the directory watcher
(``filewatch``: config dirs, NodeSLO and Node files).

The calls are few and the descriptor is an ordinary fd: callers ``select`` on it with their
own timeouts and wake-ups, add and remove watches as the tree changes, and see the kernel's
queue overflow as an event (``IN_Q_OVERFLOW``), none of which a library watching fixed
directories recursively offers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import struct
from pathlib import Path

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO = 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR, IN_ONLYDIR = 0x4000, 0x8000, 0x40000000, 0x01000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
READ_BYTES = 64 * 1024
"""One read takes at most this much of the kernel's queue; the rest waits there (bounded by
the kernel's max_queued_events, an overflow event when full)."""


class InotifyError(OSError):
    pass


@functools.cache
def _libc() -> ctypes.CDLL:
    """Loaded once: ``find_library`` runs a subprocess, too slow for every watch set up."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Inotify:
    """The three inotify calls through libc, and events decoded from the descriptor."""

    def __init__(self) -> None:
        libc = _libc()
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise InotifyError(code, f"inotify_init1: {os.strerror(code)}")
        self.fd: int = fd

    def add_watch(self, path: Path, mask: int) -> int:
        wd = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            code = ctypes.get_errno()
            raise InotifyError(code, f"inotify_add_watch {path}: {os.strerror(code)}")
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        self._rm(self.fd, wd)  # EINVAL when the kernel already dropped it: nothing to do

    def read(self) -> list[tuple[int, int, str]]:
        """(wd, mask, name) of the queued events, at most READ_BYTES of them; [] when none."""
        try:
            return decode_events(os.read(self.fd, READ_BYTES))
        except BlockingIOError:
            return []

    def close(self) -> None:
        os.close(self.fd)


def decode_events(data: bytes) -> list[tuple[int, int, str]]:
    """struct inotify_event records (wd, mask, cookie, len, NUL-padded name) as (wd, mask,
    name); a record cut short at the end (never from the kernel) is dropped."""
    events, offset = [], 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _, size = _EVENT.unpack_from(data, offset)
        end = offset + _EVENT.size + size
        if end > len(data):
            break
        name = data[offset + _EVENT.size:end].split(b"\0", 1)[0]
        events.append((wd, mask, os.fsdecode(name)))
        offset = end
    return events
