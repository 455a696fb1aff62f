"""The cgroup executor: the only code that knows cgroup file names, versions and drivers.

Plugins speak in logical resources (``cpu_shares``, ``memory_limit`` ...) and relative
cgroup dirs; this module maps them to v1 (``<root>/<subsystem>/<dir>/<file>``) or v2
(``<root>/<dir>/<file>``) files, converts values between the two (shares to weight,
quota to ``cpu.max``), validates ranges before touching the kernel, and skips writes that
would not change anything so a periodic reconcile stays cheap and quiet.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath

from koord import cgrouplimits
from koord.hookapi import format_cpuset, parse_cpuset

from ..resources import KubeQoS, Resources
from .pathcache import CgroupFileCache

log = logging.getLogger(__name__)

CGROUPFS = "cgroupfs"
SYSTEMD = "systemd"
KUBE_DIR = "kubepods"
"""kubelet's top cgroup of pods (``--cgroup-kube-dir``); ``kubepods.slice`` under systemd."""

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
    "cpu_idle": _File("cpu", "cpu.idle", "cpu.idle"),
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
    "cpu_idle": cgrouplimits.Kind.IDLE,
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
                "cpuset_mems", "cpuset_cpus", "cpu_bvt_warp_ns", "cpu_idle")


def shares_to_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 cpu.shares, the formula runc and kubelet use."""
    return 1 + ((shares - 2) * 9999) // 262142


def _systemd_slice_dir(slice_name: str) -> str:
    """Expands a systemd slice name into its nesting: "a-b-c.slice" -> "a.slice/a-b.slice/a-b-c.slice"."""
    stem = slice_name.removesuffix(".slice")
    parts = stem.split("-")
    return "/".join("-".join(parts[:i]) + ".slice" for i in range(1, len(parts) + 1))


class CgroupExecutor:
    """Reads and writes cgroup files of pods and containers below ``root``."""

    def __init__(self, root: Path = Path("/sys/fs/cgroup"), driver: str | None = None,
                 version: int | None = None, kube_dir: str = KUBE_DIR) -> None:
        if driver not in (None, CGROUPFS, SYSTEMD):
            raise ValueError(f"cgroup driver {driver!r}: want {CGROUPFS!r} or {SYSTEMD!r}")
        if version not in (None, 1, 2):
            raise ValueError(f"cgroup version {version!r}: want 1 or 2")
        self.root = Path(root)
        self.driver = driver
        self.version: int = version or (2 if (self.root / "cgroup.controllers").exists() else 1)
        self.kube_dir = self._checked_dir(kube_dir)
        # The QoS strategies resolve the same thousand paths every second; building each
        # anew (dir check, three joins) cost more than reading the file.
        self._paths: CgroupFileCache[tuple[str, str], Path] = CgroupFileCache(lambda _, path: path)

    # ---- layout -------------------------------------------------------------------------

    def _driver_for(self, cgroup_parent: str | None) -> str:
        if self.driver:
            return self.driver
        if cgroup_parent is not None:
            return SYSTEMD if cgroup_parent.rstrip("/").endswith(".slice") else CGROUPFS
        # No parent to look at: believe the tree kubelet made.
        base = self.root / "cpu" if self.version == 1 else self.root
        return SYSTEMD if (base / self._systemd_kube_dir()).is_dir() else CGROUPFS

    def kube_qos_dir(self, qos: KubeQoS) -> str:
        """kubelet's dir of a kube QoS class below the kube dir (``--cgroup-kube-dir``).

        cgroupfs: ``<kube>/besteffort``; systemd: ``<kube>/kubepods-besteffort.slice`` with
        ``kubepods`` standing for ``kubepods.slice``; guaranteed pods sit in the kube dir.
        """
        if self._driver_for(None) == SYSTEMD:
            base = self._systemd_kube_dir()
            return base if qos is KubeQoS.GUARANTEED else f"{base}/kubepods-{qos.value}.slice"
        return self.kube_dir if qos is KubeQoS.GUARANTEED else f"{self.kube_dir}/{qos.value}"

    def _systemd_kube_dir(self) -> str:
        return "kubepods.slice" if self.kube_dir == KUBE_DIR else self.kube_dir

    def pod_dir(self, cgroup_parent: str) -> str:
        """kubelet's cgroup parent, in either driver's form, as a dir relative to the hierarchy."""
        parent = cgroup_parent.strip().strip("/")
        if not parent:
            raise CgroupError("empty pod cgroup parent")
        if "/" not in parent and parent.endswith(".slice"):
            parent = _systemd_slice_dir(parent)
        return self._checked_dir(parent)

    def container_dir(self, pod_cgroup_parent: str, container_id: str) -> str:
        if not container_id or "/" in container_id:
            raise CgroupError(f"bad container id {container_id!r} under {pod_cgroup_parent!r}")
        pod = self.pod_dir(pod_cgroup_parent)
        if self._driver_for(pod_cgroup_parent) == SYSTEMD:
            return f"{pod}/cri-containerd-{container_id}.scope"
        return f"{pod}/{container_id}"

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
        """Keeps every path inside the hierarchy: a pod's parent must not name ``..``."""
        rel = PurePosixPath(cgroup_dir.strip("/"))
        if ".." in rel.parts:
            raise CgroupError(f"cgroup dir {cgroup_dir!r} leaves the cgroup root")
        return str(rel)

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

    def supports(self, cgroup_dir: str, resource: str) -> bool:
        try:
            return self.path(cgroup_dir, resource).is_file()
        except CgroupError:
            return False

    def read(self, cgroup_dir: str, resource: str) -> str:
        path = self.path(cgroup_dir, resource)
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
        if res.unified:
            written += self._apply_unified(cgroup_dir, res.unified)
        return written

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
    return executor.path(cgroup_dir, "cpu_shares").parent.is_dir()


def file_names(resources: Resources) -> list[str]:
    """The files ``apply`` writes of ``resources``, by their cgroup v1 names whatever the
    version (upstream's names of cgroup resource types), then each unified file."""
    names = [_FILES[name].v1 for name in _APPLY_ORDER if getattr(resources, name) is not None]
    return names + sorted(resources.unified)
