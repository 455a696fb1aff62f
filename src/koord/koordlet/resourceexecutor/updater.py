"""ResourceExecutor: the cgroup executor with a cache of recent writes, leveled batches and
back-off, shared by the runtime hooks and the QoS manager.

Why each piece exists:

- **Cache of recent writes.** The QoS manager recomputes the same values every second; a
  cacheable update whose value equals the one written (or found) less than
  ``force_update_seconds`` ago is skipped without even reading the file. Entries expire
  after ``cache_ttl`` so a value changed behind koordlet's back (kubelet resetting the
  besteffort quota, a runtime hook rewriting a cpuset) is corrected within a minute.
  Every write through this executor, cacheable or not, drops the file's entry first, so
  the hooks and the QoS manager never trust a value the other one replaced.
- **Leveled writes.** A cgroup's child may not be wider than its parent (cpusets), and on
  cgroup v1 a child's cfs quota may not exceed its parent's. Going from one consistent
  tree to another therefore widens top-down first (cpuset union of old and new, larger
  quota, -1 counting as the largest) and narrows bottom-up to the exact values after.
- **Write sequence.** Every write is numbered and each file remembers its last number, so
  a strategy that skips reading files it found as wanted can ask whether any of them was
  written here since (``written_since``); writers outside this process it re-reads for.
- **Back-off on EINVAL.** A kernel that rejects a value keeps rejecting it; retrying every
  tick costs CPU and floods the log. The same value on the same file is retried only
  after a doubling delay; a different value is tried at once.
- **Timed writes.** ``observe_write`` is told how long each write the kernel was asked to
  take lasted, and whether it took it (upstream's ``koordlet_resource_update_duration_milliseconds``).
  A write of a file or cgroup that is not there is not told, as upstream ignores those
  errors; nor are the writes skipped because the file holds the value already (the read
  before is not timed) or because the value is in back-off: upstream's timer also covers
  its read-before-write, so its count includes updates that found the value in place.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from koord.hookapi import format_cpuset, parse_cpuset

from ..cgrouplayout import CgroupLayout
from .executor import MEMORY_MAX, CgroupError, CgroupExecutor
from .pathcache import CgroupFileCache

log = logging.getLogger(__name__)

FORCE_UPDATE_SECONDS = 60.0
CACHE_TTL_SECONDS = 120.0
BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0


@dataclass(frozen=True)
class Update:
    """One logical value for one cgroup; ``owner`` says whose it is in logs and errors."""

    cgroup_dir: str
    resource: str
    value: int | str
    owner: str = ""

    def __str__(self) -> str:
        who = f" ({self.owner})" if self.owner else ""
        return f"{self.cgroup_dir}:{self.resource}={self.value!r}{who}"


@dataclass
class BatchResult:
    """What a batch did: the updates written, and one message per update that failed."""

    written: list[Update] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Backoff:
    text: str
    delay: float
    until: float


def merge_wider(resource: str, current: str, wanted: int | str) -> int | str:
    """The value that admits both ``current`` and ``wanted``: what a parent gets while its
    children move from one to the other. Only cpusets and quotas have an order."""
    if resource == "cpuset_cpus":
        return format_cpuset(set(parse_cpuset(current)) | set(parse_cpuset(str(wanted))))
    if resource == "cpu_quota":
        cur = quota_value(current)
        new = int(wanted)
        if cur == -1 or new == -1:
            return -1
        return max(cur, new)
    if resource in ("memory_min", "memory_low", "memory_high"):
        # A child's protection or throttling above its parent's is not in effect; raise the
        # parents first so the children's new values count from the start.
        return max(memory_value(current), int(wanted))
    return wanted


def memory_value(text: str) -> int:
    """A memory.min/low/high file's value in bytes; ``max`` as the largest int64."""
    text = text.strip()
    return MEMORY_MAX if text == "max" else int(text)


def quota_value(text: str) -> int:
    """A quota file's value: v1 ``-1``/number, v2 ``max 100000``/``50000 100000``."""
    first = text.split()[0] if text.split() else ""
    return -1 if first in ("max", "-1") else int(first)


