"""The ``koordlet`` command: the agent's modules assembled from flags (``flags.py``),
started in upstream's order by a ``ModuleStarter`` (``modules.py``) and stopped in reverse.

The agent is one cgroup layout, one resource executor, one set of metrics and one states
informer, shared by the modules; each module reaches the ones it needs through their
``Started`` handle, which holds the running object (or nothing while it is down).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from koord import rlimits
from koord.health import HealthServer

from . import features, metriccache, metricsadvisor, prediction, qosmanager, upstreamflags
from .cgrouplayout import CgroupLayout
from .flags import parse_args
from .metrics import KoordletMetrics
from .metricsadvisor.collectors.resctrl import ResctrlPrometheus
from .metricsadvisor.framework import AdvisorMetrics
from .metricsadvisor.gauges import HostAppGauges, PSIGauges
from .modules import Module, ModuleStarter, Started
from .nodeslocheck import check_node_slo
from .pleg import Pleg
from .pprof import PprofServer
from .ratelimit import limit_client
from .resourceexecutor.updater import CACHE_TTL_SECONDS, ResourceExecutor
from .runtimehooks.module import RuntimeHooksModule
from .runtimehooks.plugins import implemented_gates
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
from .statesinformer.kubelet import KubeletObserver, KubeletPodsSource
from .statesinformer.nrt import FileNRTWriter, KubeNRTWriter, NodeTopologyReporter
from .statesinformer.reporter import (
    FileStatusWriter,
    KubeStatusWriter,
    NodeMetricReporter,
    StatusWriter,
)

log = logging.getLogger("koordlet")


class _Service(Protocol):
    def start(self) -> None: ...


S = TypeVar("S", bound=_Service)


def started(service: S) -> S:
    """``service`` after its ``start`` returned: a module's running object."""
    service.start()
    return service


