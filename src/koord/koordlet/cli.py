"""The ``koordlet`` command: runs the runtime-hooks module on a node.

Both working modes run at once, as upstream koordlet does: the hook server answers the
proxy (Proxy mode) and the reconciler writes the cgroups of running pods every
``--runtime-hooks-reconcile-interval`` (Standalone mode; ``0`` turns it off). Without
a proxy the registration file is simply never read.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from koord import rlimits
from koord.hookapi import FailurePolicy, HookPoint, Registration, parse_duration, unix_socket_path

from .runtimehooks.executor import CgroupExecutor
from .runtimehooks.hooks import Hooks, PluginEnv, RuntimePlugin
from .runtimehooks.plugins import DEFAULT_FEATURE_GATES, build_plugins, parse_feature_gates
from .runtimehooks.reconciler import Reconciler
from .runtimehooks.rule import RuleError, parse_rules
from .runtimehooks.server import Network, RuntimeHookServer
from .statesinformer import FileStatesInformer, KubeStatesInformer, StatesInformer, in_cluster

log = logging.getLogger("koordlet")

REGISTRATION_NAME = "koordlet"
DEFAULT_ADDR = "/var/run/koordlet/koordlet.sock"
DEFAULT_CONFIG_PATH = "/etc/runtime/hookserver.d"
DEFAULT_CONTAINERD = "/var/run/containerd/containerd.sock"



def go_duration(text: str) -> float:
    """Seconds from a Go duration ("10s", "500ms", "1m30s", "0"), for argparse."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; 0 disables") from None


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


