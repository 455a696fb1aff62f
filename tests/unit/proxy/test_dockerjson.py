"""Docker JSON <-> hook messages: names, labels, resources, envs, and the merge rules in Docker shape."""

from __future__ import annotations

import json

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.runtimeproxy import convert
from koord.runtimeproxy.dockerserver import dockerjson as dj
from koord.runtimeproxy.dockerserver.intercept import split_target
from koord.runtimeproxy.dockerserver.server import _RESOURCES, _VERBS, _label

SANDBOX_NAME = "k8s_POD_web_prod_0f0e-uid_2"
CONTAINER_NAME = "k8s_app_web_prod_0f0e-uid_2"


def _sandbox_body() -> dict:
    return {
        "Image": "pause",
        "Labels": {"io.kubernetes.docker.type": "podsandbox", "app": "web",
                   "annotation.team": "a", "annotation.koord/x": "1"},
        "HostConfig": {"CgroupParent": "/kubepods/besteffort/pod0f0e-uid", "CpuShares": 2, "Memory": 0,
                       "CpusetCpus": "", "OomScoreAdj": -998},
    }


def _container_body() -> dict:
    return {
        "Image": "app",
        "Env": ["FIRST=1", "GREETING=hello", "BARE", "LAST=2"],
        "Labels": {"io.kubernetes.docker.type": "container", "io.kubernetes.sandbox.id": "sb1",
                   "io.kubernetes.container.name": "app", "annotation.note": "n"},
        "HostConfig": {"CgroupParent": "/kubepods/besteffort/pod0f0e-uid", "CpuShares": 512,
                       "Memory": 64 << 20, "MemorySwap": 64 << 20, "CpuQuota": 0, "CpuPeriod": 100000},
    }


def test_parse_name() -> None:
    assert dj.parse_name("/" + SANDBOX_NAME) == dj.KubeName("POD", "web", "prod", "0f0e-uid", 2)
    assert dj.parse_name(CONTAINER_NAME + "_f00d") == dj.KubeName("app", "web", "prod", "0f0e-uid", 2)


@pytest.mark.parametrize("name", ["", "plain", "k8s_a_b_c_d", "k8s_a_b_c_d_x", "x8s_a_b_c_d_1", "k8s__b_c_d_1",
                                  "k8s_a_b_c_d_4294967296", "k8s_a_b_c_d_١", "k8s_a_b_c_d_1_2_3"])
def test_parse_name_refuses(name: str) -> None:
    with pytest.raises(dj.DockerJSONError, match="container name"):
        dj.parse_name(name)


@given(st.text(max_size=200))
def test_parse_name_raises_only_its_own_error(name: str) -> None:
    try:
        parsed = dj.parse_name(name)
    except dj.DockerJSONError:
        return
    rebuilt = f"k8s_{parsed.container}_{parsed.pod}_{parsed.namespace}_{parsed.uid}_{parsed.attempt}"
    assert name.removeprefix("/").startswith(rebuilt.rsplit("_", 1)[0])


@given(st.text(alphabet=st.characters(blacklist_characters="_/"), min_size=1, max_size=20).filter(str.strip),
       st.integers(0, (1 << 32) - 1))
def test_parse_name_round_trips(part: str, attempt: int) -> None:
    assert dj.parse_name(f"k8s_{part}_{part}_{part}_{part}_{attempt}") == dj.KubeName(part, part, part, part, attempt)


def test_pod_request_from_a_sandbox_create_body() -> None:
    view = dj.ContainerView.of_create(_sandbox_body(), SANDBOX_NAME)
    assert view.kind == dj.SANDBOX_TYPE
    pod = dj.pod_request(view)
    assert (pod.pod_meta.name, pod.pod_meta.namespace, pod.pod_meta.uid, pod.pod_meta.attempt) == (
        "web", "prod", "0f0e-uid", 2)
    assert dict(pod.labels) == {"io.kubernetes.docker.type": "podsandbox", "app": "web"}
    assert dict(pod.annotations) == {"team": "a", "koord/x": "1"}
    assert pod.cgroup_parent == "/kubepods/besteffort/pod0f0e-uid"
    assert (pod.resources.cpu_shares, pod.resources.oom_score_adj) == (2, -998)


