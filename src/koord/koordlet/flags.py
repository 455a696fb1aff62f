"""koordlet's command line: upstream's flag names and defaults, plus each module's own flags."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from koord.commonflags import log_level, version_text
from koord.hookapi import FailurePolicy, HookPoint, unix_socket_path

from . import goflags, metriccache, metricsadvisor, prediction, qosmanager, upstreamflags
from .cgrouplayout import DEFAULT_ROOT, KUBE_DIR
from .features import ALL_GATE_DEFAULTS, parse_feature_gates
from .flagtypes import choice, flag_bool, go_duration, port_number
from .hostpaths import CONTAINERD_SOCKET, PROC_ROOT, SYS_FS_ROOT
from .runtimehooks import nri
from .runtimehooks.server import Network

DEFAULT_ADDR = "/var/run/koordlet/koordlet.sock"
DEFAULT_CONFIG_PATH = "/etc/runtime/hookserver.d"


def failure_policy(text: str) -> FailurePolicy:
    try:
        return FailurePolicy(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want Fail or Ignore") from None


def stage_list(text: str) -> frozenset[HookPoint]:
    stages = set()
    for name in filter(None, (s.strip() for s in text.split(","))):
        try:
            stages.add(HookPoint(name))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"unknown stage {name!r}; stages: {', '.join(s.value for s in HookPoint)}") from None
    return frozenset(stages)


def feature_gates(text: str) -> dict[str, bool]:
    try:
        return parse_feature_gates(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def socket_path(text: str) -> str:
    try:
        return unix_socket_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no such directory")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="koordlet", allow_abbrev=False,
        description="Koordinator's node agent: reads this node's Node, NodeSLO, NodeMetric and pods "
        "(states informer), collects node and pod usage into a metric cache (metrics advisor), reports "
        "the NodeMetric status, suppresses and evicts best-effort pods (QoS manager), and sets pods' "
        "cgroups through runtime hooks served to koord-runtime-proxy and a reconciler. Flags are "
        "upstream's and parse as Go's flag package does: -name=value, -name value, --name=value, "
        "booleans as -name or -name=false.")
    a = p.add_argument
    a("--version", type=flag_bool, nargs="?", const=True, default=False, metavar="BOOL",
      help="print this koordlet's version and the upstream version it follows, then exit (default: false)")
    a("--runtime-hooks-network", type=choice(Network.UNIX, Network.TCP), default=Network.UNIX,
      metavar="unix|tcp",
      help="unix or tcp (default: %(default)s)")
    a("--runtime-hooks-addr", default=DEFAULT_ADDR, metavar="ADDR",
      help="socket path (unix) or host:port (tcp) to serve on (default: %(default)s)")
    a("--runtime-hooks-host-endpoint", default=None, metavar="ENDPOINT",
      help="endpoint written into the registration, as the proxy reaches it "
      "(default: the serving address)")
    a("--runtime-hooks-config-path", type=Path, default=Path(DEFAULT_CONFIG_PATH), metavar="DIR",
      help="hook config dir of the proxy, where koordlet.json is written (default: %(default)s)")
    a("--runtime-hooks-failure-policy", type=failure_policy, default=FailurePolicy.IGNORE,
      metavar="Fail|Ignore",
      help="what the proxy does when koordlet fails: Fail or Ignore (default: Ignore)")
    a("--runtime-hooks-plugin-failure-policy", type=failure_policy, default=FailurePolicy.IGNORE,
      metavar="Fail|Ignore",
      help="Fail: stop at the first failing plugin and fail the hook; Ignore: run the rest "
      "(default: Ignore)")
    a("--runtime-hooks-disable-stages", type=stage_list, default=frozenset(), metavar="STAGES",
      help="comma-separated stages answered with no changes and not registered, "
      "e.g. PreStartContainer,PostStopContainer (default: none)")
    a("--runtime-hooks-reconcile-interval", type=go_duration, default=10.0, metavar="DURATION",
      help="Standalone reconcile period, e.g. 10s, 500ms; 0 disables (default: 10s)")
    a("--cgroup-root-dir", type=existing_dir, default=DEFAULT_ROOT, metavar="DIR",
      help="cgroup root (default: %(default)s)")
    a("--cgroup-driver", type=choice("cgroupfs", "systemd", "auto"), default="auto",
      metavar="cgroupfs|systemd|auto",
      help="cgroupfs, systemd or auto (from each pod's cgroup parent) (default: %(default)s)")
    a("--sys-fs-root-dir", type=Path, default=SYS_FS_ROOT, metavar="DIR",
      help="host /sys/fs; resctrl lives under <it>/resctrl (default: %(default)s)")
    a("--proc-root-dir", type=Path, default=PROC_ROOT, metavar="DIR", help="procfs root (default: %(default)s)")
    a("--feature-gates", type=feature_gates, default=dict(ALL_GATE_DEFAULTS), metavar="GATES",
      help="upstream's gates, e.g. AllAlpha=true,AllBeta=true,Resctrl=false; gates without a feature "
      "here are accepted with a warning (defaults: "
      + ",".join(f"{k}={str(v).lower()}" for k, v in ALL_GATE_DEFAULTS.items()) + ")")
    a("--node-slo-file", type=Path, default=None, metavar="FILE",
      help="NodeSLO object (YAML or JSON), watched for changes (default: none: from the API server)")
    a("--node-file", type=Path, default=None, metavar="FILE",
      help="Node object (YAML or JSON) for node annotations, watched for changes (default: none)")
    a("--node-metric-file", type=Path, default=None, metavar="FILE",
      help="NodeMetric object (YAML or JSON): its spec is read, its status rewritten each "
      "report interval (without an API server) (default: none)")
    a("--enable-node-metric-report", type=flag_bool, default=True, nargs="?", const=True,
      metavar="BOOL", help="write the NodeMetric status (default: true)")
    a("--kubeconfig", type=Path, default=None, metavar="FILE",
      help="kubeconfig for the API server (default: $KUBECONFIG, else the in-cluster config when "
      "KUBERNETES_SERVICE_HOST is set)")
    a("--cgroup-kube-dir", default=KUBE_DIR + "/", metavar="DIR",
      help="pod cgroups' root under each cgroup subsystem (default: %(default)s; "
      "kubepods.slice with the systemd driver)")
    a("--kubelet-sync-interval", type=go_duration, default=10.0, metavar="DURATION",
      help="how often the pod list is refreshed (default: 10s)")
    a("--pods-source", type=choice("auto", "cri", "kubelet"), default="auto", metavar="auto|cri|kubelet",
      help="where pods come from: kubelet's /pods at the Node's address (upstream's source; needs the "
      "Node object), the CRI endpoint (works without an API server), or auto: kubelet when the Node "
      "comes from an API server, else cri (default: %(default)s)")
    a("--kubelet-preferred-address-type", default="InternalIP", metavar="TYPE",
      help="Node address type used to reach kubelet (default: %(default)s)")
    a("--kubelet-sync-timeout", type=go_duration, default=3.0, metavar="DURATION",
      help="timeout of one kubelet /pods request (default: 3s)")
    a("--kubelet-insecure-tls", type=flag_bool, default=False, nargs="?", const=True, metavar="BOOL",
      help="use kubelet's read-only port over plain HTTP (default: false)")
    a("--kubelet-read-only-port", type=port_number, default=10255, metavar="PORT",
      help="kubelet's read-only port (default: %(default)s)")
    a("--var-lib-kubelet-dir", type=Path, default=Path("/var/lib/kubelet/"), metavar="DIR",
      help="the kubelet's root dir: its cpu_manager_state gives the static CPU allocations "
      "(default: %(default)s)")
    a("--node-topology-sync-interval", type=go_duration, default=3.0, metavar="DURATION",
      help="how often the NodeResourceTopology is computed and, with the NodeTopologyReport gate, "
      "reported; 0 disables (default: 3s)")
    a("--disable-unset-cpu-quota", type=flag_bool, default=False, nargs="?", const=True, metavar="BOOL",
      help="CPUSetAllocator leaves the cfs quota of pods bound to a scheduler-allocated cpuset "
      "(default: false: their pod and container quota is set to -1)")
    a("--disable-query-kubelet-config", type=flag_bool, default=False, nargs="?", const=True, metavar="BOOL",
      help="do not read the kubelet's /configz: no CPU manager policy in the NodeResourceTopology "
      "(default: false)")
    a("--node-topology-file", type=Path, default=None, metavar="FILE",
      help="standalone mode: write this node's NodeResourceTopology to this file (YAML) instead of "
      "the API server (default: none)")
    a("--containerd-endpoint", type=socket_path, default=CONTAINERD_SOCKET, metavar="SOCKET",
      help="CRI socket the reconciler lists pods from (default: %(default)s)")
    a("--addr", default=":9316", metavar="HOST:PORT",
      help="serve Prometheus /metrics, /healthz and /readyz here; empty disables "
      "(default: %(default)s)")
    a("--log-level", type=log_level, default=None, metavar="debug|info|warning|error",
      help="log verbosity, any case (default: info, or debug with --v=4 and above)")
    metriccache.add_flags(p)
    metricsadvisor.add_flags(p)
    qosmanager.add_flags(p)
    prediction.add_flags(p)
    nri.add_flags(p)
    upstreamflags.add_flags(p)
    upstreamflags.apply_agent_mode(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Go-style command line (``goflags``) -> argparse namespace; exits 2 naming a bad flag.

    ``args.unparsed`` keeps what followed the flags (Go stops at the first non-flag)."""
    parser = build_parser()
    known = goflags.known_flags(parser)
    try:
        pairs, rest = goflags.parse(sys.argv[1:] if argv is None else argv, known)
    except goflags.GoFlagError as exc:
        parser.error(str(exc))
    args = parser.parse_args(goflags.to_argparse(pairs, known, store_true=frozenset({"help"})))
    args.unparsed = rest
    for refused in upstreamflags.refused_flags(args):
        parser.error(refused)
    if args.version:
        print(version_text("koordlet"))
        parser.exit(0)
    if args.runtime_hooks_network == Network.UNIX:
        try:
            args.runtime_hooks_addr = socket_path(args.runtime_hooks_addr)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument --runtime-hooks-addr: {exc}")
    elif not re.fullmatch(r".*:[0-9]{1,5}", args.runtime_hooks_addr):
        parser.error(f"argument --runtime-hooks-addr: {args.runtime_hooks_addr!r}: "
                     "want host:port with --runtime-hooks-network=tcp")
    return args
