"""Context conversions: request proto -> context -> proto, response context -> proto -> context."""

import dataclasses

import pytest

from koord.apis.runtime.v1alpha1 import api_pb2
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KoordQoS, KubeQoS, Resources
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    ContainerResponse,
    HookPodMeta,
    PodContext,
    PodRequest,
    PodResponse,
)

META = api_pb2.PodSandboxMetadata(name="web", namespace="prod", uid="u-1", attempt=2)
FULL_RES = api_pb2.LinuxContainerResources(
    cpu_period=100000, cpu_quota=-1, cpu_shares=512, memory_limit_in_bytes=2147483648,
    cpuset_cpus="0-3", cpuset_mems="0", unified={"memory.high": "1G"})

POD_REQUESTS = {
    "empty": api_pb2.PodSandboxHookRequest(),
    "meta only": api_pb2.PodSandboxHookRequest(pod_meta=META),
    "full": api_pb2.PodSandboxHookRequest(
        pod_meta=META, runtime_handler="runc", labels={"koordinator.sh/qosClass": "LSR"},
        annotations={"a": "1"}, cgroup_parent="/kubepods/burstable/podu-1",
        overhead=api_pb2.LinuxContainerResources(cpu_shares=10), resources=FULL_RES),
}

CONTAINER_REQUESTS = {
    "empty": api_pb2.ContainerResourceHookRequest(),
    "full": api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=api_pb2.ContainerMetadata(name="c1", attempt=1, id="abc"),
        container_annotations={"x": "y"}, container_resources=FULL_RES,
        pod_resources=api_pb2.LinuxContainerResources(cpu_shares=1024),
        pod_annotations={"p": "q"}, pod_labels={"koordinator.sh/qosClass": "BE"},
        pod_cgroup_parent="/kubepods/besteffort/podu-1", container_envs={"A": "1", "B": ""}),
}


@pytest.mark.parametrize("msg", POD_REQUESTS.values(), ids=POD_REQUESTS.keys())
def test_pod_request_round_trip(msg):
    assert PodContext.from_proto(msg).request.to_proto() == msg


@pytest.mark.parametrize("msg", CONTAINER_REQUESTS.values(), ids=CONTAINER_REQUESTS.keys())
def test_container_request_round_trip(msg):
    assert ContainerContext.from_proto(msg).request.to_proto() == msg


@pytest.mark.parametrize("field,proto_field", [
    ("cpu_period", "cpu_period"), ("cpu_quota", "cpu_quota"), ("cpu_shares", "cpu_shares"),
    ("memory_limit", "memory_limit_in_bytes"), ("cpuset_cpus", "cpuset_cpus"),
    ("cpuset_mems", "cpuset_mems"),
])
def test_zero_values_become_none_and_back(field, proto_field):
    res = Resources.from_proto(api_pb2.LinuxContainerResources())
    assert getattr(res, field) is None
    assert res.is_empty()
    assert res.to_proto() is None
    setattr(res, field, "1" if "cpuset" in field else 7)
    assert getattr(res.to_proto(), proto_field) in ("1", 7)


def test_quota_minus_one_is_a_value_not_zero():
    assert Resources.from_proto(api_pb2.LinuxContainerResources(cpu_quota=-1)).cpu_quota == -1


def test_bvt_never_travels_on_the_wire():
    assert Resources(cpu_bvt_warp_ns=2).to_proto() is None
    assert not Resources(cpu_bvt_warp_ns=2).is_empty()


POD_RESPONSES = {
    "nothing": PodResponse(),
    "labels+annotations": PodResponse(labels={"l": "1"}, annotations={"a": "2"}),
    "cgroup parent": PodResponse(cgroup_parent="/kubepods/pod1"),
    "resources": PodResponse(resources=Resources(cpu_shares=512, cpu_quota=-1)),
}


@pytest.mark.parametrize("resp", POD_RESPONSES.values(), ids=POD_RESPONSES.keys())
def test_pod_response_round_trip(resp):
    ctx = PodContext(PodRequest(), resp)
    assert PodResponse.from_proto(ctx.to_proto()) == resp


CONTAINER_RESPONSES = {
    "nothing": ContainerResponse(),
    "envs": ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": "0,1"}),
    "annotations": ContainerResponse(annotations={"a": "b"}),
    "resources": ContainerResponse(resources=Resources(cpuset_cpus="0", cpu_quota=-1)),
    "pod cgroup parent": ContainerResponse(pod_cgroup_parent="/kubepods/x"),
}


@pytest.mark.parametrize("resp", CONTAINER_RESPONSES.values(), ids=CONTAINER_RESPONSES.keys())
def test_container_response_round_trip(resp):
    ctx = ContainerContext(ContainerRequest(), resp)
    assert ContainerResponse.from_proto(ctx.to_proto()) == resp


def test_empty_response_is_empty_message():
    assert PodContext(PodRequest()).to_proto().ByteSize() == 0
    assert ContainerContext(ContainerRequest()).to_proto().ByteSize() == 0


def test_merge_later_wins_and_keeps_the_rest():
    a = ContainerResponse(envs={"A": "1", "B": "1"}, resources=Resources(cpu_shares=2, cpu_quota=5))
    a.merge(ContainerResponse(envs={"B": "2"}, resources=Resources(cpu_quota=-1)))
    assert a.envs == {"A": "1", "B": "2"}
    assert (a.resources.cpu_shares, a.resources.cpu_quota) == (2, -1)
    p = PodResponse(cgroup_parent="/a")
    p.merge(PodResponse())
    assert p.cgroup_parent == "/a"