def test_inspect_and_create_give_the_same_record() -> None:
    body = _container_body()
    inspect = {"Id": "c1", "Name": "/" + CONTAINER_NAME, "HostConfig": body["HostConfig"],
               "Config": {"Labels": body["Labels"], "Env": body["Env"]}}
    created = dj.container_record(dj.ContainerView.of_create(body, CONTAINER_NAME), "c1")
    assert dj.container_record(dj.ContainerView.of_inspect(inspect), "c1") == created
    assert dict(created.container_envs) == {"FIRST": "1", "GREETING": "hello", "BARE": "", "LAST": "2"}
    assert created.container_meta == hook.ContainerMetadata(name="app", attempt=2, id="c1")
    assert dict(created.container_annotations) == {"note": "n"}


def test_pod_answer_merges_into_labels_and_host_config_only_where_set() -> None:
    body = _sandbox_body()
    view = dj.ContainerView.of_create(body, SANDBOX_NAME)
    pod = dj.pod_request(view)
    before = hook.PodSandboxHookRequest()
    before.CopyFrom(pod)
    convert.merge_pod_response(pod, hook.PodSandboxHookResponse(
        labels={"hooked": "yes"}, annotations={"team": "b"}, cgroup_parent="",
        resources=hook.LinuxContainerResources(cpu_shares=300, cpuset_cpus="0-1")))
    dj.apply_pod(view, before, pod)
    assert body["Labels"] == {**_sandbox_body()["Labels"], "hooked": "yes", "annotation.team": "b"}
    assert body["HostConfig"] == {**_sandbox_body()["HostConfig"], "CpuShares": 300, "CpusetCpus": "0-1"}


def test_container_answer_merges_envs_in_place_and_swap_follows_memory() -> None:
    body = _container_body()
    view = dj.ContainerView.of_create(body, CONTAINER_NAME)
    request = dj.container_record(view)
    before = hook.ContainerResourceHookRequest()
    before.CopyFrom(request)
    convert.merge_container_response(request, hook.ContainerResourceHookResponse(
        container_envs={"GREETING": "hooked", "ADDED": "1"}, container_annotations={"koord": "x"},
        pod_cgroup_parent="/kubepods/pod-new",
        container_resources=hook.LinuxContainerResources(memory_limit_in_bytes=128 << 20)))
    dj.apply_container(view, before, request)
    assert body["Env"] == ["FIRST=1", "GREETING=hooked", "BARE", "LAST=2", "ADDED=1"]
    assert body["Labels"]["annotation.koord"] == "x" and body["Labels"]["annotation.note"] == "n"
    assert body["HostConfig"]["CgroupParent"] == "/kubepods/pod-new"
    assert (body["HostConfig"]["Memory"], body["HostConfig"]["MemorySwap"]) == (128 << 20, 128 << 20)
    assert body["HostConfig"]["CpuShares"] == 512  # unanswered: kept


def test_no_answer_changes_nothing() -> None:
    body = _container_body()
    view = dj.ContainerView.of_create(body, CONTAINER_NAME)
    request = dj.container_record(view)
    dj.apply_container(view, request, request)
    assert body == _container_body()


def test_update_body_has_only_changed_fields() -> None:
    before = hook.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=10, oom_score_adj=5)
    after = hook.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=20, cpu_quota=-1, oom_score_adj=7)
    assert dj.update_body(before, after) == {"Memory": 20, "CpuQuota": -1}


