"""The metrics advisor's settings and flags (upstream's names and defaults)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..features import ADVISOR_FEATURE_GATES, PSI_COLLECTOR
from ..flagtypes import flag_bool, positive_duration
from ..statesinformer.meta import DEFAULT_KUBE_DIR


@dataclass
class AdvisorConfig:
    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    cgroup_kube_dir: str = DEFAULT_KUBE_DIR
    cgroup_driver: str | None = None  # None: detected per hierarchy
    collect_res_used_interval: float = 1.0
    collect_sys_metric_outdated_interval: float = 10.0
    collect_node_cpu_info_interval: float = 60.0
    psi_collector_interval: float = 10.0
    enable_pagecache_collector: bool = False
    psi_collector: bool = False


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The advisor's flags. ``--sys-root-dir`` is added only when the parser lacks it; the
    cgroup and proc roots, the cgroup driver and kube dir are read from the koordlet's own."""
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
    if "--sys-root-dir" not in parser._option_string_actions:  # noqa: SLF001 - shared flag
        group.add_argument("--sys-root-dir", type=Path, default=Path("/sys"), metavar="DIR",
                           help="host /sys: CPU topology, NUMA nodes (default: %(default)s)")


def from_args(args: argparse.Namespace) -> AdvisorConfig:
    gates = getattr(args, "feature_gates", None) or {}
    driver = getattr(args, "cgroup_driver", None)
    return AdvisorConfig(
        cgroup_root=Path(getattr(args, "cgroup_root_dir", "/sys/fs/cgroup")),
        proc_root=Path(getattr(args, "proc_root_dir", "/proc")),
        sys_root=Path(getattr(args, "sys_root_dir", "/sys")),
        cgroup_kube_dir=getattr(args, "cgroup_kube_dir", DEFAULT_KUBE_DIR) or DEFAULT_KUBE_DIR,
        cgroup_driver=None if driver in (None, "auto") else driver,
        collect_res_used_interval=args.collect_res_used_interval,
        collect_sys_metric_outdated_interval=args.collect_sys_metric_outdated_interval,
        collect_node_cpu_info_interval=args.collect_node_cpu_info_interval,
        psi_collector_interval=args.psi_collector_interval,
        enable_pagecache_collector=args.enable_pagecache_collector,
        psi_collector=bool(gates.get(PSI_COLLECTOR, ADVISOR_FEATURE_GATES[PSI_COLLECTOR])),
    )
