"""Prometheus metrics of the proxy (served by ``koord.health.HealthServer``).

``observe_*`` sit on the path of every CRI call, so label children are resolved once per
label combination and cached: a call costs a dict lookup plus the observation itself.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from koord.health import WSGIApp

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""A forwarded call costs ~100 µs, a hook call a few ms, a hung plugin its timeout (seconds)."""

HOOK_OUTCOMES = frozenset({"ok", "error", "timeout", "invalid", "unavailable", "cancelled"})


class ProxyMetrics:
    """The proxy's metrics, in a registry of their own so tests can build several."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.cri_requests = Histogram(
            "koord_runtime_proxy_cri_request_duration_seconds",
            "Duration of CRI calls served by the proxy, hooks included, by method and gRPC status code.",
            ["method", "code"], buckets=LATENCY_BUCKETS, registry=r)
        self.cri_requests_total = Counter(
            "koord_runtime_proxy_cri_requests_total",
            "CRI calls served by the proxy, by method and gRPC status code.",
            ["method", "code"], registry=r)
        self.hook_calls = Histogram(
            "koord_runtime_proxy_hook_duration_seconds",
            "Duration of calls to runtime plugins, by plugin file, hook point and outcome "
            "(ok, error, timeout, invalid answer, unavailable plugin, cancelled by the CRI caller).",
            ["plugin", "hook", "outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.registered_plugins = Gauge(
            "koord_runtime_proxy_registered_plugins",
            "Valid plugin registration files in the hook config dir.", registry=r)
        self.invalid_registrations = Gauge(
            "koord_runtime_proxy_invalid_registrations",
            "Plugin registration files that are ignored because they are invalid.", registry=r)
        self.store_pods = Gauge(
            "koord_runtime_proxy_store_pods", "Pod sandboxes held in the proxy's store.", registry=r)
        self.store_containers = Gauge(
            "koord_runtime_proxy_store_containers", "Containers held in the proxy's store.", registry=r)
        self._cri_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._hook_children: dict[tuple[str, str, str], Any] = {}

    def pages(self) -> dict[str, WSGIApp]:
        """/metrics, in prometheus_client's own exposition (these names are the proxy's, not upstream's)."""
        return {"/metrics": make_wsgi_app(self.registry)}

    def observe_cri(self, method: str, code: str, seconds: float) -> None:
        children = self._cri_children.get((method, code))
        if children is None:
            children = (self.cri_requests.labels(method, code), self.cri_requests_total.labels(method, code))
            self._cri_children[(method, code)] = children
        children[0].observe(seconds)
        children[1].inc()

    def observe_hook(self, plugin: str, hook: str, outcome: str, seconds: float) -> None:
        child = self._hook_children.get((plugin, hook, outcome))
        if child is None:
            if outcome not in HOOK_OUTCOMES:
                raise ValueError(f"hook outcome {outcome!r} is not one of {', '.join(sorted(HOOK_OUTCOMES))}")
            child = self.hook_calls.labels(plugin, hook, outcome)
            self._hook_children[(plugin, hook, outcome)] = child
        child.observe(seconds)
