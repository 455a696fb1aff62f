"""The metrics advisor's settings and flags (upstream's names and defaults)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..features import ADVISOR_FEATURE_GATES, PSI_COLLECTOR, RESCTRL_COLLECTOR
from ..flagtypes import flag_bool, positive_duration


@dataclass
class AdvisorConfig:
    """The advisor's settings; where the cgroups are is the agent's ``CgroupLayout``."""

    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    collect_res_used_interval: float = 1.0
    collect_sys_metric_outdated_interval: float = 10.0
    collect_node_cpu_info_interval: float = 60.0
    psi_collector_interval: float = 10.0
    enable_pagecache_collector: bool = False
    psi_collector: bool = False
    sys_fs_root: Path = Path("/sys/fs")
    resctrl_collector_interval: float = 10.0
    resctrl_collector: bool = False


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The advisor's flags. ``--sys-root-dir`` is added only when the parser lacks it; the
    proc root is read from the koordlet's own, the cgroups' place from its ``CgroupLayout``."""
    group = parser.add_argument_group("metrics advisor")
    group.add_argument("--collect-res-used-interval", type=positive_duration, default=1.0, metavar="DURATION",
                       help="node/pod/system/BE usage collect interval; below 1s disables the advisor (default: 1s)")
    group.add_argument("--collect-sys-metric-outdated-interval", type=positive_duration, default=10.0,
                       metavar="DURATION",
                       help="node and pod totals older than this give no system usage (default: 10s)")
    group.add_argument("--collect-node-cpu-info-interval", type=positive_duration, default=60.0, metavar="DURATION",
                       help="how often CPU and NUMA topology are read from /proc/cpuinfo and sysfs (default: 1m)")
    group.add_argument("--psi-collector-interval", type=positive_duration, default=10.0, metavar="DURATION",
                       help="PSI collect interval, with the PSICollector gate (default: 10s)")
    group.add_argument("--enable-pagecache-collector", type=flag_bool, default=False, nargs="?", const=True,
                       metavar="BOOL", help="also store memory usage with page cache (default: false)")
    group.add_argument("--enable-resctrl-collector", type=flag_bool, default=False, nargs="?", const=True,
                       metavar="BOOL", help="collect LLC occupancy and memory bandwidth of the LSR/LS/BE "
                       "resctrl groups (also needs gate ResctrlCollector) (default: false)")
    group.add_argument("--resctrl-collector-interval", type=positive_duration, default=10.0, metavar="DURATION",
                       help="resctrl collect interval (default: 10s)")
    if "--sys-root-dir" not in parser._option_string_actions:  # noqa: SLF001 - shared flag
        group.add_argument("--sys-root-dir", type=Path, default=Path("/sys"), metavar="DIR",
                           help="host /sys: CPU topology, NUMA nodes (default: %(default)s)")


def from_args(args: argparse.Namespace) -> AdvisorConfig:
    gates = getattr(args, "feature_gates", None) or {}
    return AdvisorConfig(
        proc_root=Path(getattr(args, "proc_root_dir", "/proc")),
        sys_root=Path(getattr(args, "sys_root_dir", "/sys")),
        collect_res_used_interval=args.collect_res_used_interval,
        collect_sys_metric_outdated_interval=args.collect_sys_metric_outdated_interval,
        collect_node_cpu_info_interval=args.collect_node_cpu_info_interval,
        psi_collector_interval=args.psi_collector_interval,
        enable_pagecache_collector=args.enable_pagecache_collector,
        psi_collector=bool(gates.get(PSI_COLLECTOR, ADVISOR_FEATURE_GATES[PSI_COLLECTOR])),
        sys_fs_root=Path(getattr(args, "sys_fs_root_dir", "/sys/fs")),
        resctrl_collector_interval=args.resctrl_collector_interval,
        resctrl_collector=bool(args.enable_resctrl_collector and gates.get(
            RESCTRL_COLLECTOR, ADVISOR_FEATURE_GATES[RESCTRL_COLLECTOR])),
    )