class Koordlet:
    """The agent assembled from flags; ``start`` and ``stop`` own every thread.

    Modules, in upstream's order: resource executor, metric cache, states informer,
    prediction, NodeMetric reporter and NodeResourceTopology (when enabled), metrics
    advisor, QoS manager, runtime hooks, PLEG. A module that cannot start logs why, shows 0
    in ``koordlet_module_up``, keeps ``/readyz`` failing and is retried with back-off while
    the others go on; nothing waits for a NodeSLO. Only the runtime hooks failing to start
    (their server cannot listen) ends the process: the proxy could not reach koordlet.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        a = self.args = args
        self.layout = CgroupLayout.from_args(a)
        force = max(0, a.resource_force_update_seconds)
        # A cached write must outlive the force-update interval or the interval means nothing.
        self.metrics = KoordletMetrics(node_name())
        self.executor = ResourceExecutor(self.layout, force_update_seconds=force,
                                         cache_ttl=max(CACHE_TTL_SECONDS, 2 * force),
                                         observe_write=self.metrics.record_cgroup_update)
        self.informer = make_states_informer(a, self.layout, self.metrics.record_kubelet_request)
        self.hooks = RuntimeHooksModule(a, self.executor, self.informer, self.metrics)
        self.informer.register_callback(NODE, lambda: self.metrics.record_node_allocatable(self.informer.get_node()))
        self.metric_cache = Started("metric-cache", lambda: metriccache.from_args(a), metriccache.MetricCache.close)
        self.prediction = Started("prediction", self._start_prediction, prediction.PeakPredictServer.stop)
        self.prediction_problems = prediction.report_problems()
        self.qos_manager = Started("qos-manager", self._start_qos_manager, qosmanager.QOSManager.stop)
        modules: list[Module] = [
            Started("resource-executor", lambda: self.executor, lambda _: None),  # built above
            self.metric_cache,
            Started("states-informer", lambda: started(self.informer), StatesInformer.stop, self._informer_ready),
            self.prediction,
            *self._reporter(),
            *self._topology(),
            Started("metrics-advisor", self._start_advisor, metricsadvisor.MetricsAdvisor.stop),
            self.qos_manager,
            self.hooks,
            Started("pleg", self._start_pleg, Pleg.stop),
        ]
        self.modules = ModuleStarter(modules, self.metrics.set_module)
        self.health: HealthServer | None = None
        self.pprof: PprofServer | None = None

    def start(self) -> None:
        """Serves ``/metrics`` and pprof, then starts the modules."""
        self._serve_metrics()
        self._serve_pprof()
        self.modules.start()

    def stop(self) -> None:
        """No module is retried once stopping began; the running ones stop in reverse order
        (the runtime hooks unregister from the proxy before their server stops), then the
        servers around them."""
        self.modules.stop()
        if self.pprof is not None:
            self.pprof.stop()
            self.pprof = None
        if self.health is not None:
            self.health.stop()
            self.health = None

    def _cache(self) -> metriccache.MetricCache:
        """The metric cache for a module that needs it; raises until it runs."""
        cache = self.metric_cache.running
        if cache is None:
            raise RuntimeError("no metric cache (module metric-cache is not running yet)")
        return cache

    def _informer_ready(self) -> str:
        return "" if self.informer.has_synced() else "states informer has not synced yet"

    def _start_prediction(self) -> prediction.PeakPredictServer:
        return started(prediction.PeakPredictServer(prediction.PredictionConfig.from_args(self.args),
                                                    self.informer, self._cache()))

    def _prod_predictor(self, node: dict | None) -> prediction.ProdReclaimablePredictor | None:
        """A report's predictor; None (no prediction fields) while the predict server is down."""
        server = self.prediction.running
        return None if server is None else prediction.ProdReclaimablePredictor(
            server, node, server.config, observe=self.metrics.record_prediction, said=self.prediction_problems)

    def _serve_metrics(self) -> None:
        if not self.args.addr:
            return
        try:
            self.health = HealthServer(self.args.addr, self.metrics, self.modules.ready)
            self.health.start()
        except (OSError, ValueError) as exc:
            log.error("cannot serve Prometheus metrics on --addr %s: %s; going on without",
                      self.args.addr, exc)
            self.health = None

    def _serve_pprof(self) -> None:
        """As upstream, a pprof address that cannot be bound is logged and koordlet goes on."""
        if not self.args.enable_pprof:
            return
        host, port = self.args.pprof_addr
        try:
            self.pprof = PprofServer(host, port).start()
        except OSError as exc:
            log.error("pprof: cannot listen on %s:%d: %s", host, port, exc)

    def _reporter(self) -> list[Module]:
        writer = self._status_writer()
        if writer is None:
            return []
        return [Started("nodemetric-reporter", lambda: started(NodeMetricReporter(
            self.informer, self._cache(), writer, self.metrics, predictor=self._prod_predictor)),
            NodeMetricReporter.stop)]

    def _status_writer(self) -> StatusWriter | None:
        a = self.args
        if not a.enable_node_metric_report:
            log.info("NodeMetric reporting disabled (--enable-node-metric-report=false)")
            return None
        if a.node_metric_file is not None:
            informer = self.informer
            return FileStatusWriter(a.node_metric_file,
                                    on_written=lambda raw: informer.expect_own_write(NODE_METRIC, raw))
        api = self.informer.api_source()
        if api is not None:
            return KubeStatusWriter(api.api, api.node_name, reachability=api.reachability)
        log.info("no --node-metric-file and no API server: NodeMetric is not reported")
        return None

    def _topology(self) -> list[Module]:
        a = self.args
        if a.node_topology_sync_interval <= 0:
            log.info("NodeResourceTopology disabled (--node-topology-sync-interval=0)")
            return []
        writer: FileNRTWriter | KubeNRTWriter | None = None
        api = self.informer.api_source()
        if not a.feature_gates.get(features.NODE_TOPOLOGY_REPORT):
            log.info("NodeResourceTopology kept locally only (feature gate NodeTopologyReport off)")
        elif a.node_topology_file is not None:
            writer = FileNRTWriter(a.node_topology_file)
        elif api is not None:
            writer = KubeNRTWriter(api.api, api.node_name)

        def start() -> NodeTopologyReporter:
            return started(NodeTopologyReporter(
                self.informer, self._cache(), interval=a.node_topology_sync_interval,
                var_lib_kubelet=a.var_lib_kubelet_dir, proc_root=a.proc_root_dir, sys_root=a.sys_root_dir,
                sys_fs_root=a.sys_fs_root_dir, writer=writer,
                kubelet=None if a.disable_query_kubelet_config
                else kubelet_client(a, self.informer, self.layout, self.metrics.record_kubelet_request)))
        return [Started("node-topology", start, NodeTopologyReporter.stop)]

    def _start_advisor(self) -> metricsadvisor.MetricsAdvisor:
        cache = self._cache()
        advisor = started(metricsadvisor.MetricsAdvisor(metricsadvisor.from_args(self.args), self.informer,
                                                        cache, self.executor))
        # After a successful start only: a retried start must not register the gauges twice.
        self.metrics.external.register(ResctrlPrometheus(cache, node_name()))
        self.metrics.external.register(PSIGauges(advisor.env.shared, node_name()))
        self.metrics.registry.register(AdvisorMetrics(advisor.env.shared, node_name()))
        self.metrics.registry.register(HostAppGauges(advisor.env.shared, node_name()))
        return advisor

    def _start_qos_manager(self) -> qosmanager.QOSManager:
        return started(qosmanager.QOSManager(
            qosmanager.QOSConfig.from_args(self.args, node_name=node_name()), self.informer,
            self._cache(), self.executor, registry=self.metrics.registry, api_client=self.informer.api_client()))

    def _start_pleg(self) -> Pleg:
        """A pod or container cgroup appearing asks for a pod sync and a reconcile round at
        once, instead of at the next poll, and tells the QoS strategies their cgroup tree changed."""
        return started(Pleg(self.executor, [self.informer.resync_pods, self._cgroups_changed,
                                            self.hooks.reconcile_now]))

    def _cgroups_changed(self) -> None:
        manager = self.qos_manager.running
        if manager is not None:  # started (its start is retried until it is)
            manager.cgroups_changed()


