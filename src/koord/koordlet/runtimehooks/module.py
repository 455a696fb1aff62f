"""The runtime-hooks module: the plugins, their hooks, and both working modes at once, as
upstream koordlet runs them.

The hook server answers the proxy (Proxy mode) and the reconciler writes the cgroups of
running pods every ``--runtime-hooks-reconcile-interval`` (Standalone mode; ``0`` turns it
off); NRI mode joins when ``--enable-nri-runtime-hook`` is set. Without a proxy the
registration file is simply never read. The module is required: if its server cannot
listen, the proxy could not reach koordlet at all, so the start fails instead of retrying.
"""

from __future__ import annotations

import argparse
import logging

from koord.hookapi import Registration

from ..metrics import KoordletMetrics
from ..resourceexecutor.updater import ResourceExecutor
from ..statesinformer import NODE, NODE_SLO, NODE_TOPOLOGY, PODS, StatesInformer
from .hooks import Hooks, PluginEnv, RuntimePlugin
from .nri import NriOptions, NriServer
from .plugins import build_plugins, parse_rules
from .reconciler import Reconciler
from .rule import RuleError
from .server import RuntimeHookServer

log = logging.getLogger("koordlet")

REGISTRATION_NAME = "koordlet"


class RuntimeHooksModule:
    """Plugins built from the flags with upstream's default rules, kept current by the
    informer's NodeSLO, Node and topology callbacks."""

    name = "runtime-hooks"
    required = True

    def __init__(self, a: argparse.Namespace, executor: ResourceExecutor, informer: StatesInformer,
                 metrics: KoordletMetrics) -> None:
        self.informer = informer
        self._config_path = a.runtime_hooks_config_path
        self._host_endpoint: str | None = a.runtime_hooks_host_endpoint
        self._failure_policy = a.runtime_hooks_failure_policy
        env = PluginEnv(executor=executor, sys_fs_root=a.sys_fs_root_dir, proc_root=a.proc_root_dir,
                        current_pods=informer.get_all_pods, registry=metrics.registry, node=metrics.node,
                        feature_gates=a.feature_gates, disable_unset_cpu_quota=a.disable_unset_cpu_quota)
        self.plugins: list[RuntimePlugin] = build_plugins(env, a.feature_gates)
        self.hooks = Hooks(a.runtime_hooks_plugin_failure_policy, observe=metrics.record_plugin_call)
        for plugin in self.plugins:
            plugin.register(self.hooks)
        self.server = RuntimeHookServer(
            self.hooks, network=a.runtime_hooks_network, addr=a.runtime_hooks_addr,
            executor=executor, disabled_stages=a.runtime_hooks_disable_stages,
            observe=metrics.record_hook_request)
        self.reconciler = (Reconciler(self.hooks, executor, self.plugins, a.containerd_endpoint,
                                      a.runtime_hooks_reconcile_interval, current_pods=informer.get_all_pods,
                                      observe=metrics.record_reconciler_call)
                           if a.runtime_hooks_reconcile_interval > 0 else None)
        nri_options = NriOptions.from_args(a)
        self.nri = (NriServer(self.hooks, executor, nri_options, a.runtime_hooks_disable_stages,
                              on_connect=self.reconciler.reconcile_now if self.reconciler is not None else None)
                    if nri_options.enabled else None)
        defaults = parse_rules(None, None)
        for plugin in self.plugins:
            plugin.update_rules(defaults)
        for kind in (NODE, NODE_SLO, NODE_TOPOLOGY):
            informer.register_callback(kind, self.apply_rules)
        if self.reconciler is not None:  # an edited pod (annotations, labels) is followed at once
            informer.register_callback(PODS, self.reconciler.reconcile_now)
        self._registration: Registration | None = None

    def apply_rules(self) -> None:
        """Rule callback: new NodeSLO/Node → every plugin's rules → refresh existing pods."""
        node_slo = self.informer.get_node_slo()
        try:
            rules = parse_rules(None if node_slo is None else node_slo.merged, self.informer.get_node(),
                                self.informer.get_node_topo())
        except RuleError as exc:
            log.error("rules from NodeSLO/Node rejected, keeping the current rules: %s", exc)
            return
        changed = [p.name for p in self.plugins if p.update_rules(rules)]
        if changed and self.reconciler is not None:
            log.info("rules changed for %s: refreshing existing pods", ", ".join(changed))
            self.reconciler.reconcile_now()

    def reconcile_now(self) -> None:
        """A reconcile round at once (PLEG saw a cgroup come); nothing in Proxy mode alone."""
        if self.reconciler is not None:
            self.reconciler.reconcile_now()

    def start(self) -> None:
        """Serves, registers with the proxy, then reconciles; on a failure what already runs
        is stopped again before the error is raised."""
        log.info("plugins: %s", ", ".join(p.name for p in self.plugins) or "none")
        try:
            self.server.start()
            registration = Registration.of(
                REGISTRATION_NAME, self._host_endpoint or self.server.endpoint,
                self._failure_policy, self.server.stages())
            registration.write(self._config_path)
            self._registration = registration
            if self.reconciler is not None:
                self.reconciler.start()
            if self.nri is not None:
                self.nri.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Unregisters first so the proxy stops calling, then stops serving."""
        if self._registration is not None:
            self._registration.remove(self._config_path)
            self._registration = None
        self.server.stop()
        if self.nri is not None:
            self.nri.stop()
        if self.reconciler is not None:
            self.reconciler.stop()

    def ready(self) -> str:
        return ""