class ResourceExecutor(CgroupExecutor):
    """The one cgroup writer of koordlet. Thread-safe: the QoS strategies run in their own
    threads and the hooks in the gRPC server's."""

    def __init__(self, layout: CgroupLayout, *,
                 force_update_seconds: float = FORCE_UPDATE_SECONDS,
                 cache_ttl: float = CACHE_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 observe_write: Callable[[bool, float], None] | None = None) -> None:
        super().__init__(layout)
        self.observe_write = observe_write
        """Told (written, seconds) of each write (see the module's docstring)."""
        self.force_update_seconds = force_update_seconds
        self.cache_ttl = cache_ttl
        self._clock = clock
        self._lock = threading.RLock()
        self._cache: dict[Path, dict[str, tuple[str, float]]] = {}
        """File -> resource -> (canonical value, when written or found); by file, so a write
        drops its file's entries without a scan of every cached file (v2's cpu.max holds two
        resources)."""
        self._backoff: dict[Path, _Backoff] = {}
        self._last_prune = clock()
        self._write_seq = 0
        self._written: CgroupFileCache[Path, int] = CgroupFileCache(lambda path, _: path)
        """File -> the number of its last write (a file whose cgroup is gone is forgotten)."""

    # ---- single updates -----------------------------------------------------------------

    def update(self, u: Update, *, cacheable: bool = True) -> bool:
        """Writes ``u``; False when skipped (cached, or the file already holds the value).

        Raises CgroupError naming the file, the value and the reason, including a value in
        back-off after the kernel rejected it with EINVAL.
        """
        path = self.path(u.cgroup_dir, u.resource)
        canonical = self._validate(path, u.resource, u.value)
        with self._lock:
            now = self._clock()
            self._prune(now)
            if cacheable and self._fresh(path, u.resource, canonical, now):
                return False
            try:
                written = self.write(u.cgroup_dir, u.resource, u.value)
            except CgroupError as exc:
                raise CgroupError(f"{exc}{' for ' + u.owner if u.owner else ''}",
                                  errno=exc.errno) from None
            self._cache.setdefault(path, {})[u.resource] = (canonical, now)
            if written:
                log.info("resource executor: wrote %s", u)
            return written

    def _fresh(self, path: Path, resource: str, canonical: str, now: float) -> bool:
        """The cache says this value was written (or found) less than force_update_seconds ago."""
        hit = self._cache.get(path, {}).get(resource)
        return hit is not None and hit[0] == canonical and now - hit[1] < self.force_update_seconds

    def cached(self, u: Update) -> bool:
        """``update(u)`` would be skipped now: the steady state of a periodic writer."""
        return not self.uncached([u])

    def uncached(self, updates: Iterable[Update]) -> list[Update]:
        """The updates ``update`` would not skip now, in order. One lock and one validation
        per distinct value for the whole batch: a periodic writer checks a tree of a hundred
        dirs getting the same value every second."""
        canonical: dict[tuple[str, type, int | str], str] = {}
        out = []
        with self._lock:
            now = self._clock()
            for u in updates:
                key = (u.resource, type(u.value), u.value)
                try:
                    path = self.path(u.cgroup_dir, u.resource)
                    if key not in canonical:
                        canonical[key] = self._validate(path, u.resource, u.value)
                except CgroupError:  # update() reports it
                    out.append(u)
                    continue
                if not self._fresh(path, u.resource, canonical[key], now):
                    out.append(u)
        return out

    @property
    def write_seq(self) -> int:
        """The number of the last write this executor made (0 before any): kept by a caller
        that later asks ``written_since``."""
        return self._write_seq

    def written_since(self, paths: Iterable[Path], seq: int) -> bool:
        """Whether this executor wrote any of ``paths`` after its write number ``seq``."""
        with self._lock:
            written = self._written
            return any((written.get(p) or 0) > seq for p in paths)

    # ---- tree -----------------------------------------------------------------------------

    def subtree(self, cgroup_dir: str, resource: str, max_depth: int) -> list[list[str]]:
        """``cgroup_dir`` and its descendants holding ``resource``'s file, by level: [[dir],
        [children], [grandchildren], ...] down to ``max_depth`` levels below, names sorted.
        Walks the real tree, so a container's dir kubelet's pod list does not name yet (the
        sandbox's, say) is found too."""
        top = self._checked_dir(cgroup_dir)
        if not self.supports(top, resource):
            return []
        levels = [[top]]
        for _ in range(max_depth):
            below: list[str] = []
            for d in levels[-1]:
                base = self.path(d, resource).parent
                try:
                    names = sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
                except OSError:
                    continue
                below += [f"{d}/{n}" for n in names if self.supports(f"{d}/{n}", resource)]
            if not below:
                break
            levels.append(below)
        return levels

    # ---- batches --------------------------------------------------------------------------

    def update_batch(self, updates: Sequence[Update], *, cacheable: bool = True) -> BatchResult:
        """Every update in order; one failure does not stop the others."""
        result = BatchResult()
        for u in updates:
            try:
                if self.update(u, cacheable=cacheable):
                    result.written.append(u)
            except CgroupError as exc:
                result.errors.append(str(exc))
        return result

    def leveled_update(self, levels: Sequence[Sequence[Update]]) -> BatchResult:
        """``levels[0]`` is the top (e.g. the besteffort dir), then pods, then containers.

        Top-down, each cpuset/quota first gets the value admitting both the old and the new
        tree (union, larger quota); then bottom-up every update gets its exact value. A level
        whose merge write fails still gets its exact pass, which reports the real error.
        """
        result = BatchResult()
        # Dirs already at their value (cached) take no part: nothing to widen or narrow.
        levels = [self.uncached(level) for level in levels]
        for level in levels:
            for u in level:
                try:
                    current = self.read(u.cgroup_dir, u.resource)
                    merged = merge_wider(u.resource, current, u.value)
                    if self.update(Update(u.cgroup_dir, u.resource, merged, u.owner),
                                   cacheable=False):
                        result.written.append(u)
                except (CgroupError, ValueError) as exc:
                    log.debug("resource executor: widening %s: %s", u, exc)
        for level in reversed(levels):
            part = self.update_batch(level, cacheable=True)
            result.written += [u for u in part.written if u not in result.written]
            result.errors += part.errors
        return result

    # ---- the one place a file is written ----------------------------------------------------

    def _write_file(self, path: Path, text: str) -> None:  # type: ignore[override]
        """Every write of this executor (hooks' included) ends here: back-off and cache."""
        with self._lock:
            now = self._clock()
            self._cache.pop(path, None)
            held = self._backoff.get(path)
            if held is not None and held.text == text and now < held.until:
                raise CgroupError(
                    f"{path}: write {text!r} skipped: the kernel rejected it with EINVAL, "
                    f"retrying in {held.until - now:.0f}s", errno=errno.EINVAL)
            observe = self.observe_write
            start = time.perf_counter() if observe is not None else 0.0
            try:
                CgroupExecutor._write_file(path, text)
            except CgroupError as exc:
                if observe is not None and exc.missing is None:
                    observe(False, time.perf_counter() - start)
                if exc.errno == errno.EINVAL:
                    delay = (min(held.delay * 2, BACKOFF_MAX_SECONDS)
                             if held is not None and held.text == text else BACKOFF_INITIAL_SECONDS)
                    self._backoff[path] = _Backoff(text, delay, now + delay)
                    raise CgroupError(f"{exc} (EINVAL: not retried for {delay:.0f}s)",
                                      errno=exc.errno) from None
                raise
            if observe is not None:
                observe(True, time.perf_counter() - start)
            self._backoff.pop(path, None)
            self._write_seq += 1
            self._written.put(path, self._write_seq)

    def _prune(self, now: float) -> None:
        if now - self._last_prune < self.cache_ttl / 4:
            return
        self._last_prune = now
        for path, entries in list(self._cache.items()):
            for resource in [r for r, (_, ts) in entries.items() if now - ts >= self.cache_ttl]:
                del entries[resource]
            if not entries:
                del self._cache[path]
