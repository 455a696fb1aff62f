"""Upstream koordlet's flags that have no feature here, klog's flags, and the DaemonSet
defaults of upstream's ``agent_mode``.

Upstream's DaemonSet passes flags for features this koordlet does not build (audit,
TSDB tuning, ...). Each is accepted with its Go type checked, so a manifest
written for upstream starts, and one warning names the ones given. klog's flags map onto
Python logging: ``-v`` >= 4 is DEBUG, ``-logtostderr=false`` writes to ``-log_file`` or
``-log_dir``, ``-stderrthreshold`` bounds what reaches stderr, ``-skip_headers`` drops the
time/level prefix.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from koord.hookapi import parse_duration

from .flagtypes import flag_bool

BOOL, INT, UINT, FLOAT, DURATION, STRING, MAP = "bool", "int", "uint", "float", "duration", "string", "map"

NOT_IMPLEMENTED: dict[str, tuple[str, str]] = {
    "configmap-name": (STRING, "koordlet-config"),
    "configmap-namespace": (STRING, "koordinator-system"),
    "run-root-dir": (STRING, "/host-run/"),
    "docker-endpoint": (STRING, ""),
    "pouch-endpoint": (STRING, ""),
    "default-runtime-type": (STRING, "containerd"),
    "hami-core-library-directory-path": (STRING, "/usr/local/vgpu/libvgpu.so"),
    "pod-resources-proxy-path": (STRING, "/var/run/koordlet/pod-resources"),
    "xpu-device-infos-dir": (STRING, "/var/run/koordlet/xpu-device-infos/"),
    "report-interval": (DURATION, "0s"),
    "enable-pod-taskids": (BOOL, "false"),
    "xpu-enforce-collect-from-device-infos": (BOOL, "false"),
    "collect-node-storage-info-interval": (DURATION, "1s"),
    "cpi-collector-interval": (DURATION, "1m0s"),
    "collect-cpi-timewindow": (DURATION, "10s"),
    "coldpage-collector-interval": (DURATION, "5s"),
    "metric-gc-interval-seconds": (INT, "300"),
    "metric-expire-seconds": (INT, "1800"),
    "tsdb-enable-prometheus-metric": (BOOL, "true"),
    "tsdb-stripe-size": (INT, "16384"),
    "tsdb-wal-segment-size": (INT, "1048576"),
    "tsdb-max-block-chunk-segment-size": (INT, "5242880"),
    "tsdb-min-block-duration": (DURATION, "10m0s"),
    "tsdb-max-block-duration": (DURATION, "10m0s"),
    "tsdb-head-chunks-write-buffer-size": (INT, "1048576"),
    "qos-extension-plugins": (MAP, ""),
    "audit-log-dir": (STRING, "/var/log/koordlet"),
    "audit-verbose": (INT, "3"),
    "audit-max-disk-space-mb": (INT, "16"),
    "audit-max-concurrent-readers": (INT, "4"),
    "audit-max-events-limit": (INT, "2048"),
    "resource-force-update-seconds": (INT, "60"),
    "enable-pprof": (BOOL, "false"),
    "pprof-addr": (STRING, ":9317"),
    "kube-api-qps": (FLOAT, "20"),
    "kube-api-burst": (INT, "30"),
    # klog flags without a counterpart here
    "vmodule": (STRING, ""),
    "log_backtrace_at": (STRING, ":0"),
    "add_dir_header": (BOOL, "false"),
    "one_output": (BOOL, "false"),
    "log_file_max_size": (UINT, "1800"),
    "legacy_stderr_threshold_behavior": (BOOL, "false"),
}
"""Upstream flag name -> (Go type, upstream default)."""

SEVERITIES = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
              "FATAL": logging.CRITICAL, "0": logging.INFO, "1": logging.WARNING, "2": logging.ERROR,
              "3": logging.CRITICAL}
DEBUG_VERBOSITY = 4
"""klog ``-v`` from which koordlet logs at DEBUG (upstream logs each hook call at V(4) and up)."""


def _go_int(text: str, unsigned: bool = False) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want an integer") from None
    if unsigned and value < 0 or not -(2**63) <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: out of range")
    return value


def _go_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want a number") from None


def _go_duration(text: str) -> str:
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _verbosity(text: str) -> int:
    value = _go_int(text)
    if not 0 <= value <= 2**31:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want a level >= 0")
    return value


def _severity(text: str) -> int:
    try:
        return SEVERITIES[text.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want INFO, WARNING, ERROR or FATAL") from None


_TYPES: dict[str, Callable[[str], Any]] = {
    BOOL: flag_bool, INT: _go_int, UINT: lambda t: _go_int(t, unsigned=True), FLOAT: _go_float,
    DURATION: _go_duration, STRING: str, MAP: str}


def add_flags(parser: argparse.ArgumentParser) -> None:
    klog = parser.add_argument_group("klog (upstream's logging flags, mapped onto Python logging)")
    k = klog.add_argument
    k("--v", type=_verbosity, default=0, metavar="LEVEL",
      help=f"log verbosity; >= {DEBUG_VERBOSITY} logs at DEBUG (default: 0); --log-level wins when given")
    k("--logtostderr", type=flag_bool, nargs="?", const=True, default=True, metavar="BOOL",
      help="log to stderr instead of files (default: true)")
    k("--alsologtostderr", type=flag_bool, nargs="?", const=True, default=False, metavar="BOOL",
      help="with --logtostderr=false, log to stderr as well as to the file (default: false)")
    k("--stderrthreshold", type=_severity, default=logging.INFO, metavar="SEVERITY",
      help="lowest severity that reaches stderr: INFO, WARNING, ERROR, FATAL (default: INFO)")
    k("--log_dir", type=Path, default=None, metavar="DIR",
      help="with --logtostderr=false, write koordlet.log here (default: the temp dir)")
    k("--log_file", type=Path, default=None, metavar="FILE",
      help="with --logtostderr=false, write the log to this file (default: none, see --log_dir)")
    for name in ("skip_headers", "skip_log_headers"):
        k(f"--{name}", type=flag_bool, nargs="?", const=True, default=False, metavar="BOOL",
          help="log messages without the time, level and logger prefix (default: false)")
    ignored = parser.add_argument_group(
        "upstream flags without a feature here: accepted, checked and ignored with one warning")
    for name, (kind, default) in NOT_IMPLEMENTED.items():
        extra: dict = {"nargs": "?", "const": True} if kind == BOOL else {}
        ignored.add_argument(f"--{name}", type=_TYPES[kind], default=None, metavar=kind.upper(),
                             help=f"upstream's {kind} flag (default: {default or 'empty'})", **extra)


def ignored_flags(args: argparse.Namespace) -> list[str]:
    """The names of the upstream-only flags that were given."""
    return [name for name in NOT_IMPLEMENTED if getattr(args, name.replace("-", "_")) is not None]


def configure_logging(args: argparse.Namespace) -> None:
    """Python logging as the klog flags (and ``--log-level``, which wins) ask."""
    if args.log_level is not None:
        level = logging.getLevelName(args.log_level.upper())
    else:
        level = logging.DEBUG if args.v >= DEBUG_VERBOSITY else logging.INFO
    prefix = "" if args.skip_headers or args.skip_log_headers else "%(asctime)s %(levelname)s %(name)s: "
    formatter = logging.Formatter(prefix + "%(message)s")
    # klog's INFO is its lowest severity: verbose (DEBUG here) messages are INFO there
    threshold = logging.NOTSET if args.stderrthreshold <= logging.INFO else args.stderrthreshold
    handlers: list[logging.Handler] = []
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(max(level, threshold))
    if not args.logtostderr:
        path = args.log_file or (args.log_dir or Path(tempfile.gettempdir())) / "koordlet.log"
        handlers.append(logging.FileHandler(path))
        if args.alsologtostderr:
            stderr.setLevel(level)
    handlers.append(stderr)
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=handlers, force=True)


DS_MODE, HOST_MODE = "dsMode", "hostMode"
DS_MODE_DEFAULTS = {
    "cgroup_root_dir": "/host-cgroup/",
    "sys_root_dir": Path("/host-sys/"),
    "sys_fs_root_dir": Path("/host-sys-fs/"),
    "runtime_hooks_config_path": Path("/host-etc-hookserver/"),
    "containerd_endpoint": "/host-var-run/containerd/containerd.sock",
    "var_run_root_dir": "/host-var-run/",
    "runtime_hooks_addr": "/host-var-run-koordlet/koordlet.sock",
    "tsdb_path": Path("/metric-data/"),
}
"""Upstream's defaults inside its DaemonSet (``agent_mode`` unset there means dsMode): the
host's directories are mounted under ``/host-*``. Our image sets ``agent_mode=dsMode``;
without it (systemd, a shell) the host paths are the defaults."""


def apply_agent_mode(parser: argparse.ArgumentParser) -> None:
    if os.environ.get("agent_mode") == DS_MODE:
        parser.set_defaults(**DS_MODE_DEFAULTS)