def make_states_informer(a: argparse.Namespace, layout: CgroupLayout,
                         observe_kubelet: KubeletObserver | None = None) -> StatesInformer:
    """Objects from files when any file flag is given, else from the API server when
    there is one; pods from CRI or kubelet (``--pods-source``), each kubelet answer told to
    ``observe_kubelet``."""
    files = {kind: path for kind, path in ((NODE, a.node_file), (NODE_SLO, a.node_slo_file),
                                           (NODE_METRIC, a.node_metric_file)) if path}
    objects: FileObjectsSource | KubeObjectsSource | None = None
    if files:
        objects = FileObjectsSource(files)
    elif kubeconfig_path(a) or in_cluster():
        name = os.environ.get("NODE_NAME")
        if not name:
            log.error("an API server is configured but NODE_NAME is not set: no Node, "
                      "NodeSLO or NodeMetric; using defaults")
        else:
            try:
                objects = KubeObjectsSource(kube_api_client(kubeconfig_path(a), a.kube_api_qps,
                                                            a.kube_api_burst), name)
            except Exception as exc:  # bad kubeconfig, no service account, no kubernetes package
                log.error("cannot reach the API server: %s; no Node, NodeSLO or NodeMetric; "
                          "using defaults", exc)
    else:
        log.info("no --node-slo-file/--node-file/--node-metric-file and not in a cluster: "
                 "using defaults")
    informer = StatesInformer(objects=objects, pods_interval=a.kubelet_sync_interval,
                              checks={NODE_SLO: check_node_slo})
    source = a.pods_source
    if source == "auto":
        source = "kubelet" if informer.api_source() is not None else "cri"
        log.info("pods from %s (--pods-source=auto: %s)", source,
                 "the Node comes from the API server" if source == "kubelet" else "no API server")
    if source == "kubelet":
        informer.pods_source = kubelet_client(a, informer, layout, observe_kubelet)
    else:
        informer.pods_source = CriPodsSource(a.containerd_endpoint, layout)
    return informer


def kubelet_client(a: argparse.Namespace, informer: StatesInformer, layout: CgroupLayout,
                   observe: KubeletObserver | None = None) -> KubeletPodsSource:
    """The kubelet at the Node's address, with the API client's credentials (upstream's stub):
    its /pods and its /configz."""
    api = informer.api_source()
    return KubeletPodsSource(
        informer.get_node, layout, address_type=a.kubelet_preferred_address_type, insecure_tls=a.kubelet_insecure_tls,
        read_only_port=a.kubelet_read_only_port, timeout=a.kubelet_sync_timeout,
        token=None if api is None else api.bearer_token(), observe=observe)


def kubeconfig_path(a: argparse.Namespace) -> Path | None:
    """Where upstream looks first: ``--kubeconfig``, then ``$KUBECONFIG`` (in-cluster after)."""
    if a.kubeconfig is not None:
        return a.kubeconfig
    env = os.environ.get("KUBECONFIG", "")
    return Path(env.split(os.pathsep)[0]) if env else None


def node_name() -> str:
    """``NODE_NAME`` as upstream requires it in a cluster; the host name without one."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def kube_api_client(kubeconfig: Path | None, qps: float = 20.0, burst: int = 30) -> Any:
    """The API client, its requests limited to ``qps`` after a ``burst`` (``ratelimit``)."""
    from kubernetes import client, config

    # urllib3 warns at each of its retries; an outage is logged once by Reachability instead.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

    if kubeconfig is not None:
        return limit_client(config.new_client_from_config(config_file=str(kubeconfig)), qps, burst)
    config.load_incluster_config()
    return limit_client(client.ApiClient(), qps, burst)


def warn_about_upstream_only(args: argparse.Namespace) -> None:
    """One warning per kind of upstream setting that has no effect here, naming them."""
    ignored = upstreamflags.ignored_flags(args)
    if ignored:
        log.warning("upstream flags without a feature here, ignored: %s", ", ".join("--" + n for n in ignored))
    gates = features.not_implemented(args.feature_gates, implemented_gates())
    if gates:
        log.warning("feature gates enabled but not implemented here (no effect): %s", ", ".join(gates))
    if args.unparsed:
        log.warning("arguments after the flags are not parsed (Go's flag rules) and ignored: %s",
                    " ".join(args.unparsed)[:300])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    upstreamflags.configure_logging(args)
    warn_about_upstream_only(args)
    rlimits.raise_open_file_limit()
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
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
        # What start-up built (imported modules, flags, the modules' objects) lives as long
        # as the process: out of the collector's reach, a full collection walks only what
        # the modules allocate as they run (measured at 100 pods: 27 -> 1.5 ms each).
        gc.freeze()
        stopping.wait()
    except (OSError, ValueError) as exc:
        log.error("koordlet cannot start: %s", exc)
        return 1
    finally:
        koordlet.stop()
    log.info("koordlet stopped")
    return 0