@pytest.mark.parametrize("labels,qos", [
    ({"koordinator.sh/qosClass": "LSR"}, KoordQoS.LSR),
    ({"koordinator.sh/qosClass": "BE"}, KoordQoS.BE),
    ({"koordinator.sh/qosClass": "bogus"}, KoordQoS.NONE),
    ({}, KoordQoS.NONE),
])
def test_koord_qos(labels, qos):
    assert PodRequest(labels=labels).koord_qos is qos
    assert ContainerRequest(pod_labels=labels).koord_qos is qos


@pytest.mark.parametrize("parent,qos", [
    ("/kubepods/besteffort/pod1", KubeQoS.BESTEFFORT),
    ("kubepods-burstable-pod1.slice", KubeQoS.BURSTABLE),
    ("/kubepods/pod1", KubeQoS.GUARANTEED),
])
def test_kube_qos(parent, qos):
    assert PodRequest(cgroup_parent=parent).kube_qos is qos


def test_pod_meta_str_names_namespace_and_name():
    assert str(HookPodMeta.from_proto(META)) == "prod/web"


EVERY_FIELD = api_pb2.LinuxContainerResources(
    cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=1 << 30, oom_score_adj=-998,
    cpuset_cpus="0-3", cpuset_mems="0", unified={"memory.high": "1G"}, memory_swap_limit_in_bytes=2 << 30,
    hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=1 << 21),
                     api_pb2.HugepageLimit(page_size="1GB", limit=1 << 30)])


def test_resources_carry_every_field_of_the_protocol():
    unset = [f.name for f in EVERY_FIELD.DESCRIPTOR.fields if not getattr(EVERY_FIELD, f.name)]
    assert unset == [], "EVERY_FIELD must set every field of the message"
    res = Resources.from_proto(EVERY_FIELD)
    assert (res.memory_swap_limit, res.oom_score_adj) == (2 << 30, -998)
    assert res.hugepage_limits == {"2MB": 1 << 21, "1GB": 1 << 30}
    assert res.to_proto() == EVERY_FIELD


def test_a_later_plugin_refines_hugepages_and_keeps_the_rest():
    a = Resources(hugepage_limits={"2MB": 1}, memory_swap_limit=5)
    a.update(Resources(hugepage_limits={"1GB": 2}, oom_score_adj=7))
    assert (a.hugepage_limits, a.memory_swap_limit, a.oom_score_adj) == ({"2MB": 1, "1GB": 2}, 5, 7)


@pytest.mark.parametrize("through_proxy, answer_parent, want_dir", [
    (True, "", "kubepods/besteffort/podu1"),
    (True, "/kubepods/burstable/podu1", "kubepods/burstable/podu1"),
    (False, "/kubepods/burstable/podu1", "kubepods/besteffort/podu1"),  # the cgroup exists already
])
def test_pod_cgroup_update_is_the_pods_resources_in_its_cgroup(tmp_path, through_proxy, answer_parent, want_dir):
    ctx = PodContext(PodRequest(cgroup_parent="/kubepods/besteffort/podu1"))
    executor = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    assert ctx.cgroup_update(executor, through_proxy=through_proxy) is None, "nothing to write"
    ctx.response.cgroup_parent = answer_parent or None
    ctx.response.resources = Resources(cpu_shares=512, cpu_bvt_warp_ns=-1)
    update = ctx.cgroup_update(executor, through_proxy=through_proxy)
    assert update is not None and update.cgroup_dir == want_dir
    assert update.resources == Resources(cpu_shares=512, cpu_bvt_warp_ns=-1)


@pytest.mark.parametrize("through_proxy, want", [
    (True, Resources(cpu_bvt_warp_ns=-1)),                     # the proxy applies the rest through CRI
    (False, Resources(cpu_shares=512, cpu_bvt_warp_ns=-1)),    # nobody else writes it in Standalone mode
])
def test_container_cgroup_update(tmp_path, through_proxy, want):
    ctx = ContainerContext(ContainerRequest(pod_cgroup_parent="/kubepods/besteffort/podu1", container_id="c1"))
    ctx.response.resources = Resources(cpu_shares=512, cpu_bvt_warp_ns=-1)
    update = ctx.cgroup_update(CgroupExecutor(CgroupLayout(tmp_path, version=1)), through_proxy=through_proxy)
    assert update is not None and update.resources == want
    assert update.cgroup_dir.endswith("podu1/c1")
    ctx.request.container_id = ""
    assert ctx.cgroup_update(CgroupExecutor(CgroupLayout(tmp_path, version=1)), through_proxy=through_proxy) is None


def _mutable_parts(obj):
    """Every dict and dataclass inside ``obj``'s fields, with its path."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, dict):
            yield f.name, value
        elif dataclasses.is_dataclass(value):
            yield f.name, value
            yield from ((f"{f.name}.{path}", part) for path, part in _mutable_parts(value))


@pytest.mark.parametrize("resp", [
    PodResponse(labels={"l": "1"}, annotations={"a": "2"}, cgroup_parent="/p",
                resources=Resources.from_proto(EVERY_FIELD)),
    ContainerResponse(annotations={"a": "b"}, envs={"E": "1"}, pod_cgroup_parent="/p",
                      resources=Resources.from_proto(EVERY_FIELD)),
], ids=["pod", "container"])
def test_response_copy_is_equal_and_shares_nothing_mutable(resp):
    copied = resp.copy()
    assert copied == resp and type(copied) is type(resp)
    shared = [path for (path, a), (_, b) in zip(_mutable_parts(resp), _mutable_parts(copied), strict=True)
              if a is b]
    assert shared == []
