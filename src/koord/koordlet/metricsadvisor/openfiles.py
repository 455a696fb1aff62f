"""Cgroup files kept open between ticks and read with ``pread``.

A node with a hundred pods has about 1200 cgroup files read every second. Opening one
resolves its path component by component (eight levels deep under ``kubepods``), which
costs more than reading it; kept open, a read is one ``pread`` at offset 0 (the kernel's
seq_file regenerates the content for every read from the start).

A cgroup that is removed makes reads of its open files fail (ENODEV): the file is then
closed and opened again by path once, which fails as "missing" when the cgroup is gone
and reads the new one when it was made again. That holds only on the kernel's cgroup
filesystems; anywhere else (a tree of plain files standing in for one) a removed or
replaced file stays readable through its descriptor and would be read as it was
forever. So a file found elsewhere keeps its last content, and a read that gives the
same content again asks ``fstat`` whether the file still has a link (none: removed or
replaced, opened again by path); a file whose content moved on is live, with no call.

Files not read for ``idle_seconds`` are closed (pods that left), and at most
``max_open`` stay open (the least recently read go first), so a churning node cannot run
koordlet out of descriptors.
"""

from __future__ import annotations

import ctypes
import errno
import heapq
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .parsers import FileProblem, decode_bounded

DEFAULT_MAX_OPEN = 4096
DEFAULT_IDLE_SECONDS = 60.0
FIRST_READ = 4096
"""A read asks for this much first, and for the whole limit only when it came back full: a
cgroup file is far smaller, and a read into a 64 KiB buffer costs more than the file
(measured 10.1 vs 6.8 µs on a kernel's memory.stat)."""


CGROUP_FILESYSTEMS = frozenset({0x27E0EB, 0x63677270})
"""statfs magic numbers of cgroup v1 and v2: files whose reads fail once their cgroup is
removed."""


class _StatFs(ctypes.Structure):
    """The head of the kernel's ``struct statfs``; the buffer is as large as the whole."""

    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 120)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.POINTER(_StatFs)]


def on_cgroup_filesystem(fd: int) -> bool:
    """Whether the open file ``fd`` is on a cgroup filesystem (False when that cannot be
    told: the file is then checked as a plain one, which is always right)."""
    buf = _StatFs()
    return _libc.fstatfs(fd, ctypes.byref(buf)) == 0 and buf.f_type in CGROUP_FILESYSTEMS


def _pread_bounded(fd: int, limit: int) -> bytes:
    """The file from its start, at most ``limit`` + 1 bytes (one more than allowed, so a
    caller sees a file that is too large): ``FIRST_READ`` first, the rest only when that
    came back full."""
    data = os.pread(fd, min(FIRST_READ, limit + 1), 0)
    if len(data) == FIRST_READ:
        data = os.pread(fd, limit + 1, 0)
    return data


class OpenFiles:
    def __init__(self, max_open: int = DEFAULT_MAX_OPEN, idle_seconds: float = DEFAULT_IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_open = max_open
        self.idle_seconds = idle_seconds
        self._clock = clock
        # path -> [fd, last read, last content (None on a cgroup filesystem)], updated in
        # place: a read costs one dict lookup.
        self._fds: dict[str | Path, list] = {}
        self._lock = threading.Lock()
        self._last_sweep = clock()

    def __len__(self) -> int:
        return len(self._fds)

    def read(self, path: str | Path, limit: int) -> str:
        """The file's text, at most ``limit`` bytes; FileProblem as ``read_bounded`` raises it.
        ``path`` is the key as given: a caller names each file one way (str or Path)."""
        data = self.read_all([path], limit)[0]
        if isinstance(data, FileProblem):
            raise data
        if not data.isascii():
            return decode_bounded(Path(path), data, limit)
        return data.decode("ascii")

    def read_all(self, paths: Sequence[str | Path], limit: int) -> list[bytes | FileProblem]:
        """Each file's bytes (at most ``limit``) or the FileProblem that stopped it, in order:
        one lock and one clock reading for a tick's hundreds of files. Whole under the lock:
        no other thread closes (and reuses) a descriptor mid-read."""
        now = self._clock()
        out: list[bytes | FileProblem] = []
        fds = self._fds
        with self._lock:
            if now - self._last_sweep >= self.idle_seconds:
                self._sweep(now)
            for path in paths:
                entry = fds.get(path)
                if entry is not None:
                    try:
                        data = _pread_bounded(entry[0], limit)
                        if entry[2] is not None:
                            if data == entry[2] and os.fstat(entry[0]).st_nlink == 0:
                                raise FileNotFoundError(errno.ENOENT, "removed or replaced")
                            entry[2] = data
                        entry[1] = now
                        out.append(data if len(data) <= limit else self._too_large(path, limit))
                        continue
                    except OSError:  # gone, replaced or made again: by path once more
                        del fds[path]
                        self._close(entry[0])
                try:
                    data = self._open(path, limit, now)
                    out.append(data if len(data) <= limit else self._too_large(path, limit))
                except FileProblem as exc:
                    out.append(exc)
        return out

    @staticmethod
    def _too_large(path: str | Path, limit: int) -> FileProblem:
        return FileProblem(Path(path), f"larger than {limit} bytes")

    def _open(self, path: str | Path, limit: int, now: float) -> bytes:
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            data = _pread_bounded(fd, limit)
        except FileNotFoundError:
            self._close(fd)
            raise FileProblem(Path(path), "missing", missing=True) from None
        except OSError as exc:
            self._close(fd)
            raise FileProblem(Path(path), f"read failed: {exc.strerror or exc}",
                              missing=exc.errno in (errno.ENODEV, errno.ENOTDIR)) from None
        self._fds[path] = [fd, now, None if on_cgroup_filesystem(fd) else data]
        if len(self._fds) > self.max_open:
            # The least recently read go, a tenth at a time, so a node past the bound does
            # not pay a search through every open file for each new one.
            excess = len(self._fds) - self.max_open + self.max_open // 10
            for victim, (old_fd, *_) in heapq.nsmallest(excess, self._fds.items(), key=lambda kv: kv[1][1]):
                del self._fds[victim]
                self._close(old_fd)
        return data

    def _sweep(self, now: float) -> None:
        self._last_sweep = now
        for path, (fd, last, _) in list(self._fds.items()):
            if now - last >= self.idle_seconds:
                del self._fds[path]
                self._close(fd)

    @staticmethod
    def _close(fd: int) -> None:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            for fd, *_ in self._fds.values():
                self._close(fd)
            self._fds.clear()
