"""Pods from kubelet's /pods: conversion, the Node's address, a local kubelet-like server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.statesinformer import PodsUnavailable
from koord.koordlet.statesinformer.kubelet import KubeletPodsSource, pod_meta_of, pods_of_list

LAYOUT = CgroupLayout("/nonexistent", "kubepods/")


def pod(name="p", uid="u-1", qos="Burstable", labels=None, containers=None, statuses=None,
        priority=None, phase="Running"):
    spec = {"containers": containers if containers is not None else [
        {"name": "main", "resources": {"requests": {"cpu": "500m", "memory": "128Mi"},
                                       "limits": {"cpu": "2", "kubernetes.io/batch-cpu": "1000"}}}]}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": labels or {},
                         "annotations": {"a": "b"}},
            "spec": spec,
            "status": {"phase": phase, "qosClass": qos, "containerStatuses": statuses if statuses is not None else [
                {"name": "main", "containerID": "containerd://abc", "state": {"running": {}}}]}}


def test_pod_conversion():
    meta = pod_meta_of(pod(labels={"koordinator.sh/qosClass": "LS"}, priority=9500),
                       LAYOUT, "cgroupfs")
    assert (meta.namespace, meta.name, meta.uid, meta.kube_qos, meta.koord_qos, meta.priority) == \
        ("ns", "p", "u-1", "burstable", "LS", 9500)
    assert meta.cgroup_dir == "kubepods/burstable/podu-1" and meta.running
    [c] = meta.containers
    assert (c.id, c.cgroup_dir, c.running) == ("abc", "kubepods/burstable/podu-1/abc", True)
    assert c.requests == {"cpu": 500, "memory": 128 * 2**20}
    assert c.limits == {"cpu": 2000, "kubernetes.io/batch-cpu": 1000}
    assert meta.created is None  # no creationTimestamp: the predictor treats it as young
    with_time = pod()
    with_time["metadata"]["creationTimestamp"] = "2024-05-06T07:08:09Z"
    assert pod_meta_of(with_time, LAYOUT, "cgroupfs").created == 1714979289.0


@pytest.mark.parametrize("qos,containers,want", [
    (None, [{"name": "c"}], "besteffort"),
    (None, [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}], "guaranteed"),
    (None, [{"name": "c", "resources": {"requests": {"cpu": "1"}}}], "burstable"),
    ("BestEffort", [{"name": "c", "resources": {"requests": {"cpu": "1"}}}], "besteffort"),
])
def test_kube_qos_from_status_or_resources(qos, containers, want):
    p = pod(containers=containers, statuses=[])
    if qos is None:
        del p["status"]["qosClass"]
    else:
        p["status"]["qosClass"] = qos
    assert pod_meta_of(p, LAYOUT, "cgroupfs").kube_qos == want


@pytest.mark.parametrize("mutate,field", [
    (lambda p: p["metadata"].pop("uid"), "metadata"),
    (lambda p: p["spec"].update(containers="x"), "spec.containers"),
    (lambda p: p["spec"].update(priority="high"), "spec.priority"),
    (lambda p: p["metadata"].update(labels={"a": 1}), "metadata.labels"),
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="lots"), "quantity"),
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu=True), "quantity"),
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu=[1]), "quantity"),
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu=0.5), "quantity"),
    (lambda p: p["metadata"].update(uid="../../etc"), "uid"),
    (lambda p: p["metadata"].update(creationTimestamp="yesterday"), "metadata.creationTimestamp"),
    (lambda p: p["metadata"].update(creationTimestamp=12), "metadata.creationTimestamp"),
])
def test_malformed_pod_is_rejected_naming_the_field(mutate, field):
    p = pod()
    mutate(p)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        pod_meta_of(p, LAYOUT, "cgroupfs")


def test_a_quantity_read_before_does_not_stand_for_a_bool_or_another_resource():
    """Quantities are cached by (resource, quantity): ``true`` is still an error after the
    integer 1 was read, and "1" is 1000 milli-cores for cpu, 1 for anything else."""
    p = pod(containers=[{"name": "main", "resources": {"requests": {"cpu": 1, "memory": 1, "x": "1"},
                                                       "limits": {"cpu": "1"}}}])
    [c] = pod_meta_of(p, LAYOUT, "cgroupfs").containers
    assert (c.requests, c.limits) == ({"cpu": 1000, "memory": 1, "x": 1}, {"cpu": 1000})
    p["spec"]["containers"][0]["resources"]["requests"]["memory"] = True
    with pytest.raises(ValueError, match="quantity True"):
        pod_meta_of(p, LAYOUT, "cgroupfs")


def test_a_resource_name_longer_than_kubernetes_allows_is_converted_not_cached():
    from koord.koordlet.statesinformer import kubelet

    long = "x" * (kubelet.MAX_CACHED_NAME + 1)
    p = pod(containers=[{"name": "main", "resources": {"requests": {long: "7"}}}])
    cached = kubelet._resource_value.cache_info().currsize
    [c] = pod_meta_of(p, LAYOUT, "cgroupfs").containers
    assert c.requests == {long: 7}
    assert kubelet._resource_value.cache_info().currsize == cached


def test_one_bad_pod_does_not_hide_the_others(caplog):
    data = json.dumps({"items": [pod(name="good"), {"metadata": {"name": "bad", "namespace": "ns"}}]})
    assert [p.name for p in pods_of_list(data.encode(), LAYOUT, "cgroupfs")] == ["good"]
    assert any("ns/bad" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("data", [b"<html>", b"[]", b'{"items": 3}', b"[" * 100000])
def test_not_a_pod_list_is_unavailable(data):
    with pytest.raises(PodsUnavailable):
        pods_of_list(data, LAYOUT, "cgroupfs")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)


@given(st.fixed_dictionaries({"metadata": json_values, "spec": json_values, "status": json_values}))
def test_any_json_pod_is_converted_or_rejected_never_crashes(doc):
    try:
        pod_meta_of(doc, LAYOUT, "cgroupfs")
    except ValueError:
        pass


class Kubelet:
    def __init__(self, body: bytes):
        self.body = body

        class Handler(BaseHTTPRequestHandler):
            def do_GET(h):  # noqa: N805
                h.send_response(200 if h.path == "/pods/" else 404)
                h.send_header("Content-Length", str(len(self.body)))
                h.end_headers()
                h.wfile.write(self.body)

            def log_message(h, *a):  # noqa: N805
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def node(port=None, address="127.0.0.1"):
    status = {"addresses": [{"type": "Hostname", "address": "n1"},
                            {"type": "InternalIP", "address": address}]}
    if port:
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    return {"metadata": {"name": "n1"}, "status": status}


def test_read_only_port_source_lists_pods():
    kubelet = Kubelet(json.dumps({"items": [pod(name="b", uid="u2"), pod(name="a")]}).encode())
    try:
        source = KubeletPodsSource(lambda: node(), LAYOUT, insecure_tls=True, read_only_port=kubelet.port)
        assert [p.name for p in source.list_pods()] == ["a", "b"]
        kubelet.body = b'{"items": []}'
        with pytest.raises(PodsUnavailable, match="empty"):
            source.list_pods()
    finally:
        kubelet.server.shutdown()


def test_the_same_answer_is_not_parsed_again():
    """Every sync fetches /pods; the same bytes give the same pods without parsing them again."""
    kubelet = Kubelet(json.dumps({"items": [pod(name="a")]}).encode())
    try:
        source = KubeletPodsSource(lambda: node(), LAYOUT, insecure_tls=True, read_only_port=kubelet.port)
        first = source.list_pods()
        assert source.list_pods() is first
        kubelet.body = json.dumps({"items": [pod(name="a", labels={"x": "y"})]}).encode()
        changed = source.list_pods()
        assert changed is not first and changed[0].labels == {"x": "y"}
        kubelet.body = b'{"items": []}'
        with pytest.raises(PodsUnavailable, match="empty"):
            source.list_pods()
        with pytest.raises(PodsUnavailable, match="empty"):  # an empty list is never kept
            source.list_pods()
        kubelet.body = json.dumps({"items": [pod(name="a", labels={"x": "y"})]}).encode()
        assert source.list_pods() is changed
    finally:
        kubelet.server.shutdown()


def test_secure_url_from_the_node_and_missing_node():
    source = KubeletPodsSource(lambda: node(port=10250, address="fd00::1"), LAYOUT)
    assert source.url() == "https://[fd00::1]:10250/pods/"
    with pytest.raises(PodsUnavailable, match="ExternalIP"):
        KubeletPodsSource(lambda: node(), LAYOUT, address_type="ExternalIP").url()
    with pytest.raises(PodsUnavailable, match="Node object"):
        KubeletPodsSource(lambda: None, LAYOUT).url()
    with pytest.raises(PodsUnavailable, match="Port"):
        KubeletPodsSource(lambda: node(), LAYOUT).url()


@pytest.mark.parametrize("path, code", [("/pods/", 200), ("/configz", 404)])
def test_every_kubelet_answer_is_observed_with_its_path_and_code(path, code):
    kubelet = Kubelet(json.dumps({"items": [pod(name="a")]}).encode())
    seen: list[tuple[str, str, int, float]] = []
    try:
        source = KubeletPodsSource(lambda: node(), LAYOUT, insecure_tls=True,
                                   read_only_port=kubelet.port, observe=lambda *a: seen.append(a))
        try:
            source.fetch(path)
        except PodsUnavailable:
            assert code != 200
    finally:
        kubelet.server.shutdown()
    [(verb, seen_path, seen_code, seconds)] = seen
    assert (verb, seen_path, seen_code) == ("get", path, code) and 0 <= seconds < 5


def test_an_unreachable_kubelet_is_not_observed():
    seen: list[tuple] = []
    source = KubeletPodsSource(lambda: node(), LAYOUT, insecure_tls=True,
                               read_only_port=free_port(), observe=lambda *a: seen.append(a))
    with pytest.raises(PodsUnavailable):
        source.fetch("/pods/")
    assert seen == []  # no answer, as upstream records only responses


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
