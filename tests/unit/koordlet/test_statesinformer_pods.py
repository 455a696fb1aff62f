"""States informer pods from CRI, the pod model, and the facade."""

import dataclasses
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.statesinformer import PODS, CriPodsSource, PodsUnavailable, StatesInformer
from koord.koordlet.statesinformer.meta import milli_cpu_of_quota, milli_cpu_of_shares
from koord_testing.pods import container_meta, pod_meta

NO_FS = Path("/nonexistent")


@pytest.mark.parametrize("shares,milli", [(None, 0), (2, 0), (102, 100), (256, 250), (1024, 1000),
                                          (2048, 2000)])
def test_cpu_request_from_shares_inverts_kubelet(shares, milli):
    assert milli_cpu_of_shares(shares) == milli


@given(st.integers(min_value=10, max_value=256_000))
def test_cpu_request_round_trips_kubelet_shares(milli):
    shares = max(2, milli * 1024 // 1000)
    assert abs(milli_cpu_of_shares(shares) - milli) <= 1


@pytest.mark.parametrize("quota,period,want", [(None, None, None), (-1, 100000, None),
                                               (50000, 100000, 500), (200000, 100000, 2000),
                                               (1000, 0, None)])
def test_cpu_limit_from_quota(quota, period, want):
    assert milli_cpu_of_quota(quota, period) == want


def test_cri_pods_carry_meta_qos_cgroups_and_resources(fake_cri):
    fake_cri.add_pod("s1", "burner", {"koordinator.sh/qosClass": "BE"}, "/kubepods/besteffort/poduid-s1",
                     annotations={"a": "1"})
    fake_cri.add_container("c1", "s1", "burn", resources={
        "cpu_shares": 1024, "cpu_quota": 150000, "cpu_period": 100000,
        "memory_limit_in_bytes": 209715200})
    fake_cri.add_pod("s0", "api", {}, "/kubepods/poduid-s0", state=cri.SANDBOX_NOTREADY)
    source = CriPodsSource(fake_cri.endpoint, CgroupLayout(NO_FS, kube_dir="t/kubepods/"))
    try:
        pods = source.list_pods()
    finally:
        source.close()
    api, burner = pods
    assert (burner.namespace, burner.name, burner.uid) == ("ns", "burner", "uid-s1")
    assert burner.kube_qos == "besteffort" and burner.koord_qos == "BE"
    assert burner.annotations == {"a": "1"} and burner.running and burner.sandbox_id == "s1"
    assert burner.cgroup_dir == "t/kubepods/besteffort/poduid-s1"
    [c] = burner.containers
    assert (c.name, c.id, c.running) == ("burn", "c1", True)
    assert c.cgroup_dir == "t/kubepods/besteffort/poduid-s1/c1"
    assert c.requests == {"cpu": 1000}
    assert c.limits == {"cpu": 1500, "memory": 209715200}
    assert api.kube_qos == "guaranteed" and api.koord_qos == "" and not api.running
    assert api.cgroup_dir == "t/kubepods/poduid-s0" and api.containers == ()


def test_cri_pods_status_asked_once_per_id_and_vanished_pods_dropped(fake_cri):
    fake_cri.add_pod("s1", "p1", {}, "/kubepods/burstable/poduid-s1")
    fake_cri.add_container("c1", "s1", "main")
    source = CriPodsSource(fake_cri.endpoint, CgroupLayout(NO_FS, kube_dir="kubepods/"))
    try:
        assert [p.name for p in source.list_pods()] == ["p1"]
        fake_cri.containers["c1"].state = cri.CONTAINER_EXITED
        [p1] = source.list_pods()
        assert not p1.containers[0].running
        assert len(fake_cri.requests("PodSandboxStatus")) == 1
        assert len(fake_cri.requests("ContainerStatus")) == 1
        del fake_cri.pods["s1"], fake_cri.containers["c1"]
        assert source.list_pods() == []
    finally:
        source.close()


def test_pod_vanishing_between_list_and_status_is_skipped_until_it_answers(fake_cri):
    fake_cri.add_pod("s1", "p1", {}, "/kubepods/burstable/poduid-s1")
    fake_cri.add_container("c1", "s1", "main")
    fake_cri.fail["PodSandboxStatus"] = (grpc.StatusCode.NOT_FOUND, "sandbox s1 not found")
    source = CriPodsSource(fake_cri.endpoint, CgroupLayout(NO_FS, kube_dir="kubepods/"))
    try:
        assert source.list_pods() == []  # listed, then gone: neither the pod nor its container
        del fake_cri.fail["PodSandboxStatus"]
        [pod] = source.list_pods()
        assert [c.id for c in pod.containers] == ["c1"]
    finally:
        source.close()


def test_pod_without_cgroup_parent_is_skipped_with_a_warning(fake_cri, caplog):
    fake_cri.add_pod("s1", "odd", {}, None)
    source = CriPodsSource(fake_cri.endpoint, CgroupLayout(NO_FS, kube_dir="kubepods/"))
    try:
        assert source.list_pods() == []
    finally:
        source.close()
    assert any("ns/odd" in r.getMessage() and "cgroup parent" in r.getMessage()
               for r in caplog.records)


def test_unreachable_cri_raises_pods_unavailable(tmp_path):
    source = CriPodsSource(f"unix://{tmp_path}/none.sock", CgroupLayout(NO_FS, kube_dir="kubepods/"))
    try:
        with pytest.raises(PodsUnavailable, match="none.sock"):
            source.list_pods()
    finally:
        source.close()


class ListSource:
    def __init__(self):
        self.result = []

    def describe(self):
        return "list"

    def list_pods(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def close(self):
        pass


def _pod(name):
    return pod_meta("ns", name, "u-" + name, "kubepods/besteffort/podu-" + name, kube_qos="besteffort",
                    koord_qos="BE")


def test_informer_pods_callbacks_shared_pods_and_last_good_list():
    source = ListSource()
    informer = StatesInformer(pods=source)
    fired = []
    informer.register_callback(PODS, lambda: fired.append(1))
    assert not informer.has_synced()
    source.result = [_pod("a")]
    assert informer.sync_pods() and informer.has_synced() and fired == [1]
    first = informer.get_all_pods()
    source.result = [_pod("a")]  # equal, not the same objects
    assert not informer.sync_pods() and fired == [1]  # unchanged: no callback
    again = informer.get_all_pods()
    assert again[0] is first[0], "every reader gets the same pods until they change"
    first.clear()  # the list is the caller's own
    assert [p.name for p in informer.get_all_pods()] == ["a"]
    source.result = PodsUnavailable("CRI down")
    assert not informer.sync_pods()
    assert [p.name for p in informer.get_all_pods()] == ["a"]


def test_pods_cannot_be_changed_by_readers_nor_by_their_builder():
    labels, requests = {"l": "1"}, {"cpu": 100}
    pod = pod_meta("ns", "a", "u-a", "kubepods/podu-a", labels=labels,
                   containers=[container_meta("c", "id", "kubepods/podu-a/id", requests=requests)])
    labels["l"], requests["cpu"] = "2", 200
    assert pod.labels == {"l": "1"} and pod.containers[0].requests == {"cpu": 100}
    with pytest.raises(dataclasses.FrozenInstanceError):
        pod.running = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        pod.labels["l"] = "3"  # type: ignore[index]
    with pytest.raises(TypeError):
        pod.containers[0].requests["cpu"] = 300  # type: ignore[index]
    with pytest.raises(AttributeError):
        pod.containers.append(pod.containers[0])  # type: ignore[attr-defined]


def test_informer_failing_callback_does_not_stop_others():
    informer = StatesInformer(pods=ListSource())
    fired = []
    informer.register_callback(PODS, lambda: 1 / 0)
    informer.register_callback(PODS, lambda: fired.append(1))
    informer.pods_source.result = [_pod("a")]
    informer.sync_pods()
    assert fired == [1]
    with pytest.raises(ValueError, match="want one of"):
        informer.register_callback("nodes", lambda: None)


def test_informer_without_node_slo_is_synced_and_returns_none():
    informer = StatesInformer()
    assert informer.has_synced()
    assert informer.get_node_slo() is None and informer.get_node() is None
    assert informer.get_node_metric_spec()["reportIntervalSeconds"] == 60
