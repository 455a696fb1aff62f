"""A resctrl tree shaped like the kernel's, for machines without RDT (none of the test
machines has ``/sys/fs/resctrl``): ``info/L3`` (``cbm_mask``, ``min_cbm_bits``,
``num_closids``), ``info/MB`` (``bandwidth_gran``, ``min_bandwidth``), the root ``schemata``
and ``tasks``, and monitoring files; plus a ``cpuinfo`` with the RDT flags.

The kernel creates a group's files on mkdir; ``add_group_files`` does that for groups the
code under test created, so their ``tasks`` and ``mon_data`` can be read back.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

RDT_FLAGS = ("cat_l3", "mba", "cqm_llc", "cqm_occup_llc", "cqm_mbm_total", "cqm_mbm_local")


def make_resctrl_tree(sys_fs_root: Path, *, cbm: str = "fff", cache_ids: Iterable[int] = (0, 1),
                      num_closids: int = 16, min_cbm_bits: int = 1, mb_granularity: int = 10,
                      min_bandwidth: int = 10) -> Path:
    root = Path(sys_fs_root) / "resctrl"
    ids = list(cache_ids)
    (root / "info" / "L3").mkdir(parents=True, exist_ok=True)
    (root / "info" / "MB").mkdir(parents=True, exist_ok=True)
    (root / "info" / "L3" / "cbm_mask").write_text(cbm + "\n")
    (root / "info" / "L3" / "min_cbm_bits").write_text(f"{min_cbm_bits}\n")
    (root / "info" / "L3" / "num_closids").write_text(f"{num_closids}\n")
    (root / "info" / "MB" / "bandwidth_gran").write_text(f"{mb_granularity}\n")
    (root / "info" / "MB" / "min_bandwidth").write_text(f"{min_bandwidth}\n")
    (root / "info" / "MB" / "num_closids").write_text(f"{num_closids}\n")
    l3 = ";".join(f"{i}={cbm}" for i in ids)
    mb = ";".join(f"{i}=100" for i in ids)
    (root / "schemata").write_text(f"    L3:{l3}\n    MB:{mb}\n")
    (root / "tasks").write_text("")
    add_group_files(root, ids, llc=0, mbm=0)
    return root


def add_group_files(group: Path, cache_ids: Iterable[int], *, llc: int, mbm: int) -> None:
    """``tasks`` and ``mon_data/mon_L3_<id>/{llc_occupancy,mbm_local_bytes,mbm_total_bytes}``."""
    group.mkdir(parents=True, exist_ok=True)
    if not (group / "tasks").exists():
        (group / "tasks").write_text("")
    for i in cache_ids:
        d = group / "mon_data" / f"mon_L3_{i:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "llc_occupancy").write_text(f"{llc}\n")
        (d / "mbm_local_bytes").write_text(f"{mbm}\n")
        (d / "mbm_total_bytes").write_text(f"{2 * mbm}\n")


def make_cpuinfo(proc_root: Path, flags: Iterable[str] = RDT_FLAGS, vendor: str = "GenuineIntel",
                 cpus: int = 2) -> None:
    proc = Path(proc_root)
    proc.mkdir(parents=True, exist_ok=True)
    flag_text = " ".join(["fpu", "sse2", *flags])
    (proc / "cpuinfo").write_text("".join(
        f"processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: test cpu\nflags\t\t: {flag_text}\n\n"
        for n in range(cpus)))