@pytest.mark.parametrize("body,where", [
    ({"Labels": []}, "Labels"), ({"Labels": {"a": 1}}, "Labels['a']"), ({"Env": "A=1"}, "Env"),
    ({"HostConfig": {"CpuShares": "2"}}, "HostConfig.CpuShares"),
    ({"HostConfig": {"Memory": 1 << 64}}, "HostConfig.Memory"), ({"HostConfig": {"CpuQuota": True}}, "CpuQuota"),
    ({"HostConfig": {"CpusetCpus": 3}}, "HostConfig.CpusetCpus"), ({"HostConfig": 7}, "HostConfig"),
    ({"HostConfig": {"CgroupParent": 7}}, "CgroupParent"),
])
def test_bad_fields_are_named(body: dict, where: str) -> None:
    with pytest.raises(dj.DockerJSONError, match=where.replace("[", r"\[").replace("]", r"\]")):
        view = dj.ContainerView.of_create(body, CONTAINER_NAME)
        dj.container_record(view)
        dj.pod_request(view)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=4), max_leaves=20)
KEYS = st.sampled_from(["Labels", "Env", "HostConfig", "Config", "Name", "Id", "CpuShares", "Memory", "CgroupParent",
                        "io.kubernetes.docker.type", "annotation.x", "CpusetCpus"])
DOCKERISH = st.dictionaries(KEYS, JSON | st.dictionaries(KEYS, JSON, max_size=6), max_size=6)


@settings(max_examples=300)
@given(st.one_of(DOCKERISH, JSON), st.text(max_size=60))
def test_converter_raises_only_its_own_error(value, name: str) -> None:
    raw = json.dumps(value).encode()
    try:
        body = dj.decode_object(raw, "body")
        for view in (dj.ContainerView.of_create(body, name), dj.ContainerView.of_inspect(body)):
            dj.pod_request(view)
            dj.container_record(view, "id")
    except dj.DockerJSONError as exc:
        assert str(exc)


@given(st.binary(max_size=200))
def test_decode_object_raises_only_its_own_error(raw: bytes) -> None:
    try:
        assert isinstance(dj.decode_object(raw, "body"), dict)
    except dj.DockerJSONError:
        pass


def test_decode_object_survives_deep_nesting() -> None:
    with pytest.raises(dj.DockerJSONError, match="not JSON"):
        dj.decode_object(b"[" * 100000, "body")


@pytest.mark.parametrize("target,path,query", [
    (b"/v1.41/containers/create?name=x", b"/containers/create", b"name=x"),
    (b"/containers/abc/start", b"/containers/abc/start", b""),
    (b"/v1/containers/json", b"/containers/json", b""),
    (b"/version", b"/version", b""),
    (b"/v1.41", b"/v1.41", b""),
])
def test_split_target(target: bytes, path: bytes, query: bytes) -> None:
    assert split_target(target) == (path, query)


@pytest.mark.parametrize("method,target,label", [
    (b"GET", b"/v1.41/containers/json?all=1", "docker GET /containers/json"),
    (b"POST", b"/v1.41/containers/0123abcd/start", "docker POST /containers/{id}/start"),
    (b"DELETE", b"/v1.41/containers/k8s_POD_a_b_c_0", "docker DELETE /containers/{id}"),
    (b"GET", b"/v1.41/images/docker.io/koord/pause:test/json", "docker GET /images/{id}/json"),
    (b"HEAD", b"/_ping", "docker HEAD /_ping"),
    (b"GET", b"/v1.41/containers/x/%00weird", "docker GET /containers/{id}"),
    (b"GET", b"/v1.41/images/docker.io/koord/pause:test/json", "docker GET /images/{id}/json"),
    (b"POST", b"/v1.41/whatever/x", "docker POST /…/{id}"),
])
def test_metric_labels_carry_no_ids(method: bytes, target: bytes, label: str) -> None:
    assert _label(h11.Request(method=method, target=target, headers=[("Host", "d")])) == label


@given(st.lists(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="/?"),
                       min_size=1, max_size=12), max_size=5))
def test_metric_label_vocabulary_is_bounded(segments: list[str]) -> None:
    label = _label(h11.Request(method=b"GET", target=("/" + "/".join(segments)).encode(), headers=[("Host", "d")]))
    tokens = [t for t in label.split(" ", 2)[2].split("/") if t]
    assert all(t in _RESOURCES or t in _VERBS or t in ("…", "{id}") for t in tokens), label
