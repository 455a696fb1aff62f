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
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from koord import rlimits
from koord.hookapi import FailurePolicy, HookPoint, Registration, parse_duration, unix_socket_path

from ..runtimeproxy.metrics import HealthServer
from . import metriccache, metricsadvisor, qosmanager
from .metrics import KoordletMetrics
from .resourceexecutor.executor import CgroupExecutor
from .resourceexecutor.updater import ResourceExecutor
from .runtimehooks.hooks import Hooks, PluginEnv, RuntimePlugin
from .runtimehooks.plugins import DEFAULT_FEATURE_GATES, build_plugins, parse_feature_gates
from .runtimehooks.reconciler import Reconciler
from .runtimehooks.rule import RuleError, parse_rules
from .runtimehooks.server import Network, RuntimeHookServer
from .statesinformer import (
    NODE,
    NODE_METRIC,
    NODE_SLO,
    CriPodsSource,
    FileObjectsSource,
    KubeObjectsSource,
    StatesInformer,
    in_cluster,
)
from .statesinformer.kubelet import KubeletPodsSource
from .statesinformer.meta import DEFAULT_KUBE_DIR
from .statesinformer.reporter import (
    FileStatusWriter,
    KubeStatusWriter,
    NodeMetricReporter,
    StatusWriter,
)

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


