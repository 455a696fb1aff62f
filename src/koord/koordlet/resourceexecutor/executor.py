"""The cgroup executor: the only code that knows cgroup file names and their versions.

Plugins speak in logical resources (``cpu_shares``, ``memory_limit`` ...) and relative
cgroup dirs (named by the agent's ``CgroupLayout``, which the executor is made over and
hands out); this module maps them to v1 (``<root>/<subsystem>/<dir>/<file>``) or v2
(``<root>/<dir>/<file>``) files, converts values between the two (shares to weight,
quota to ``cpu.max``), validates ranges before touching the kernel, and skips writes that
would not change anything so a periodic reconcile stays cheap and quiet.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path

from koord import cgrouplimits
from koord.hookapi import format_cpuset, parse_cpuset

from ..cgrouplayout import CgroupLayout, checked_dir
from ..resources import CgroupFile, KubeQoS, Resources
from .pathcache import CgroupFileCache

log = logging.getLogger(__name__)

# cgroup v1 memory.limit_in_bytes reads back LONG_MAX rounded down to a page when unlimited.
_V1_MEMORY_UNLIMITED = 9223372036854771712


class CgroupError(Exception):
    """A cgroup file could not be read or written; the message names the file and why.

    ``errno`` is the kernel's error number when a write was refused (EINVAL: value rejected),
    so the caller can back off instead of retrying the same value every tick; ``missing``
    names the file when the cgroup or the file does not exist (see ``CgroupExecutor.gone``).
    """

    def __init__(self, message: str, errno: int | None = None, missing: Path | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.missing = missing


@dataclass(frozen=True)
class _File:
    subsystem: str
    v1: str
    v2: str


# Logical resource name -> files. "tasks" is read-only: the thread ids of a cgroup.
_FILES: dict[str, _File] = {
    "cpu_shares": _File("cpu", "cpu.shares", "cpu.weight"),
    "cpu_quota": _File("cpu", "cpu.cfs_quota_us", "cpu.max"),
    "cpu_period": _File("cpu", "cpu.cfs_period_us", "cpu.max"),
    "cpu_burst": _File("cpu", "cpu.cfs_burst_us", "cpu.max.burst"),
    "memory_limit": _File("memory", "memory.limit_in_bytes", "memory.max"),
    "cpuset_cpus": _File("cpuset", "cpuset.cpus", "cpuset.cpus"),
    "cpuset_mems": _File("cpuset", "cpuset.mems", "cpuset.mems"),
    "cpu_bvt_warp_ns": _File("cpu", "cpu.bvt_warp_ns", "cpu.bvt_warp_ns"),
    "tasks": _File("cpu", "tasks", "cgroup.threads"),
    "procs": _File("cpu", "cgroup.procs", "cgroup.procs"),
    # Read by the metrics advisor. v2's cpu.stat holds usage_usec where v1 has cpuacct.usage
    # (ns); callers parse by ``version``.
    "cpuacct_usage": _File("cpuacct", "cpuacct.usage", "cpu.stat"),
    "cpu_stat": _File("cpu", "cpu.stat", "cpu.stat"),
    "memory_stat": _File("memory", "memory.stat", "memory.stat"),
    "memory_usage": _File("memory", "memory.usage_in_bytes", "memory.current"),
    "cpuset_cpus_effective": _File("cpuset", "cpuset.cpus", "cpuset.cpus.effective"),
    # Pressure stall information: v1 only on kernels that put it in cpuacct (Anolis).
    "cpu_pressure": _File("cpuacct", "cpu.pressure", "cpu.pressure"),
    "memory_pressure": _File("cpuacct", "memory.pressure", "memory.pressure"),
    "io_pressure": _File("cpuacct", "io.pressure", "io.pressure"),
    # Memory QoS: v2 has min/low/high/oom.group; on v1 only Anolis kernels have them, with
    # the same names, plus the wmark/priority files (which Anolis has on v2 too).
    "memory_min": _File("memory", "memory.min", "memory.min"),
    "memory_low": _File("memory", "memory.low", "memory.low"),
    "memory_high": _File("memory", "memory.high", "memory.high"),
    "memory_wmark_ratio": _File("memory", "memory.wmark_ratio", "memory.wmark_ratio"),
    "memory_wmark_scale_factor": _File("memory", "memory.wmark_scale_factor", "memory.wmark_scale_factor"),
    "memory_wmark_min_adj": _File("memory", "memory.wmark_min_adj", "memory.wmark_min_adj"),
    "memory_priority": _File("memory", "memory.priority", "memory.priority"),
    "memory_use_priority_oom": _File("memory", "memory.use_priority_oom", "memory.use_priority_oom"),
    "memory_oom_group": _File("memory", "memory.oom.group", "memory.oom.group"),
}
_READ_ONLY = {"tasks", "procs", "cpuacct_usage", "cpu_stat", "memory_stat", "memory_usage",
              "cpuset_cpus_effective", "cpu_pressure", "memory_pressure", "io_pressure"}

# Every integer resource is checked against what its kernel file accepts before a write.
_LIMITS = {
    "cpu_shares": cgrouplimits.Kind.SHARES,
    "cpu_quota": cgrouplimits.Kind.QUOTA,
    "cpu_period": cgrouplimits.Kind.PERIOD,
    "cpu_burst": cgrouplimits.Kind.BURST,
    "memory_limit": cgrouplimits.Kind.MEMORY,
    "cpu_bvt_warp_ns": cgrouplimits.Kind.BVT,
}

MEMORY_MAX = (1 << 63) - 1
"""memory.high's "no limit": v2 spells it ``max``; v1 (Anolis) reads back LONG_MAX page-aligned."""
PAGE_SIZE = 4096
_MEMORY_BYTES = ("memory_min", "memory_low", "memory_high")