def choice(*allowed: str):
    def check(text: str) -> str:
        """argparse's ``choices`` would print the choices twice with a metavar; this names them once."""
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r}: want one of {', '.join(allowed)}")
        return text
    return check


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no such directory")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="koordlet",
        description="koordlet's runtime-hooks module: serves runtime.v1alpha1 hooks to "
        "koord-runtime-proxy and reconciles the cgroups of running pods.")
    a = p.add_argument
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
      "e.g. PreStartContainer,PostStopContainer")
    a("--runtime-hooks-reconcile-interval", type=go_duration, default=10.0, metavar="DURATION",
      help="Standalone reconcile period, e.g. 10s, 500ms; 0 disables (default: 10s)")
    a("--cgroup-root-dir", type=existing_dir, default=Path("/sys/fs/cgroup/"), metavar="DIR",
      help="cgroup root (default: %(default)s)")
    a("--cgroup-driver", type=choice("cgroupfs", "systemd", "auto"), default="auto",
      metavar="cgroupfs|systemd|auto",
      help="cgroupfs, systemd or auto (from each pod's cgroup parent) (default: %(default)s)")
    a("--sys-fs-root-dir", type=Path, default=Path("/sys/fs"), metavar="DIR",
      help="host /sys/fs; resctrl lives under <it>/resctrl (default: %(default)s)")
    a("--proc-root-dir", type=Path, default=Path("/proc"), metavar="DIR", help="procfs root (default: %(default)s)")
    a("--feature-gates", type=feature_gates, default=dict(DEFAULT_FEATURE_GATES), metavar="GATES",
      help="plugin gates, e.g. GPUEnvInject=true,Resctrl=false (defaults: "
      + ",".join(f"{k}={str(v).lower()}" for k, v in DEFAULT_FEATURE_GATES.items()) + ")")
    a("--node-slo-file", type=Path, default=None, metavar="FILE",
      help="NodeSLO object (YAML or JSON), watched for changes")
    a("--node-file", type=Path, default=None, metavar="FILE",
      help="Node object (YAML or JSON) for node annotations, watched for changes")
    a("--containerd-endpoint", type=socket_path, default=DEFAULT_CONTAINERD, metavar="SOCKET",
      help="CRI socket the reconciler lists pods from (default: %(default)s)")
    a("--log-level", type=choice("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO",
      metavar="LEVEL",
      help="(default: %(default)s)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.runtime_hooks_network == Network.UNIX:
        try:
            args.runtime_hooks_addr = socket_path(args.runtime_hooks_addr)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument --runtime-hooks-addr: {exc}")
    elif not re.fullmatch(r".*:[0-9]{1,5}", args.runtime_hooks_addr):
        parser.error(f"argument --runtime-hooks-addr: {args.runtime_hooks_addr!r}: "
                     "want host:port with --runtime-hooks-network=tcp")
    return args


@dataclass
class Koordlet:
    """The runtime-hooks module assembled from flags; start() and stop() own every thread."""

    args: argparse.Namespace

    def __post_init__(self) -> None:
        a = self.args
        driver = None if a.cgroup_driver == "auto" else a.cgroup_driver
        self.executor = CgroupExecutor(a.cgroup_root_dir, driver=driver)
        env = PluginEnv(executor=self.executor, sys_fs_root=a.sys_fs_root_dir,
                        proc_root=a.proc_root_dir)
        self.plugins: list[RuntimePlugin] = build_plugins(env, a.feature_gates)
        self.hooks = Hooks(a.runtime_hooks_plugin_failure_policy)
        for plugin in self.plugins:
            plugin.register(self.hooks)
        self.server = RuntimeHookServer(
            self.hooks, network=a.runtime_hooks_network, addr=a.runtime_hooks_addr,
            executor=self.executor, disabled_stages=a.runtime_hooks_disable_stages)
        self.reconciler = (Reconciler(self.hooks, self.executor, self.plugins,
                                      a.containerd_endpoint, a.runtime_hooks_reconcile_interval)
                           if a.runtime_hooks_reconcile_interval > 0 else None)
        defaults = parse_rules(None, None)
        for plugin in self.plugins:
            plugin.update_rules(defaults)
        self.informer = self._make_informer()
        self.registration: Registration | None = None

    def _make_informer(self) -> StatesInformer | None:
        a = self.args
        if a.node_slo_file or a.node_file:
            return FileStatesInformer(self.apply_rules, node_slo_file=a.node_slo_file,
                                      node_file=a.node_file)
        if in_cluster():
            node_name = os.environ.get("NODE_NAME")
            if node_name:
                return KubeStatesInformer(self.apply_rules, node_name=node_name)
            log.error("in a cluster but NODE_NAME is not set: using default rules")
        else:
            log.info("no --node-slo-file/--node-file and not in a cluster: using default rules")
        return None

    def apply_rules(self, node_slo: dict | None, node: dict | None) -> None:
        """Rule callback: new NodeSLO/Node → every plugin's rules → refresh existing pods."""
        try:
            rules = parse_rules(node_slo, node)
        except RuleError as exc:
            log.error("rules from NodeSLO/Node rejected, keeping the current rules: %s", exc)
            return
        changed = [p.name for p in self.plugins if p.update_rules(rules)]
        if changed and self.reconciler is not None:
            log.info("rules changed for %s: refreshing existing pods", ", ".join(changed))
            self.reconciler.reconcile_now()

    def start(self) -> None:
        log.info("plugins: %s", ", ".join(p.name for p in self.plugins) or "none")
        if self.informer is not None:
            self.informer.start()
        self.server.start()
        a = self.args
        self.registration = Registration.of(
            REGISTRATION_NAME, a.runtime_hooks_host_endpoint or self.server.endpoint,
            a.runtime_hooks_failure_policy, self.server.stages())
        self.registration.write(a.runtime_hooks_config_path)
        if self.reconciler is not None:
            self.reconciler.start()

    def stop(self) -> None:
        """Unregisters first so the proxy stops calling, then stops serving."""
        if self.registration is not None:
            self.registration.remove(self.args.runtime_hooks_config_path)
            self.registration = None
        self.server.stop()
        if self.reconciler is not None:
            self.reconciler.stop()
        if self.informer is not None:
            self.informer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rlimits.raise_open_file_limit()
    stopping = threading.Event()

    def on_signal(signum: int, _frame) -> None:
        log.info("%s received: shutting down", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        koordlet = Koordlet(args)
    except (OSError, ValueError) as exc:
        log.error("koordlet cannot start: %s", exc)
        return 1
    try:
        koordlet.start()
        stopping.wait()
    except (OSError, ValueError) as exc:
        log.error("koordlet cannot start: %s", exc)
        return 1
    finally:
        koordlet.stop()
    log.info("koordlet stopped")
    return 0
