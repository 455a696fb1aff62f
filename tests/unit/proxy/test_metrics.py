"""ProxyMetrics and HealthServer, scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from koord.health import HealthServer
from koord.hookapi import parse_bind_address
from koord.runtimeproxy.metrics import ProxyMetrics


def _get(port: int, path: str, host: str = "127.0.0.1", method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(f"http://{host}:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class _Ready:
    def __init__(self) -> None:
        self.state: tuple[bool, str] = (False, "store not rebuilt yet")

    def __call__(self) -> tuple[bool, str]:
        return self.state


@pytest.fixture
def served() -> Iterator[tuple[ProxyMetrics, HealthServer, _Ready]]:
    metrics, ready = ProxyMetrics(), _Ready()
    server = HealthServer("127.0.0.1:0", metrics, ready)
    server.start()
    try:
        yield metrics, server, ready
    finally:
        server.stop()


def test_cri_and_hook_observations_are_scraped(served) -> None:
    metrics, server, _ = served
    metrics.observe_cri("RunPodSandbox", "OK", 0.2)
    metrics.observe_cri("RunPodSandbox", "OK", 0.00005)
    metrics.observe_cri("StartContainer", "DeadlineExceeded", 3.0)
    metrics.observe_hook("10-koordlet.json", "PreRunPodSandbox", "ok", 0.002)
    metrics.observe_hook("20-gpu.json", "PreRunPodSandbox", "timeout", 1.0)
    metrics.registered_plugins.set(2)
    metrics.invalid_registrations.set(1)
    metrics.store_pods.set(3)
    metrics.store_containers.set(7)

    status, text = _get(server.port, "/metrics")
    assert status == 200
    s = _samples(text)
    run_ok = frozenset({("method", "RunPodSandbox"), ("code", "OK")})
    assert s[("koord_runtime_proxy_cri_requests_total", run_ok)] == 2
    assert s[("koord_runtime_proxy_cri_request_duration_seconds_count", run_ok)] == 2
    assert s[("koord_runtime_proxy_cri_request_duration_seconds_sum", run_ok)] == pytest.approx(0.20005)
    assert s[("koord_runtime_proxy_cri_request_duration_seconds_bucket", run_ok | {("le", "0.0001")})] == 1
    assert s[("koord_runtime_proxy_cri_request_duration_seconds_bucket", run_ok | {("le", "0.25")})] == 2
    deadline = frozenset({("method", "StartContainer"), ("code", "DeadlineExceeded")})
    assert s[("koord_runtime_proxy_cri_requests_total", deadline)] == 1
    timeout = frozenset({("plugin", "20-gpu.json"), ("hook", "PreRunPodSandbox"), ("outcome", "timeout")})
    assert s[("koord_runtime_proxy_hook_duration_seconds_count", timeout)] == 1
    assert s[("koord_runtime_proxy_hook_duration_seconds_sum", timeout)] == pytest.approx(1.0)
    ok = frozenset({("plugin", "10-koordlet.json"), ("hook", "PreRunPodSandbox"), ("outcome", "ok")})
    assert s[("koord_runtime_proxy_hook_duration_seconds_count", ok)] == 1
    assert s[("koord_runtime_proxy_registered_plugins", frozenset())] == 2
    assert s[("koord_runtime_proxy_invalid_registrations", frozenset())] == 1
    assert s[("koord_runtime_proxy_store_pods", frozenset())] == 3
    assert s[("koord_runtime_proxy_store_containers", frozenset())] == 7


def test_buckets_span_microseconds_to_seconds() -> None:
    metrics = ProxyMetrics()
    metrics.observe_hook("p.json", "PreStartContainer", "ok", 0.001)
    bounds = {s.labels["le"] for f in text_string_to_metric_families(_scrape(metrics))
              for s in f.samples if s.name == "koord_runtime_proxy_hook_duration_seconds_bucket"}
    assert {"0.0001", "0.001", "1.0", "10.0", "+Inf"} <= bounds


def _scrape(metrics: ProxyMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_registries_are_independent() -> None:
    a, b = ProxyMetrics(), ProxyMetrics()
    a.observe_cri("Version", "OK", 0.001)
    key = ("koord_runtime_proxy_cri_requests_total", frozenset({("method", "Version"), ("code", "OK")}))
    assert _samples(_scrape(a))[key] == 1
    assert key not in _samples(_scrape(b))


def test_unknown_hook_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="'crashed'"):
        ProxyMetrics().observe_hook("p.json", "PreStartContainer", "crashed", 0.1)


def test_healthz_and_readyz(served) -> None:
    _, server, ready = served
    assert _get(server.port, "/healthz") == (200, "ok\n")
    assert _get(server.port, "/readyz") == (503, "store not rebuilt yet\n")
    ready.state = (True, "")
    assert _get(server.port, "/readyz") == (200, "ok\n")
    ready.state = (False, "backend /run/containerd.sock unreachable")
    assert _get(server.port, "/readyz") == (503, "backend /run/containerd.sock unreachable\n")


def test_readiness_callback_that_raises_is_not_ready() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("store lock poisoned")

    server = HealthServer("127.0.0.1:0", ProxyMetrics(), broken)
    server.start()
    try:
        status, body = _get(server.port, "/readyz")
        assert status == 503 and "store lock poisoned" in body
        assert _get(server.port, "/healthz") == (200, "ok\n")
    finally:
        server.stop()


def test_unknown_path_and_method(served) -> None:
    _, server, _ = served
    assert _get(server.port, "/nope")[0] == 404
    assert _get(server.port, "/metrics", method="POST")[0] == 405
    assert _get(server.port, "/healthz", method="HEAD")[0] == 200


def test_stop_closes_the_port() -> None:
    server = HealthServer("127.0.0.1:0", ProxyMetrics(), lambda: (True, ""))
    server.start()
    port = server.port
    assert port != 0
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    server.stop()  # idempotent


def test_empty_host_serves_all_interfaces() -> None:
    server = HealthServer(":0", ProxyMetrics(), lambda: (True, ""))
    server.start()
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
    finally:
        server.stop()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_bracketed_ipv6_host() -> None:
    server = HealthServer("[::1]:0", ProxyMetrics(), lambda: (True, ""))
    try:
        server.start()
    except OSError as e:
        pytest.skip(f"IPv6 loopback not available: {e}")
    try:
        assert _get(server.port, "/healthz", host="[::1]") == (200, "ok\n")
    finally:
        server.stop()


def test_port_in_use_names_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=address):
            HealthServer(address, ProxyMetrics(), lambda: (True, "")).start()


@pytest.mark.parametrize("address,family,host,port", [
    (":9319", None, "", 9319),
    ("127.0.0.1:9319", socket.AF_INET, "127.0.0.1", 9319),
    ("localhost:0", socket.AF_INET, "127.0.0.1", 0),
    ("[::1]:9319", socket.AF_INET6, "::1", 9319),
    ("0.0.0.0:65535", socket.AF_INET, "0.0.0.0", 65535),
])
def test_parse_bind_address(address, family, host, port) -> None:
    got_family, got_host, got_port = parse_bind_address(address)
    assert (got_host, got_port) == (host, port)
    if family is not None:
        assert got_family == family


@pytest.mark.parametrize("address,problem", [
    ("9319", "host:port"),
    ("127.0.0.1", "host:port"),
    ("127.0.0.1:", "host:port"),
    ("127.0.0.1:http", "host:port"),
    ("127.0.0.1:65536", "0-65535"),
    ("127.0.0.1:-1", "host:port"),
    ("::1:9319", "brackets"),
    ("example.com:9319", "IP address or localhost"),
    ("[not-an-ip]:9319", "IP address or localhost"),
])
def test_bad_bind_address_is_a_value_error_naming_it(address, problem) -> None:
    with pytest.raises(ValueError) as info:
        HealthServer(address, ProxyMetrics(), lambda: (True, ""))
    assert repr(address) in str(info.value) and problem in str(info.value)
