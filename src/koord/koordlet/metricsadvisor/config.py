"""The metrics advisor's settings and flags (upstream's names and defaults)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..features import ADVISOR_FEATURE_GATES, PSI_COLLECTOR, RESCTRL_COLLECTOR
from ..flagtypes import flag_bool, positive_duration
from ..hostpaths import PROC_ROOT, SYS_FS_ROOT, SYS_ROOT


@dataclass
class AdvisorConfig:
    """The advisor's settings; where the cgroups are is the agent's ``CgroupLayout``. The
    defaults are stated here only: ``add_flags`` gives them to the flags."""

    proc_root: Path = PROC_ROOT
    sys_root: Path = SYS_ROOT
    collect_res_used_interval: float = 1.0
    collect_sys_metric_outdated_interval: float = 10.0
    collect_node_cpu_info_interval: float = 60.0
    psi_collector_interval: float = 10.0
    enable_pagecache_collector: bool = False
    psi_collector: bool = ADVISOR_FEATURE_GATES[PSI_COLLECTOR]
    sys_fs_root: Path = SYS_FS_ROOT
    resctrl_collector_interval: float = 10.0
    resctrl_collector: bool = False
    """``--enable-resctrl-collector`` (whose default this is) and gate ResctrlCollector."""


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The advisor's flags, their defaults ``AdvisorConfig``'s. ``--sys-root-dir`` is added
    only when the parser lacks it; the proc root is read from the koordlet's own, the cgroups'
    place from its ``CgroupLayout``."""
    d = AdvisorConfig()
    group = parser.add_argument_group("metrics advisor")
    group.add_argument("--collect-res-used-interval", type=positive_duration, default=d.collect_res_used_interval,
                       metavar="DURATION",
                       help="node/pod/system/BE usage collect interval; below 1s disables the advisor (default: 1s)")
    group.add_argument("--collect-sys-metric-outdated-interval", type=positive_duration,
                       default=d.collect_sys_metric_outdated_interval,
                       metavar="DURATION",
                       help="node and pod totals older than this give no system usage (default: 10s)")
    group.add_argument("--collect-node-cpu-info-interval", type=positive_duration,
                       default=d.collect_node_cpu_info_interval, metavar="DURATION",
                       help="how often CPU and NUMA topology are read from /proc/cpuinfo and sysfs (default: 1m)")
    group.add_argument("--psi-collector-interval", type=positive_duration, default=d.psi_collector_interval,
                       metavar="DURATION",
                       help="PSI collect interval, with the PSICollector gate (default: 10s)")
    group.add_argument("--enable-pagecache-collector", type=flag_bool, default=d.enable_pagecache_collector,
                       nargs="?", const=True,
                       metavar="BOOL", help="also store memory usage with page cache (default: false)")
    group.add_argument("--enable-resctrl-collector", type=flag_bool, default=d.resctrl_collector,
                       nargs="?", const=True,
                       metavar="BOOL", help="collect LLC occupancy and memory bandwidth of the LSR/LS/BE "
                       "resctrl groups (also needs gate ResctrlCollector) (default: false)")
    group.add_argument("--resctrl-collector-interval", type=positive_duration, default=d.resctrl_collector_interval,
                       metavar="DURATION",
                       help="resctrl collect interval (default: 10s)")
    if "--sys-root-dir" not in parser._option_string_actions:  # noqa: SLF001 - shared flag
        group.add_argument("--sys-root-dir", type=Path, default=d.sys_root, metavar="DIR",
                           help="host /sys: CPU topology, NUMA nodes (default: %(default)s)")


def from_args(args: argparse.Namespace) -> AdvisorConfig:
    """The config of koordlet's full command line (``flags.build_parser``): no defaults here."""
    gates = args.feature_gates
    return AdvisorConfig(
        proc_root=Path(args.proc_root_dir),
        sys_root=Path(args.sys_root_dir),
        collect_res_used_interval=args.collect_res_used_interval,
        collect_sys_metric_outdated_interval=args.collect_sys_metric_outdated_interval,
        collect_node_cpu_info_interval=args.collect_node_cpu_info_interval,
        psi_collector_interval=args.psi_collector_interval,
        enable_pagecache_collector=args.enable_pagecache_collector,
        psi_collector=gates[PSI_COLLECTOR],
        sys_fs_root=Path(args.sys_fs_root_dir),
        resctrl_collector_interval=args.resctrl_collector_interval,
        resctrl_collector=bool(args.enable_resctrl_collector and gates[RESCTRL_COLLECTOR]),
    )
