"""Upstream koordlet's flags that have no feature here, its process-level flags (API client
rate limit, pprof), klog's flags, and the DaemonSet defaults of upstream's ``agent_mode``.

Upstream's DaemonSet passes flags for features this koordlet does not build (TSDB
tuning, ...). Each flag whose value cannot change what koordlet does here is accepted with
its Go type checked, so a manifest written for upstream starts, and one warning names the
ones given (``NOT_IMPLEMENTED``). A flag whose feature is missing here but whose
non-default value would change what upstream does (the audit log, another runtime, ...)
is accepted at its default (and named in the same warning) and refused otherwise, exit 2
with a line naming it (``REFUSED_UNLESS_DEFAULT``). klog's flags map onto
Python logging in klog's format (``koord.klog``): ``-v`` as there, ``-logtostderr=false``
writes to ``-log_file`` or ``-log_dir``, ``-stderrthreshold`` bounds what reaches stderr,
``-skip_headers`` drops the header.
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

from koord import klog
from koord.hookapi import parse_duration

from .flagtypes import flag_bool

BOOL, INT, UINT, FLOAT, DURATION, STRING, MAP = "bool", "int", "uint", "float", "duration", "string", "map"

NOT_IMPLEMENTED: dict[str, tuple[str, str]] = {
    "configmap-name": (STRING, "koordlet-config"),
    "configmap-namespace": (STRING, "koordinator-system"),
    "run-root-dir": (STRING, "/host-run/"),
    "hami-core-library-directory-path": (STRING, "/usr/local/vgpu/libvgpu.so"),
    "pod-resources-proxy-path": (STRING, "/var/run/koordlet/pod-resources"),
    "xpu-device-infos-dir": (STRING, "/var/run/koordlet/xpu-device-infos/"),
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
    # controller-runtime's list caching, registered by a package upstream links in
    "disable-no-deepcopy": (BOOL, "false"),
    # klog flags without a counterpart here
    "vmodule": (STRING, ""),
    "log_backtrace_at": (STRING, ":0"),
    "add_dir_header": (BOOL, "false"),
    "one_output": (BOOL, "false"),
    "log_file_max_size": (UINT, "1800"),
    "legacy_stderr_threshold_behavior": (BOOL, "false"),
}
"""Upstream flag name -> (Go type, upstream default). Why ignoring each changes nothing:
the ConfigMap names are read by no module upstream either; ``run-root-dir`` only locates
sockets that ``--containerd-endpoint`` and ``--var-run-root-dir`` name here; the device
paths (HAMi, pod-resources proxy, XPU) and the CPI, cold-page and storage collectors'
intervals belong to collectors and plugins not built here (their feature gates say so);
``metric-gc-interval-seconds``/``metric-expire-seconds`` are read by nothing upstream;
the TSDB flags tune storage, not the values stored; ``disable-no-deepcopy`` tunes
controller-runtime's list cache, which koordlet does not use; the klog ones shape log
lines only."""

REFUSED_UNLESS_DEFAULT: dict[str, tuple[str, str, str]] = {
    "docker-endpoint": (STRING, "", "Docker is not supported here: only containerd's CRI"),
    "pouch-endpoint": (STRING, "", "PouchContainer is not supported here: only containerd's CRI"),
    "default-runtime-type": (STRING, "containerd", "only containerd is supported here"),
    "report-interval": (DURATION, "0s", "the NodeMetric report interval comes from the NodeMetric "
                        "spec here (collectPolicy.reportIntervalSeconds)"),
    "enable-pod-taskids": (BOOL, "false", "pod task ids are not collected here"),
    "qos-extension-plugins": (MAP, "", "no QoS extension plugin is built here"),
    "audit-log-dir": (STRING, "/var/log/koordlet", "there is no audit log here (QoS actions are "
                      "logged and, for evictions, recorded as pod Events)"),
    "audit-verbose": (INT, "3", "there is no audit log here"),
    "audit-max-disk-space-mb": (INT, "16", "there is no audit log here"),
    "audit-max-concurrent-readers": (INT, "4", "there is no audit log here"),
    "audit-max-events-limit": (INT, "2048", "there is no audit log here"),
}
"""Upstream flag name -> (Go type, upstream default, what is missing here)."""

SEVERITIES = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
              "FATAL": logging.CRITICAL, "0": logging.INFO, "1": logging.WARNING, "2": logging.ERROR,
              "3": logging.CRITICAL}


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


def _go_finite(text: str) -> float:
    value = _go_float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want a finite number")
    return value


def _go_duration(text: str) -> str:
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _severity(text: str) -> int:
    try:
        return SEVERITIES[text.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: want INFO, WARNING, ERROR or FATAL") from None


_TYPES: dict[str, Callable[[str], Any]] = {
    BOOL: flag_bool, INT: _go_int, UINT: lambda t: _go_int(t, unsigned=True), FLOAT: _go_float,
    DURATION: _go_duration, STRING: str, MAP: str}


def add_flags(parser: argparse.ArgumentParser) -> None:
    from .pprof import parse_addr

    proc = parser.add_argument_group("process (upstream's options.go)")
    proc.add_argument("--kube-api-qps", type=_go_finite, default=20.0, metavar="FLOAT",
                      help="requests per second to the API server after the burst; 0 means 5, "
                      "negative means no limit, as client-go (default: 20)")
    proc.add_argument("--kube-api-burst", type=lambda t: _go_int(t, unsigned=True), default=30, metavar="INT",
                      help="requests the API client may send at once; 0 means 10 (default: 30)")
    proc.add_argument("--enable-pprof", type=flag_bool, nargs="?", const=True, default=False, metavar="BOOL",
                      help="serve thread stacks and a heap snapshot on --pprof-addr under /debug/pprof/ "
                      "(default: false)")
    proc.add_argument("--pprof-addr", type=parse_addr, default=("", 9317), metavar="HOST:PORT",
                      help="where --enable-pprof serves (default: :9317)")
    proc.add_argument("--resource-force-update-seconds", type=_go_int, default=60, metavar="INT",
                      help="a cgroup value koordlet wrote or found less than this many seconds ago is "
                      "not written again while unchanged (default: 60)")
    k = parser.add_argument_group(
        "logging: klog's flags (upstream's) and component-base's --logging-format, in klog's formats").add_argument
    klog.add_flags(k)
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
          help="log messages without klog's header (default: false)")
    ignored = parser.add_argument_group(
        "upstream flags without a feature here: accepted, checked and ignored with one warning")
    for name, (kind, default) in NOT_IMPLEMENTED.items():
        extra: dict = {"nargs": "?", "const": True} if kind == BOOL else {}
        ignored.add_argument(f"--{name}", type=_TYPES[kind], default=None, metavar=kind.upper(),
                             help=f"upstream's {kind} flag (default: {default or 'empty'})", **extra)
    refused = parser.add_argument_group(
        "upstream flags without a feature here: accepted at upstream's default (and ignored with "
        "one warning), refused otherwise")
    for name, (kind, default, why) in REFUSED_UNLESS_DEFAULT.items():
        extra = {"nargs": "?", "const": True} if kind == BOOL else {}
        refused.add_argument(f"--{name}", type=_TYPES[kind], default=None, metavar=kind.upper(),
                             help=f"upstream's {kind} flag; {why} (default: {default or 'empty'})", **extra)


def _same(kind: str, value: Any, default: str) -> bool:
    if kind == DURATION:
        return bool(parse_duration(value) == parse_duration(default))
    return bool(value == _TYPES[kind](default))


def refused_flags(args: argparse.Namespace) -> list[str]:
    """One line per upstream-only flag given a value other than upstream's default."""
    out = []
    for name, (kind, default, why) in REFUSED_UNLESS_DEFAULT.items():
        value = getattr(args, name.replace("-", "_"))
        if value is not None and not _same(kind, value, default):
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            out.append(f"argument --{name}: {shown!r:.60} refused: {why}; only upstream's "
                       f"default {default!r} is accepted")
    return out


def ignored_flags(args: argparse.Namespace) -> list[str]:
    """The names of the upstream-only flags that were given (and not refused), sorted."""
    names = list(NOT_IMPLEMENTED) + list(REFUSED_UNLESS_DEFAULT)
    return sorted(name for name in names if getattr(args, name.replace("-", "_")) is not None)


def configure_logging(args: argparse.Namespace) -> None:
    """Python logging as the klog flags (and ``--log-level``, which wins) ask."""
    level = klog.python_level(args.log_level, args.v)
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
    klog.configure(level, handlers, args.logging_format, not (args.skip_headers or args.skip_log_headers))


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