@functools.lru_cache(maxsize=1024)
def _canonical_cpuset(value: str) -> str:
    """A cpu list in the kernel's form; ValueError when it is not one. Cached: the QoS
    strategies check the same few lists for every container every second."""
    return format_cpuset(parse_cpuset(value))


# Memory QoS files: the ranges the kernel (and the NodeSLO API) accept.
_RANGES: dict[str, tuple[int, int]] = {
    **{name: (0, MEMORY_MAX) for name in _MEMORY_BYTES},
    "memory_wmark_ratio": (0, 100),
    "memory_wmark_scale_factor": (1, 1000),
    "memory_wmark_min_adj": (-25, 50),
    "memory_priority": (0, 12),
    "memory_use_priority_oom": (0, 1),
    "memory_oom_group": (0, 1),
}

# Write order inside one cgroup: period before quota so a v1 quota below the old period is
# accepted; mems before cpus as runc does.
_APPLY_ORDER = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit",
                "cpuset_mems", "cpuset_cpus", "cpu_bvt_warp_ns")


def shares_to_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 cpu.shares, the formula runc and kubelet use."""
    return 1 + ((shares - 2) * 9999) // 262142


class CgroupExecutor:
    """Reads and writes cgroup files of pods and containers below the layout's root; the
    dir methods are the layout's, raising ``CgroupError`` as the rest of the executor."""

    def __init__(self, layout: CgroupLayout) -> None:
        self.layout = layout
        # Read on every path lookup: plain attributes, not a walk through the layout.
        self.root, self.version = layout.root, layout.version
        # The QoS strategies resolve the same thousand paths every second; building each
        # anew (dir check, three joins) cost more than reading the file.
        self._paths: CgroupFileCache[tuple[str, str], Path] = CgroupFileCache(lambda _, path: path)

    # ---- layout -------------------------------------------------------------------------

    def kube_qos_dir(self, qos: KubeQoS) -> str:
        """kubelet's dir of a kube QoS class (``CgroupLayout.kube_qos_dir``)."""
        return self.layout.kube_qos_dir(qos)

    def pod_dir(self, cgroup_parent: str) -> str:
        """kubelet's cgroup parent, in either driver's form, as a dir relative to the hierarchy."""
        try:
            return self.layout.pod_dir_of_parent(cgroup_parent)
        except ValueError as exc:
            raise CgroupError(str(exc)) from None

    def container_dir(self, pod_cgroup_parent: str, container_id: str) -> str:
        """The cgroup dir of a container of the pod with cgroup parent ``pod_cgroup_parent``."""
        try:
            return self.layout.container_dir_of_parent(pod_cgroup_parent, container_id)
        except ValueError as exc:
            raise CgroupError(str(exc)) from None

    def path(self, cgroup_dir: str, resource: str, keep: bool = True) -> Path:
        """The file of ``resource`` in ``cgroup_dir``, cached unless ``keep`` is False (for a
        caller that keeps its own form of it: a Path is half a kilobyte, and the metrics
        advisor's thousand files a second would hold a megabyte of them here)."""
        key = (cgroup_dir, resource)
        found = self._paths.get(key)
        if found is not None:
            return found
        spec = _FILES.get(resource)
        if spec is None:
            raise CgroupError(f"unknown cgroup resource {resource!r}; known: {', '.join(_FILES)}")
        rel = self._checked_dir(cgroup_dir)
        if self.version == 1:
            path = self.root / spec.subsystem / rel / spec.v1
        else:
            path = self.root / rel / spec.v2
        if keep:
            self._paths.put(key, path)
        return path

    @staticmethod
    def _checked_dir(cgroup_dir: str) -> str:
        """``checked_dir`` raising the executor's error."""
        try:
            return checked_dir(cgroup_dir)
        except ValueError as exc:
            raise CgroupError(str(exc)) from None

    def gone(self, exc: CgroupError) -> bool:
        """Whether ``exc`` is about a cgroup that went: a pod or container that left between
        the list that named it and this call, whose nearest existing ancestor is a QoS or
        pod dir below the hierarchy's root. A file missing from a cgroup that is there (a
        kernel without it), or a tree looked for in the wrong place (missing up to the
        root), is not that."""
        if exc.missing is None:
            return False
        try:
            rel = exc.missing.relative_to(self.root)
        except ValueError:
            return False
        base = self.root if self.version == 2 else self.root / rel.parts[0]
        ancestor = exc.missing.parent
        if ancestor.is_dir():
            return False
        while ancestor != base and base in ancestor.parents:
            ancestor = ancestor.parent
            if ancestor.is_dir():
                return ancestor != base
        return False

    # ---- read / write -------------------------------------------------------------------

    def file_path(self, cgroup_dir: str, file: CgroupFile) -> Path:
        """The path of a plugin's own cgroup file (``Resources.files``)."""
        rel = self._checked_dir(cgroup_dir)
        return self.root / file.subsystem / rel / file.v1 if self.version == 1 else self.root / rel / file.v2

    def supports(self, cgroup_dir: str, resource: str) -> bool:
        try:
            return self.path(cgroup_dir, resource).is_file()
        except CgroupError:
            return False

    def read(self, cgroup_dir: str, resource: str) -> str:
        return self._read(self.path(cgroup_dir, resource))

    @staticmethod
    def _read(path: Path) -> str:
        try:
            # os-level calls: no buffered text stream built for a file of a few bytes.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(fd, 65536)
                if len(data) == 65536:  # a short read is the end (seq_file fills the buffer otherwise)
                    data += b"".join(iter(lambda: os.read(fd, 65536), b""))
            finally:
                os.close(fd)
            return data.decode().strip()
        except FileNotFoundError:
            raise CgroupError(f"{path}: missing (cgroup or file does not exist)", missing=path) from None
        except OSError as exc:
            raise CgroupError(f"{path}: read failed: {exc.strerror or exc}") from None

    def write(self, cgroup_dir: str, resource: str, value: int | str) -> bool:
        """Writes one resource; False when the file already holds the value."""
        if resource in _READ_ONLY:
            raise CgroupError(f"{self.path(cgroup_dir, resource)}: read-only resource {resource!r}")
        path = self.path(cgroup_dir, resource)
        canonical = self._validate(path, resource, value)
        if self.version == 2 and resource in ("cpu_quota", "cpu_period"):
            return self._write_cpu_max(cgroup_dir, **{resource: canonical})
        current = self.read(cgroup_dir, resource)
        text = self._to_file_text(resource, canonical)
        if self._normalize(resource, current) == self._normalize(resource, text):
            return False
        self._write_file(path, text)
        return True

    def apply(self, cgroup_dir: str, res: Resources) -> list[str]:
        """Writes every set field of ``res``; returns the resources actually written."""
        written: list[str] = []
        todo = {f.name: getattr(res, f.name) for f in fields(res)
                if f.name in _APPLY_ORDER and getattr(res, f.name) is not None}
        if self.version == 2 and "cpu_quota" in todo and "cpu_period" in todo:
            # One cpu.max write, so the kernel never sees a half-updated pair.
            path = self.path(cgroup_dir, "cpu_quota")
            quota = self._validate(path, "cpu_quota", todo.pop("cpu_quota"))
            period = self._validate(path, "cpu_period", todo.pop("cpu_period"))
            if self._write_cpu_max(cgroup_dir, cpu_quota=quota, cpu_period=period):
                written += ["cpu_period", "cpu_quota"]
        for name in _APPLY_ORDER:
            if name in todo and self.write(cgroup_dir, name, todo[name]):
                written.append(name)
        for file, value in res.files.items():
            if self._write_plugin_file(cgroup_dir, file, value):
                written.append(file.name)
        if res.unified:
            written += self._apply_unified(cgroup_dir, res.unified)
        return written

    def _write_plugin_file(self, cgroup_dir: str, file: CgroupFile, value: int) -> bool:
        """A plugin's own file, range-checked; False when it already holds the value."""
        path = self.file_path(cgroup_dir, file)
        why = file.problem(value)
        if why:
            raise CgroupError(f"{path}: {file.name}={value!r} {why}")
        if self._read(path) == str(value):
            return False
        self._write_file(path, str(value))
        return True

    def _apply_unified(self, cgroup_dir: str, unified: dict[str, str]) -> list[str]:
        if self.version == 1:
            log.warning("cgroup %s: ignoring unified %s: only cgroup v2 has unified files",
                        cgroup_dir, sorted(unified))
            return []
        written = []
        for name, value in sorted(unified.items()):
            if not name or "/" in name or name.startswith("."):
                raise CgroupError(f"cgroup {cgroup_dir}: bad unified file name {name!r}")
            path = self.root / self._checked_dir(cgroup_dir) / name
            if not path.is_file():
                raise CgroupError(f"{path}: missing (unified key {name!r})")
            if path.read_text().strip() != value.strip():
                self._write_file(path, value)
                written.append(f"unified:{name}")
        return written

    def _write_cpu_max(self, cgroup_dir: str, cpu_quota: str | None = None,
                       cpu_period: str | None = None) -> bool:
        current = self.read(cgroup_dir, "cpu_quota")
        cur_quota, _, cur_period = current.partition(" ")
        quota = cur_quota if cpu_quota is None else ("max" if cpu_quota == "-1" else cpu_quota)
        period = cur_period or "100000"
        if cpu_period is not None:
            period = cpu_period
        text = f"{quota} {period}"
        if text == f"{cur_quota} {cur_period}":
            return False
        self._write_file(self.path(cgroup_dir, "cpu_quota"), text)
        return True

    @staticmethod
    def _write_file(path: Path, text: str) -> None:
        try:
            # O_TRUNC without O_CREAT: a missing cgroup must fail, not grow a plain file.
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except FileNotFoundError:
            raise CgroupError(f"{path}: missing (cgroup or file does not exist)", missing=path) from None
        except OSError as exc:
            raise CgroupError(f"{path}: open for write failed: {exc.strerror or exc}") from None
        try:
            # An empty write never reaches the kernel's handler; a bare newline clears a list.
            os.write(fd, (text or "\n").encode())
        except OSError as exc:
            raise CgroupError(f"{path}: write {text!r} failed: {exc.strerror or exc}",
                              errno=exc.errno) from None
        finally:
            os.close(fd)
        log.debug("wrote %r to %s", text, path)

    # ---- values -------------------------------------------------------------------------

    @staticmethod
    def _validate(path: Path, resource: str, value: int | str) -> str:
        """Checks the logical value before it reaches the kernel; returns it as text."""
        def bad(reason: str) -> CgroupError:
            return CgroupError(f"{path}: {resource}={value!r} {reason}")

        if resource in ("cpuset_cpus", "cpuset_mems"):
            if not isinstance(value, str):
                raise bad("is not a cpu list string")
            try:
                return _canonical_cpuset(value)
            except ValueError as exc:
                raise bad(f"rejected: {exc}") from None
        if isinstance(value, bool):
            raise bad("is not an integer")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise bad("is not an integer") from None
        kind = _LIMITS.get(resource)
        why = cgrouplimits.problem(kind, number) if kind is not None else None
        if why:
            raise bad(why)
        lo, hi = _RANGES.get(resource, (number, number))
        if not lo <= number <= hi:
            raise bad(f"is out of range: the kernel accepts [{lo}, {hi}]")
        return str(number)

    def _to_file_text(self, resource: str, canonical: str) -> str:
        if self.version == 2:
            if resource == "cpu_shares":
                return str(shares_to_weight(int(canonical)))
            if resource == "memory_limit" and canonical == "-1":
                return "max"
            if resource == "memory_high" and int(canonical) == MEMORY_MAX:
                return "max"
        return canonical

    @staticmethod
    def _normalize(resource: str, text: str) -> object:
        """File content in a comparable form, so equal values in different spellings match."""
        text = text.strip()
        if resource in ("cpuset_cpus", "cpuset_mems"):
            try:
                return tuple(parse_cpuset(text))
            except ValueError:
                return text
        if resource == "memory_limit":
            if text == "max":
                return -1
            if text.lstrip("-").isdigit() and int(text) >= _V1_MEMORY_UNLIMITED:
                return -1
        if resource in _MEMORY_BYTES:
            # The kernel keeps these in pages: a value reads back rounded down to one.
            if text == "max" or (text.isdigit() and int(text) >= _V1_MEMORY_UNLIMITED):
                return MEMORY_MAX
            if text.isdigit():
                return int(text) // PAGE_SIZE * PAGE_SIZE
        try:
            return int(text)
        except ValueError:
            return text


def cgroup_dir_exists(executor: CgroupExecutor, cgroup_dir: str, resources: Resources) -> bool:
    """Whether the cgroup of the first resource to write exists (v1 checks that subsystem)."""
    for name in _APPLY_ORDER:
        if getattr(resources, name) is not None:
            return executor.path(cgroup_dir, name).parent.is_dir()
    first = next(iter(resources.files), None)
    if first is not None:
        return executor.file_path(cgroup_dir, first).parent.is_dir()
    return executor.path(cgroup_dir, "cpu_shares").parent.is_dir()


def file_names(resources: Resources) -> list[str]:
    """The files ``apply`` writes of ``resources``, by their cgroup v1 names whatever the
    version (upstream's names of cgroup resource types), then each unified file."""
    names = [_FILES[name].v1 for name in _APPLY_ORDER if getattr(resources, name) is not None]
    return names + sorted(resources.unified)
