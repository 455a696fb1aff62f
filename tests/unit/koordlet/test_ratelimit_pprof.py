"""``-kube-api-qps``/``-kube-api-burst`` (client-go's token bucket in front of every API
request) and ``-enable-pprof`` (thread stacks and a heap snapshot over HTTP)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from koord.koordlet.cli import kube_api_client
from koord.koordlet.pprof import PprofServer
from koord.koordlet.ratelimit import TokenBucket, bucket_for
from koord_testing.kubeapi import NODES, FakeKubeAPI


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("qps, burst, steps, waits", [
    # the burst goes at once, then one token every 1/qps seconds
    (2.0, 3, [0, 0, 0, 0, 0], [0.5, 0.5]),
    (20.0, 30, [0] * 31, [0.05]),
    # time passing refills up to the burst, no further
    (1.0, 2, [0, 0, 10, 0, 0], [1.0]),
    (4.0, 1, [0, 0.25, 0.25, 0.1], [0.15]),
])
def test_token_bucket(qps: float, burst: int, steps: list[float], waits: list[float]) -> None:
    t = FakeTime()
    bucket = TokenBucket(qps, burst, clock=t.clock, sleep=t.sleep)
    for step in steps:
        t.now += step
        bucket.acquire()
    assert t.slept == pytest.approx(waits)


@pytest.mark.parametrize("qps, burst, want", [
    (20.0, 30, (20.0, 30)),
    (0.0, 0, (5.0, 10)),  # client-go's defaults for zero
    (0.5, 0, (0.5, 10)),
    (-1.0, 30, None),  # negative: no limit
])
def test_bucket_for_flags(qps: float, burst: int, want) -> None:
    bucket = bucket_for(qps, burst)
    assert (None if bucket is None else (bucket.qps, bucket.burst)) == want


@pytest.mark.parametrize("qps, burst, requests, at_least, at_most", [
    (5.0, 2, 4, 0.35, 5.0),  # two requests wait 0.2 s each
    (-1.0, 1, 4, 0.0, 0.3),  # no limit
])
def test_api_client_requests_are_limited(tmp_path, qps: float, burst: int, requests: int,
                                         at_least: float, at_most: float) -> None:
    from kubernetes import client

    with FakeKubeAPI() as api:
        api.put(NODES, {"metadata": {"name": "n1"}})
        core = client.CoreV1Api(kube_api_client(api.write_kubeconfig(tmp_path / "kubeconfig"), qps, burst))
        start = time.monotonic()
        for _ in range(requests):
            assert core.list_node().items[0].metadata.name == "n1"
        elapsed = time.monotonic() - start
    assert at_least <= elapsed <= at_most


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("path, status, contains", [
    ("/debug/pprof/", 200, "goroutine"),
    ("/debug/pprof/goroutine?debug=2", 200, "thread MainThread"),
    ("/debug/pprof/goroutine", 200, "thread pprof"),
    ("/debug/pprof/heap", 200, "VmRSS:"),
    ("/debug/pprof/heap", 200, "gc tracked objects:"),
    ("/debug/pprof/profile", 404, "404 page not found"),
])
def test_pprof_pages(path: str, status: int, contains: str) -> None:
    server = PprofServer("127.0.0.1", 0).start()
    try:
        got_status, body = get(f"http://127.0.0.1:{server.port}{path}")
    finally:
        server.stop()
    assert got_status == status and contains in body
