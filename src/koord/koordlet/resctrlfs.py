"""The resctrl file system (``<sys-fs-root>/resctrl``): what the CPU and the mount offer,
schemata lines, groups, their tasks and monitoring data; shared by the per-pod Resctrl hook,
the class-level ResctrlReconcile strategy and the resctrl collector.

Every value is checked the way the kernel checks it before anything is written (a cache
mask must be one contiguous run of bits inside the root's ``cbm_mask`` with at least
``min_cbm_bits`` bits; a bandwidth value at least ``min_bandwidth``; a new group needs a free
CLOSID), so a refused value is an error naming the file and the reason, never a partial
update. All files read are bounded in size.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 64 * 1024
MAX_CPUINFO_BYTES = 4 * 1024 * 1024
MAX_CACHE_ID = 4095
AMD_VENDOR = "AuthenticAMD"
AMD_UNLIMITED_MB = 2048
AMD_MAX_MB_GBPS = 25 * 8 * 0.8
"""Upstream's AMD MBA scale: 2048 means unlimited, else a share of 160 GB/s (Milan, with a
0.8 discount); a percent p becomes int(160 x p / 100)."""
_NOT_GROUPS = {"info", "mon_groups", "mon_data"}
MS_RELATIME = 1 << 21


class ResctrlError(ValueError):
    """A resctrl file is unusable, or a value the kernel would refuse; the message says which."""


def _read(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ResctrlError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ResctrlError(f"{path}: larger than {limit} bytes")
    return data.decode("ascii", "replace")


def _int(text: str, path: Path, base: int = 10) -> int:
    try:
        value = int(text.strip(), base)
    except ValueError:
        raise ResctrlError(f"{path}: {text.strip()[:40]!r} is not a number") from None
    if value < 0:
        raise ResctrlError(f"{path}: {value} is negative")
    return value


def contiguous(mask: int) -> bool:
    """One run of set bits (what x86 CAT requires of every cache bit mask)."""
    if mask <= 0:
        return False
    low = mask >> ((mask & -mask).bit_length() - 1)
    return (low + 1) & low == 0


def l3_mask(cbm: int, start: int, end: int) -> str:
    """Upstream's way mask: bits [ceil(ways x start/100), ceil(ways x end/100)) of the root's
    contiguous low mask, in hex (cbm fff, [0, 30) -> f; 7ff, [10, 80) -> fe)."""
    if cbm <= 0 or (cbm + 1) & cbm:
        raise ResctrlError(f"root cbm_mask {cbm:x} is not a contiguous low mask")
    if not 0 <= start < end <= 100:
        raise ResctrlError(f"L3 range [{start}, {end}): want 0 <= start < end <= 100")
    ways = cbm.bit_length()
    start_way, end_way = -(-ways * start // 100), -(-ways * end // 100)
    if end_way <= start_way:
        raise ResctrlError(f"L3 range [{start}, {end}) covers no cache way of {ways}")
    return f"{(1 << end_way) - (1 << start_way):x}"


def mb_value(percent: int, amd: bool, granularity: int = 10) -> int:
    """A memory-bandwidth percent as the schemata's MB value: Intel rounds up to the
    bandwidth granularity (upstream: multiples of 10), AMD uses its own scale."""
    if not 0 < percent <= 100:
        raise ResctrlError(f"mbaPercent {percent}: want (0, 100]")
    if amd:
        return AMD_UNLIMITED_MB if percent == 100 else int(AMD_MAX_MB_GBPS * percent / 100)
    gran = max(granularity, 1)
    return min(math.ceil(percent / gran) * gran, 100)


def parse_schemata(text: str, where: str = "schemata") -> dict[str, dict[int, str]]:
    """``L3:0=fff;1=fff`` / ``MB:0=100;1=100`` lines (the kernel pads them with spaces; ours
    end in ``;``) -> {"L3": {0: "fff", 1: "fff"}, "MB": {...}}; other resources kept too."""
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, domains = line.partition(":")
        if not sep or not name.strip():
            raise ResctrlError(f"{where}: line {line[:60]!r} is not 'RESOURCE:id=value;...'")
        values: dict[int, str] = {}
        for item in domains.split(";"):
            item = item.strip()
            if not item:
                continue
            cache_id, eq, value = item.partition("=")
            if not eq or not cache_id.strip().isdigit() or int(cache_id) > MAX_CACHE_ID:
                raise ResctrlError(f"{where}: {item[:40]!r} in line {name.strip()} is not 'id=value'")
            values[int(cache_id)] = value.strip()
        out[name.strip()] = values
    return out


def schemata_line(resource: str, values: Mapping[int, str | int]) -> str:
    """``L3:0=f;1=f;`` (upstream's form: every id, a trailing ``;``)."""
    return f"{resource}:" + "".join(f"{i}={v};" for i, v in sorted(values.items()))


@dataclass(frozen=True)
class CPUInfo:
    vendor: str
    flags: frozenset[str]

    @property
    def amd(self) -> bool:
        return self.vendor == AMD_VENDOR


def cpu_info(proc_root: Path) -> CPUInfo:
    """The first processor's vendor and flags from ``<proc>/cpuinfo``."""
    path = Path(proc_root) / "cpuinfo"
    vendor, flags = "", frozenset[str]()
    for line in _read(path, MAX_CPUINFO_BYTES).splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags":
            flags = frozenset(value.split())
            break
    return CPUInfo(vendor, flags)


@dataclass(frozen=True)
class Info:
    """What the mounted resctrl offers: the L3 root mask, its limits, MB's limits and the
    cache ids of each resource in the root schemata."""

    cbm: int
    min_cbm_bits: int
    num_closids: int
    l3_ids: tuple[int, ...]
    mb_ids: tuple[int, ...]
    mb_granularity: int
    mb_min: int


def check_l3(mask: str, info: Info, where: str) -> None:
    value = int(mask, 16)
    bits = bin(value).count("1")
    if not contiguous(value) or value & ~info.cbm:
        raise ResctrlError(f"{where}: L3 mask {mask} is not one contiguous run of bits inside "
                           f"cbm_mask {info.cbm:x}")
    if bits < info.min_cbm_bits:
        raise ResctrlError(f"{where}: L3 mask {mask} has {bits} bits, fewer than min_cbm_bits "
                           f"{info.min_cbm_bits}")

def check_mb(value: int, info: Info, amd: bool, where: str) -> None:
    if not amd and value < info.mb_min:
        raise ResctrlError(f"{where}: MB {value} is below min_bandwidth {info.mb_min}")


class ResctrlFS:
    def __init__(self, sys_fs_root: Path) -> None:
        self.root = Path(sys_fs_root) / "resctrl"

    def mounted(self) -> bool:
        return (self.root / "schemata").is_file() and (self.root / "info").is_dir()

    def info(self) -> Info:
        l3 = self.root / "info" / "L3"
        cbm = _int(_read(l3 / "cbm_mask"), l3 / "cbm_mask", 16)
        if cbm == 0 or (cbm + 1) & cbm:
            raise ResctrlError(f"{l3 / 'cbm_mask'}: {cbm:x} is not a contiguous low mask")
        min_bits = _int(_read(l3 / "min_cbm_bits"), l3 / "min_cbm_bits") if (l3 / "min_cbm_bits").exists() else 1
        closids = _int(_read(l3 / "num_closids"), l3 / "num_closids")
        root = parse_schemata(_read(self.root / "schemata"), str(self.root / "schemata"))
        mb = self.root / "info" / "MB"
        gran = _int(_read(mb / "bandwidth_gran"), mb / "bandwidth_gran") if (mb / "bandwidth_gran").exists() else 10
        mb_min = _int(_read(mb / "min_bandwidth"), mb / "min_bandwidth") if (mb / "min_bandwidth").exists() else 0
        return Info(cbm, min_bits, closids, tuple(sorted(root.get("L3", {}))), tuple(sorted(root.get("MB", {}))),
                    gran, mb_min)

    # ---- groups --------------------------------------------------------------------------

    def group_dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith(".") or name in _NOT_GROUPS:
            raise ResctrlError(f"bad resctrl group name {name!r}")
        return self.root / name

    def groups(self) -> list[str]:
        """Control groups below the root (each holds a CLOSID; the root holds one too)."""
        try:
            entries = list(os.scandir(self.root))
        except OSError as exc:
            raise ResctrlError(f"{self.root}: {exc.strerror or exc}") from None
        return sorted(e.name for e in entries
                      if e.is_dir(follow_symlinks=False) and e.name not in _NOT_GROUPS)

    def ensure_groups(self, names: Iterable[str], info: Info) -> list[str]:
        """Creates the missing groups, all or none: the kernel refuses mkdir (ENOSPC) when
        no CLOSID is left, so the free ones are counted first. Returns the created names."""
        missing = [n for n in names if not self.group_dir(n).is_dir()]
        free = info.num_closids - 1 - len(self.groups())
        if len(missing) > free:
            raise ResctrlError(f"{self.root}: no CLOSID left for groups {', '.join(missing)}: "
                               f"num_closids {info.num_closids}, {len(self.groups())} groups exist "
                               "besides the root")
        for n in missing:
            try:
                os.mkdir(self.group_dir(n), 0o755)
            except FileExistsError:
                continue
            except OSError as exc:
                reason = "no CLOSID left" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
                raise ResctrlError(f"{self.group_dir(n)}: mkdir: {reason}") from None
        return missing

    # ---- schemata ------------------------------------------------------------------------

    def schemata(self, group: str) -> dict[str, dict[int, str]]:
        path = self.group_dir(group) / "schemata"
        return parse_schemata(_read(path), str(path)) if path.exists() else {}

    def write_schemata(self, group: str, lines: Mapping[str, Mapping[int, str]]) -> bool:
        """Writes ``lines`` (resource -> id -> value) in one write (the kernel applies all of
        a write's lines or none); False when the group already holds them."""
        current = self.schemata(group)
        if all(_same(resource, current.get(resource, {}), values) for resource, values in lines.items()):
            return False
        path = self.group_dir(group) / "schemata"
        text = "".join(schemata_line(r, v) + "\n" for r, v in lines.items())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise ResctrlError(f"{path}: write {text.strip()!r} failed: {exc.strerror or exc}") from None
        return True

    # ---- tasks ---------------------------------------------------------------------------

    def tasks(self, group: str) -> set[int]:
        path = self.group_dir(group) / "tasks"
        if not path.exists():
            return set()
        text = _read(path, 16 * 1024 * 1024)
        return {_int(t, path) for t in text.split()}

    def add_tasks(self, group: str, tids: Iterable[int]) -> int:
        return write_tasks(self.group_dir(group) / "tasks", tids)

    # ---- monitoring ----------------------------------------------------------------------

    def mon_data(self, group: str) -> dict[int, dict[str, int]]:
        """``mon_data/mon_L3_<id>/{llc_occupancy,mbm_local_bytes,mbm_total_bytes}`` per cache id
        (files the CPU lacks are left out)."""
        base = self.group_dir(group) / "mon_data"
        out: dict[int, dict[str, int]] = {}
        try:
            domains = sorted(e.name for e in os.scandir(base) if e.is_dir())
        except OSError as exc:
            raise ResctrlError(f"{base}: {exc.strerror or exc}") from None
        for domain in domains:
            parts = domain.split("_")
            if len(parts) != 3 or parts[1] != "L3" or not parts[2].isdigit():
                continue
            values = {}
            for name in ("llc_occupancy", "mbm_local_bytes", "mbm_total_bytes"):
                f = base / domain / name
                if f.exists():
                    values[name] = _int(_read(f), f)
            out[int(parts[2])] = values
        return out


def mount_resctrl(target: Path) -> None:
    """``mount -t resctrl resctrl <target>``, as upstream mounts it (relatime, no options)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"resctrl", os.fsencode(target), b"resctrl", ctypes.c_ulong(MS_RELATIME), None) != 0:
        code = ctypes.get_errno()
        raise ResctrlError(f"mount -t resctrl resctrl {target}: {os.strerror(code)}")


Mount = Callable[[Path], None]


def enable(fs: ResctrlFS, proc_root: Path, mount: Mount = mount_resctrl) -> tuple[bool, str]:
    """Upstream's support check and CheckAndTryEnableResctrlCat: (usable, what was done or why
    not). A mounted tree is used as it is; else the CPU must list ``cat_l3`` and ``mba``, and
    the file system is mounted, after which L3 CAT (``info/L3/cbm_mask``) must be there."""
    if fs.mounted():
        return True, ""
    try:
        flags = cpu_info(proc_root).flags
    except ResctrlError as exc:
        return False, f"cannot tell whether the CPU has RDT: {exc}"
    missing = [f for f in ("cat_l3", "mba") if f not in flags]
    if missing:
        return False, f"the CPU flags in {Path(proc_root) / 'cpuinfo'} lack {' and '.join(missing)}"
    if not fs.root.is_dir():
        return False, f"{fs.root} does not exist (a kernel without resctrl?)"
    try:
        mount(fs.root)
    except ResctrlError as exc:
        return False, str(exc)
    if not fs.mounted():
        return False, f"mounted resctrl at {fs.root}, but it has no schemata"
    if not (fs.root / "info" / "L3" / "cbm_mask").is_file():
        return False, f"mounted resctrl at {fs.root}, but L3 CAT is not enabled (no info/L3/cbm_mask)"
    return True, f"mounted resctrl at {fs.root}"


def _same(resource: str, current: Mapping[int, str], wanted: Mapping[int, str]) -> bool:
    base = 16 if resource == "L3" else 10
    try:
        return all(i in current and int(current[i], base) == int(str(v), base) for i, v in wanted.items())
    except ValueError:
        return False


def write_tasks(tasks_file: Path, tids: Iterable[int | str]) -> int:
    """Moves threads into a resctrl group: one write per thread id, as the kernel takes one;
    threads that exited meanwhile are skipped. Returns how many moved."""
    moved = 0
    fd = os.open(tasks_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for tid in tids:
            try:
                os.write(fd, f"{tid}\n".encode())
                moved += 1
            except ProcessLookupError:
                continue
    finally:
        os.close(fd)
    return moved
