"""The evictor's two paths: the Eviction API (real ``kubernetes`` client against a recording
HTTP endpoint) and CRI StopContainer (against the in-memory CRI backend)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from koord.koordlet.qosmanager.evictor import Evictor

from .qos_fakes import pod


class EvictionEndpoint:
    """Answers POST .../pods/<name>/eviction with ``status`` and records each request."""

    def __init__(self, status: int = 201) -> None:
        self.requests: list[tuple[str, dict]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append((self.path, body))
                payload = json.dumps({"kind": "Status", "code": status}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self):
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return client.ApiClient(config)


@pytest.fixture
def endpoint() -> Iterator[EvictionEndpoint]:
    e = EvictionEndpoint()
    yield e
    e.server.shutdown()


def test_eviction_api_with_uid_precondition(endpoint: EvictionEndpoint) -> None:
    victim = pod("uid-1", "BE", "besteffort", name="be-1")
    evictor = Evictor("/nonexistent.sock", api_client=endpoint.client())
    assert evictor.evict(victim, "EvictPodByNodeMemoryUsage", "node memory 95% >= 80%") is True
    path, body = endpoint.requests[0]
    assert path == "/api/v1/namespaces/default/pods/be-1/eviction"
    assert body["metadata"] == {"name": "be-1", "namespace": "default"}
    assert body["deleteOptions"]["preconditions"] == {"uid": "uid-1"}
    assert evictor.evict(victim, "EvictPodByNodeMemoryUsage", "again") is False  # recently evicted
    assert len(endpoint.requests) == 1


def test_eviction_api_refused_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    refusing = EvictionEndpoint(status=429)  # a PodDisruptionBudget says no
    try:
        evictor = Evictor("/nonexistent.sock", api_client=refusing.client())
        victim = pod("uid-2", "BE", "besteffort", name="be-2")
        for _ in range(3):
            assert evictor.evict(victim, "EvictPodByNodeMemoryUsage", "95%") is False
        errors = [r for r in caplog.records if "through the API failed: 429" in r.getMessage()]
        assert len(errors) == 1 and "default/be-2" in errors[0].getMessage()
    finally:
        refusing.server.shutdown()


def test_only_by_api_without_api_never_stops_containers() -> None:
    evictor = Evictor("/nonexistent.sock", only_by_api=True)
    assert evictor.evict(pod("u", "BE", "besteffort"), "EvictPodByNodeMemoryUsage", "95%") is False


def test_cri_stops_every_running_container_past_a_stopped_one(fake_cri) -> None:
    """Upstream's KillContainers stops at the first container that is not running; all the
    running ones must stop."""
    from cri_api.v1 import api_pb2 as cri

    from koord.testing.pods import container_meta

    fake_cri.add_pod("s1", "be-1", {}, "/kubepods/besteffort/poduid-s1")
    victim = pod("uid-s1", "BE", "besteffort", name="be-1", containers=0)
    containers = []
    for cid, state in (("c-exited", cri.CONTAINER_EXITED), ("c-a", cri.CONTAINER_RUNNING),
                       ("c-b", cri.CONTAINER_RUNNING)):
        fake_cri.add_container(cid, "s1", cid, state=state)
        containers.append(container_meta(cid, cid, f"{victim.cgroup_dir}/{cid}",
                                         running=state == cri.CONTAINER_RUNNING))
    victim = replace(victim, containers=tuple(containers))
    evictor = Evictor(fake_cri.endpoint)
    try:
        assert evictor.evict(victim, "EvictPodByNodeMemoryUsage", "95%") is True
    finally:
        evictor.close()
    stopped = [cri.StopContainerRequest.FromString(raw) for raw in fake_cri.requests("StopContainer")]
    assert [(r.container_id, r.timeout) for r in stopped] == [("c-a", 0), ("c-b", 0)]
    assert {cid: c.state for cid, c in fake_cri.containers.items()} == {
        "c-exited": cri.CONTAINER_EXITED, "c-a": cri.CONTAINER_EXITED, "c-b": cri.CONTAINER_EXITED}
