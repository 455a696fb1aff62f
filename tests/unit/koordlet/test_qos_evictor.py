"""The evictor's two modes, as upstream's ``-only-evict-by-api``: false (the default) stops
the pod's running containers through CRI and never asks the API server to evict; true asks
the Eviction subresource (a real ``kubernetes`` client against the fake API server) and
stops nothing. Either way the pod gets upstream's Event and the eviction is counted in
``koordlet_pod_eviction`` and ``koordlet_pod_eviction_detail``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest
from cri_api.v1 import api_pb2 as cri
from prometheus_client import CollectorRegistry

from koord.koordlet.qosmanager.evictor import Evictor
from koord.koordlet.qosmanager.metrics import QOSMetrics
from koord.koordlet.statesinformer import PodMeta
from koord_testing.kubeapi import FakeKubeAPI
from koord_testing.pods import container_meta
from koord_testing.wait import wait_for

from .qos_fakes import pod

REASON = "EvictPodByNodeMemoryUsage"
EVENT = f"evict Pod:default/be-1, reason: evicted, message: {REASON}, kill pod: be-1"


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as server:
        yield server


def client(api: FakeKubeAPI):
    from kubernetes import client

    config = client.Configuration()
    config.host = api.url
    return client.ApiClient(config)


def running_pod(fake_cri) -> PodMeta:
    """be-1 with an exited container before two running ones (all on the fake CRI)."""
    fake_cri.add_pod("s1", "be-1", {}, "/kubepods/besteffort/poduid-1")
    victim = pod("uid-1", "BE", "besteffort", name="be-1", containers=0)
    containers = []
    for cid, state in (("c-exited", cri.CONTAINER_EXITED), ("c-a", cri.CONTAINER_RUNNING),
                       ("c-b", cri.CONTAINER_RUNNING)):
        fake_cri.add_container(cid, "s1", cid, state=state)
        containers.append(container_meta(cid, cid, f"{victim.cgroup_dir}/{cid}",
                                         running=state == cri.CONTAINER_RUNNING))
    return replace(victim, containers=tuple(containers))


def stopped_ids(fake_cri) -> list[tuple[str, int]]:
    requests = [cri.StopContainerRequest.FromString(raw) for raw in fake_cri.requests("StopContainer")]
    return [(r.container_id, r.timeout) for r in requests]


@pytest.mark.parametrize("only_by_api, status, evicted, stops, evictions, event", [
    # upstream's default: kill through CRI (every running container), no eviction request
    (False, 201, True, [("c-a", 0), ("c-b", 0)], 0, ("evictPodSuccess", EVENT)),
    # a PodDisruptionBudget does not concern a kill
    (False, 429, True, [("c-a", 0), ("c-b", 0)], 0, ("evictPodSuccess", EVENT)),
    (True, 201, True, [], 1, ("evictPodSuccess", EVENT)),
    (True, 429, False, [], 1, ("evictPodFail", f"{EVENT}, error 429 Too Many Requests")),
])
def test_modes(api: FakeKubeAPI, fake_cri, only_by_api: bool, status: int, evicted: bool,
               stops: list, evictions: int, event: tuple[str, str]) -> None:
    api.eviction_status = status
    registry = CollectorRegistry()
    evictor = Evictor(fake_cri.endpoint, only_by_api=only_by_api, api_client=client(api),
                      metrics=QOSMetrics("node-1", registry))
    try:
        assert evictor.evict(running_pod(fake_cri), REASON, "node memory 95% >= 80%") is evicted
        wait_for(lambda: api.events, "the Event posted", 10)
    finally:
        evictor.close()
    assert stopped_ids(fake_cri) == stops
    assert len(api.evictions) == evictions
    if evictions:
        assert api.evictions[0]["metadata"] == {"name": "be-1", "namespace": "default"}
        assert api.evictions[0]["deleteOptions"]["preconditions"] == {"uid": "uid-1"}
    [posted] = api.events
    assert (posted["reason"], posted["message"]) == event
    assert posted["type"] == "Warning"
    assert posted["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                                        "name": "be-1", "uid": "uid-1"}
    assert posted["source"] == {"component": "koordlet-qosManager", "host": "node-1"}
    count = 1.0 if evicted else None
    assert registry.get_sample_value("koordlet_pod_eviction_total",
                                     {"node": "node-1", "reason": "evicted"}) == count
    assert registry.get_sample_value("koordlet_pod_eviction_detail_total", {
        "node": "node-1", "pod_namespace": "default", "pod_name": "be-1", "reason": "evicted"}) == count


def test_refused_eviction_is_retried_each_round_and_logged_once(
        api: FakeKubeAPI, caplog: pytest.LogCaptureFixture) -> None:
    api.eviction_status = 429
    evictor = Evictor("/nonexistent.sock", only_by_api=True, api_client=client(api))
    victim = pod("uid-2", "BE", "besteffort", name="be-2")
    try:
        with caplog.at_level(logging.INFO):
            for used in (95, 96, 97):
                assert evictor.evict(victim, REASON, f"node memory {used}%") is False
        wait_for(lambda: api.events, "the Event posted", 10)
    finally:
        evictor.close()
    assert len(api.evictions) == 3  # asked again every round
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "default/be-2" in errors[0].getMessage()
    assert "429" in errors[0].getMessage() and "retried next round" in errors[0].getMessage()
    assert [e["reason"] for e in api.events] == ["evictPodFail"]


def test_accepted_eviction_is_not_asked_again(api: FakeKubeAPI) -> None:
    evictor = Evictor("/nonexistent.sock", only_by_api=True, api_client=client(api))
    victim = pod("uid-3", "BE", "besteffort", name="be-3")
    try:
        assert evictor.evict(victim, REASON, "95%") is True
        assert evictor.evict(victim, REASON, "again") is False  # recently evicted
    finally:
        evictor.close()
    assert len(api.evictions) == 1


def test_only_by_api_without_api_never_stops_containers(fake_cri) -> None:
    evictor = Evictor(fake_cri.endpoint, only_by_api=True)
    try:
        assert evictor.evict(running_pod(fake_cri), REASON, "95%") is False
    finally:
        evictor.close()
    assert stopped_ids(fake_cri) == []


def test_kill_without_api_server_needs_no_events(fake_cri) -> None:
    """Standalone (no API server): the default mode still stops the containers."""
    evictor = Evictor(fake_cri.endpoint)
    try:
        assert evictor.evict(running_pod(fake_cri), REASON, "95%") is True
    finally:
        evictor.close()
    assert stopped_ids(fake_cri) == [("c-a", 0), ("c-b", 0)]
    assert {cid: c.state for cid, c in fake_cri.containers.items()} == {
        "c-exited": cri.CONTAINER_EXITED, "c-a": cri.CONTAINER_EXITED, "c-b": cri.CONTAINER_EXITED}


@pytest.mark.parametrize("later, kept", [(299.0, 1.0), (300.0, None)])
def test_eviction_detail_series_expire_after_five_minutes(later: float, kept: float | None) -> None:
    now = [0.0]
    registry = CollectorRegistry()
    metrics = QOSMetrics("node-1", registry, clock=lambda: now[0])
    metrics.record_eviction("default", "be-1", "evicted")
    now[0] = later
    metrics.expire_eviction_detail()
    labels = {"node": "node-1", "pod_namespace": "default", "pod_name": "be-1", "reason": "evicted"}
    assert registry.get_sample_value("koordlet_pod_eviction_detail_total", labels) == kept
    assert registry.get_sample_value("koordlet_pod_eviction_total", {"node": "node-1", "reason": "evicted"}) == 1