def flag_bool(text: str) -> bool:
    """Go's flag.Bool spellings."""
    value = text.strip().lower()
    if value in ("1", "t", "true"):
        return True
    if value in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: want true or false")


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: want a port in 1-65535")
    return int(text)


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
    a("--node-metric-file", type=Path, default=None, metavar="FILE",
      help="NodeMetric object (YAML or JSON): its spec is read, its status rewritten each "
      "report interval (without an API server)")
    a("--enable-node-metric-report", type=flag_bool, default=True, nargs="?", const=True,
      metavar="BOOL", help="write the NodeMetric status (default: true)")
    a("--kubeconfig", type=Path, default=None, metavar="FILE",
      help="kubeconfig for the API server (default: in-cluster config when "
      "KUBERNETES_SERVICE_HOST is set)")
    a("--cgroup-kube-dir", default=DEFAULT_KUBE_DIR, metavar="DIR",
      help="pod cgroups' root under each cgroup subsystem (default: %(default)s; "
      "kubepods.slice with the systemd driver)")
    a("--kubelet-sync-interval", type=go_duration, default=10.0, metavar="DURATION",
      help="how often the pod list is refreshed (default: 10s)")
    a("--pods-source", type=choice("cri", "kubelet"), default="cri", metavar="cri|kubelet",
      help="where pods come from: the CRI endpoint (works on any node) or kubelet's /pods "
      "(needs the Node object) (default: %(default)s)")
    a("--kubelet-preferred-address-type", default="InternalIP", metavar="TYPE",
      help="Node address type used to reach kubelet (default: %(default)s)")
    a("--kubelet-sync-timeout", type=go_duration, default=3.0, metavar="DURATION",
      help="timeout of one kubelet /pods request (default: 3s)")
    a("--kubelet-insecure-tls", type=flag_bool, default=False, nargs="?", const=True, metavar="BOOL",
      help="use kubelet's read-only port over plain HTTP (default: false)")
    a("--kubelet-read-only-port", type=port_number, default=10255, metavar="PORT",
      help="kubelet's read-only port (default: %(default)s)")
    a("--containerd-endpoint", type=socket_path, default=DEFAULT_CONTAINERD, metavar="SOCKET",
      help="CRI socket the reconciler lists pods from (default: %(default)s)")
    a("--addr", default=":9316", metavar="HOST:PORT",
      help="serve Prometheus /metrics, /healthz and /readyz here; empty disables "
      "(default: %(default)s)")
    a("--log-level", type=choice("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO",
      metavar="LEVEL",
      help="(default: %(default)s)")
    metriccache.add_flags(p)
    metricsadvisor.add_flags(p)
    qosmanager.add_flags(p)
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
        self.executor = ResourceExecutor(a.cgroup_root_dir, driver=driver, kube_dir=a.cgroup_kube_dir)
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
        self.metrics = KoordletMetrics(node_name())
        self.informer = make_states_informer(a)
        self.informer.register_callback(NODE, self.apply_rules)
        self.informer.register_callback(NODE_SLO, self.apply_rules)
        self.registration: Registration | None = None
        self.health: HealthServer | None = None
        self.metric_cache: metriccache.MetricCache | None = None
        self.reporter: NodeMetricReporter | None = None
        self.advisor: metricsadvisor.MetricsAdvisor | None = None
        self.qos_manager: qosmanager.QOSManager | None = None

    def apply_rules(self) -> None:
        """Rule callback: new NodeSLO/Node → every plugin's rules → refresh existing pods."""
        try:
            rules = parse_rules(self.informer.get_node_slo_object(), self.informer.get_node())
        except RuleError as exc:
            log.error("rules from NodeSLO/Node rejected, keeping the current rules: %s", exc)
            return
        changed = [p.name for p in self.plugins if p.update_rules(rules)]
        if changed and self.reconciler is not None:
            log.info("rules changed for %s: refreshing existing pods", ", ".join(changed))
            self.reconciler.reconcile_now()

    def start(self) -> None:
        """Starts the modules in upstream's order: resource executor, metric cache, states
        informer (with the NodeMetric reporter), metrics advisor, QoS manager, runtime hooks.

        A module that cannot start logs why, shows 0 in ``koordlet_module_up`` and the
        others go on; nothing waits for a NodeSLO. Only the hook server failing to listen
        ends the process (OSError), as before: the proxy could not reach koordlet at all.
        """
        self._serve_metrics()
        self.metrics.set_module("resource-executor", True)  # built in __post_init__
        self.metric_cache = self._run_module("metric-cache", lambda: metriccache.from_args(self.args))
        self._run_module("states-informer", self.informer.start)
        self._start_reporter()
        self._start_advisor()
        self.qos_manager = self._run_module("qos-manager", self._start_qos_manager)
        self._start_runtime_hooks()

    def _run_module(self, name: str, start):
        try:
            result = start()
        except Exception as exc:
            log.error("module %s cannot start: %s; the other modules go on", name, exc)
            self.metrics.set_module(name, False)
            return None
        self.metrics.set_module(name, True)
        return result

    def _serve_metrics(self) -> None:
        if not self.args.addr:
            return
        try:
            self.health = HealthServer(self.args.addr, self.metrics, self._ready)
            self.health.start()
        except (OSError, ValueError) as exc:
            log.error("cannot serve Prometheus metrics on --addr %s: %s; going on without",
                      self.args.addr, exc)
            self.health = None

    def _ready(self) -> tuple[bool, str]:
        if not self.informer.has_synced():
            return False, "states informer has not synced yet"
        return True, ""

    def _start_reporter(self) -> None:
        writer = self._status_writer()
        if writer is None:
            return
        if self.metric_cache is None:
            log.error("module nodemetric-reporter cannot start: no metric cache")
            self.metrics.set_module("nodemetric-reporter", False)
            return
        self.reporter = NodeMetricReporter(self.informer, self.metric_cache, writer, self.metrics)
        self._run_module("nodemetric-reporter", self.reporter.start)

    def _status_writer(self) -> StatusWriter | None:
        a = self.args
        if not a.enable_node_metric_report:
            log.info("NodeMetric reporting disabled (--enable-node-metric-report=false)")
            return None
        if a.node_metric_file is not None:
            return FileStatusWriter(a.node_metric_file)
        if isinstance(self.informer.objects, KubeObjectsSource):
            return KubeStatusWriter(self.informer.objects.api, self.informer.objects.node_name)
        log.info("no --node-metric-file and no API server: NodeMetric is not reported")
        return None

    def _start_qos_manager(self) -> qosmanager.QOSManager:
        if self.metric_cache is None:
            raise RuntimeError("no metric cache")
        api = self.informer.objects.api if isinstance(self.informer.objects, KubeObjectsSource) else None
        manager = qosmanager.QOSManager(
            qosmanager.QOSConfig.from_args(self.args, node_name=node_name()), self.informer,
            self.metric_cache, self.executor, registry=self.metrics.registry, api_client=api)
        manager.start()
        return manager

    def _start_advisor(self) -> None:
        if self.metric_cache is None:
            log.error("module metrics-advisor cannot start: no metric cache")
            self.metrics.set_module("metrics-advisor", False)
            return
        cache = self.metric_cache

        def start() -> metricsadvisor.MetricsAdvisor:
            advisor = metricsadvisor.MetricsAdvisor(metricsadvisor.from_args(self.args),
                                                    self.informer, cache)
            advisor.start()
            return advisor
        self.advisor = self._run_module("metrics-advisor", start)

    def _start_runtime_hooks(self) -> None:
        log.info("plugins: %s", ", ".join(p.name for p in self.plugins) or "none")
        self.server.start()
        a = self.args
        self.registration = Registration.of(
            REGISTRATION_NAME, a.runtime_hooks_host_endpoint or self.server.endpoint,
            a.runtime_hooks_failure_policy, self.server.stages())
        self.registration.write(a.runtime_hooks_config_path)
        if self.reconciler is not None:
            self.reconciler.start()
        self.metrics.set_module("runtime-hooks", True)

    def stop(self) -> None:
        """Reverse order. Unregisters first so the proxy stops calling, then stops serving."""
        if self.registration is not None:
            self.registration.remove(self.args.runtime_hooks_config_path)
            self.registration = None
        self.server.stop()
        if self.reconciler is not None:
            self.reconciler.stop()
        if self.qos_manager is not None:
            self.qos_manager.stop()
        if self.advisor is not None:
            self.advisor.stop()
        if self.reporter is not None:
            self.reporter.stop()
        self.informer.stop()
        if self.metric_cache is not None:
            self.metric_cache.close()
            self.metric_cache = None
        if self.health is not None:
            self.health.stop()
            self.health = None


def make_states_informer(a: argparse.Namespace) -> StatesInformer:
    """Objects from files when any file flag is given, else from the API server when
    there is one; pods from CRI or kubelet (``--pods-source``)."""
    driver = None if a.cgroup_driver == "auto" else a.cgroup_driver
    files = {kind: path for kind, path in ((NODE, a.node_file), (NODE_SLO, a.node_slo_file),
                                           (NODE_METRIC, a.node_metric_file)) if path}
    objects: FileObjectsSource | KubeObjectsSource | None = None
    if files:
        objects = FileObjectsSource(files)
    elif a.kubeconfig or in_cluster():
        name = os.environ.get("NODE_NAME")
        if not name:
            log.error("an API server is configured but NODE_NAME is not set: no Node, "
                      "NodeSLO or NodeMetric; using defaults")
        else:
            try:
                objects = KubeObjectsSource(kube_api_client(a.kubeconfig), name)
            except Exception as exc:  # bad kubeconfig, no service account, no kubernetes package
                log.error("cannot reach the API server: %s; no Node, NodeSLO or NodeMetric; "
                          "using defaults", exc)
    else:
        log.info("no --node-slo-file/--node-file/--node-metric-file and not in a cluster: "
                 "using defaults")
    informer = StatesInformer(objects=objects, pods_interval=a.kubelet_sync_interval)
    if a.pods_source == "kubelet":
        informer.pods_source = KubeletPodsSource(
            informer.get_node, kube_dir=a.cgroup_kube_dir,
            driver=driver or CgroupExecutor(a.cgroup_root_dir)._driver_for(None),  # the tree kubelet made
            address_type=a.kubelet_preferred_address_type, insecure_tls=a.kubelet_insecure_tls,
            read_only_port=a.kubelet_read_only_port, timeout=a.kubelet_sync_timeout)
    else:
        informer.pods_source = CriPodsSource(a.containerd_endpoint, kube_dir=a.cgroup_kube_dir,
                                             driver=driver)
    return informer


def node_name() -> str:
    """``NODE_NAME`` as upstream requires it in a cluster; the host name without one."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def kube_api_client(kubeconfig: Path | None):
    from kubernetes import client, config

    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    config.load_incluster_config()
    return client.ApiClient()


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
