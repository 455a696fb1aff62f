"""Table tests for the request -> hook request conversion, the merge rules and validation."""

from __future__ import annotations

import pytest
from cri_api.v1 import api_pb2 as cri

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import fromcri
from koord.runtimeproxy import convert


def test_resources_share_field_numbers_with_cri() -> None:
    ours = {f.number: (f.name, f.type, f.is_repeated) for f in hook.LinuxContainerResources.DESCRIPTOR.fields}
    theirs = {f.number: (f.name, f.type, f.is_repeated) for f in cri.LinuxContainerResources.DESCRIPTOR.fields}
    assert {n: ours[n] for n in theirs} == theirs


def _run_pod_request() -> cri.RunPodSandboxRequest:
    return cri.RunPodSandboxRequest(
        runtime_handler="runc",
        config=cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name="web", uid="u1", namespace="ns", attempt=2),
            labels={"app": "web"}, annotations={"a": "1"},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent="/kubepods/besteffort/podu1",
                overhead=cri.LinuxContainerResources(cpu_shares=10),
                resources=cri.LinuxContainerResources(cpu_quota=50000, memory_limit_in_bytes=1 << 30)),
        ))


def test_pod_hook_request_carries_every_field() -> None:
    got = fromcri.pod_hook_request(_run_pod_request())
    assert got == hook.PodSandboxHookRequest(
        pod_meta=hook.PodSandboxMetadata(name="web", uid="u1", namespace="ns", attempt=2),
        runtime_handler="runc", labels={"app": "web"}, annotations={"a": "1"},
        cgroup_parent="/kubepods/besteffort/podu1",
        overhead=hook.LinuxContainerResources(cpu_shares=10),
        resources=hook.LinuxContainerResources(cpu_quota=50000, memory_limit_in_bytes=1 << 30))


def test_container_hook_request_joins_pod_and_container() -> None:
    pod = fromcri.pod_hook_request(_run_pod_request())
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="c1", attempt=1), annotations={"ca": "x"},
        envs=[cri.KeyValue(key="A", value="1"), cri.KeyValue(key="B", value="2")],
        linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(cpu_shares=512)))
    got = fromcri.container_hook_request(pod, fromcri.container_record(config, "cid"))
    assert got.pod_meta == pod.pod_meta
    assert got.container_meta == hook.ContainerMetadata(name="c1", attempt=1, id="cid")
    assert dict(got.container_annotations) == {"ca": "x"}
    assert dict(got.container_envs) == {"A": "1", "B": "2"}
    assert got.container_resources.cpu_shares == 512
    assert got.pod_resources == pod.resources
    assert dict(got.pod_labels) == {"app": "web"} and dict(got.pod_annotations) == {"a": "1"}
    assert got.pod_cgroup_parent == "/kubepods/besteffort/podu1"


R = hook.LinuxContainerResources
MERGE_CASES = [
    # (name, before, answer, after, changed fields)
    ("zero answer changes nothing", R(cpu_quota=100, cpu_shares=2), R(), R(cpu_quota=100, cpu_shares=2), []),
    ("quota -1 is unlimited, taken", R(cpu_quota=100), R(cpu_quota=-1), R(cpu_quota=-1), ["r.cpu_quota"]),
    ("positive values replace", R(cpu_shares=2), R(cpu_shares=512, cpu_period=100000, memory_limit_in_bytes=5),
     R(cpu_shares=512, cpu_period=100000, memory_limit_in_bytes=5),
     ["r.cpu_period", "r.cpu_shares", "r.memory_limit_in_bytes"]),
    ("negative shares ignored", R(cpu_shares=2), R(cpu_shares=-5), R(cpu_shares=2), []),
    ("oom in range taken", R(), R(oom_score_adj=-998), R(oom_score_adj=-998), ["r.oom_score_adj"]),
    ("oom out of range ignored", R(oom_score_adj=3), R(oom_score_adj=5000), R(oom_score_adj=3), []),
    ("cpuset replaces", R(cpuset_cpus="0-7"), R(cpuset_cpus="2", cpuset_mems="0"),
     R(cpuset_cpus="2", cpuset_mems="0"), ["r.cpuset_cpus", "r.cpuset_mems"]),
    ("same value is no change", R(cpu_shares=512), R(cpu_shares=512), R(cpu_shares=512), []),
    ("unified map-merged", R(unified={"a.b": "1", "c.d": "2"}), R(unified={"c.d": "3", "e.f": "4"}),
     R(unified={"a.b": "1", "c.d": "3", "e.f": "4"}), ["r.unified[c.d]", "r.unified[e.f]"]),
    ("swap > 0 taken", R(), R(memory_swap_limit_in_bytes=7), R(memory_swap_limit_in_bytes=7),
     ["r.memory_swap_limit_in_bytes"]),
    ("hugepages replace", R(), R(hugepage_limits=[hook.HugepageLimit(page_size="2MB", limit=4)]),
     R(hugepage_limits=[hook.HugepageLimit(page_size="2MB", limit=4)]), ["r.hugepage_limits"]),
]


@pytest.mark.parametrize("name,before,answer,after,changed", MERGE_CASES, ids=[c[0] for c in MERGE_CASES])
def test_merge_resources(name, before, answer, after, changed) -> None:
    dst = R()
    dst.CopyFrom(before)
    assert convert.merge_resources(dst, answer, "r") == changed
    assert dst == after


def test_merge_pod_response() -> None:
    req = fromcri.pod_hook_request(_run_pod_request())
    changed = convert.merge_pod_response(req, hook.PodSandboxHookResponse(
        labels={"app": "web", "new": "1"}, annotations={"a": "2"}, cgroup_parent="/kubepods/x",
        resources=R(cpu_shares=100)))
    assert changed == ["labels[new]", "annotations[a]", "cgroup_parent", "resources.cpu_shares"]
    assert dict(req.labels) == {"app": "web", "new": "1"} and dict(req.annotations) == {"a": "2"}
    assert req.cgroup_parent == "/kubepods/x" and req.resources.cpu_quota == 50000
    assert convert.merge_pod_response(req, hook.PodSandboxHookResponse(cgroup_parent="")) == []


def test_merge_container_response() -> None:
    req = hook.ContainerResourceHookRequest(container_envs={"A": "1"}, pod_cgroup_parent="/p")
    changed = convert.merge_container_response(req, hook.ContainerResourceHookResponse(
        container_annotations={"k": "v"}, container_resources=R(cpuset_cpus="1"),
        pod_cgroup_parent="/q", container_envs={"A": "2", "B": "3"}))
    assert changed == ["container_annotations[k]", "container_resources.cpuset_cpus", "pod_cgroup_parent",
                       "container_envs[A]", "container_envs[B]"]
    assert dict(req.container_envs) == {"A": "2", "B": "3"}


ENV_CASES = [
    ("nothing wanted", [("A", "1")], {}, [("A", "1")]),
    ("update in place keeps order", [("B", "1"), ("A", "2"), ("C", "$(B)")], {"A": "x"},
     [("B", "1"), ("A", "x"), ("C", "$(B)")]),
    ("new keys appended sorted", [("Z", "1")], {"Y": "2", "X": "3", "Z": "1"}, [("Z", "1"), ("X", "3"), ("Y", "2")]),
    ("duplicates all updated", [("A", "1"), ("A", "2")], {"A": "3"}, [("A", "3"), ("A", "3")]),
]


@pytest.mark.parametrize("name,envs,wanted,after", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_merge_envs(name, envs, wanted, after) -> None:
    config = cri.ContainerConfig(envs=[cri.KeyValue(key=k, value=v) for k, v in envs])
    convert.merge_envs(config.envs, wanted)
    assert [(kv.key, kv.value) for kv in config.envs] == after


def test_apply_to_run_pod_sandbox_round_trip() -> None:
    req = _run_pod_request()
    pod = fromcri.pod_hook_request(req)
    convert.merge_pod_response(pod, hook.PodSandboxHookResponse(
        labels={"l": "1"}, cgroup_parent="/kubepods/y", resources=R(cpuset_cpus="3")))
    convert.apply_to_run_pod_sandbox(req, pod)
    assert req.config.labels["l"] == "1" and req.config.labels["app"] == "web"
    assert req.config.linux.cgroup_parent == "/kubepods/y"
    assert req.config.linux.resources.cpuset_cpus == "3" and req.config.linux.resources.cpu_quota == 50000
    assert req.config.linux.overhead.cpu_shares == 10
    assert fromcri.pod_hook_request(req) == pod


def test_apply_to_create_container() -> None:
    req = cri.CreateContainerRequest(
        pod_sandbox_id="s", config=cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name="c"), envs=[cri.KeyValue(key="PATH", value="/bin")],
            annotations={"x": "1"}),
        sandbox_config=cri.PodSandboxConfig(linux=cri.LinuxPodSandboxConfig(cgroup_parent="/a")))
    request = fromcri.container_hook_request(
        fromcri.pod_record_from_config(req.sandbox_config), fromcri.container_record(req.config))
    convert.merge_container_response(request, hook.ContainerResourceHookResponse(
        container_envs={"NVIDIA_VISIBLE_DEVICES": "0,1"}, container_resources=R(cpu_shares=512),
        container_annotations={"y": "2"}, pod_cgroup_parent="/b"))
    convert.apply_to_create_container(req, request)
    assert [(kv.key, kv.value) for kv in req.config.envs] == [("PATH", "/bin"), ("NVIDIA_VISIBLE_DEVICES", "0,1")]
    assert req.config.linux.resources.cpu_shares == 512
    assert dict(req.config.annotations) == {"x": "1", "y": "2"}
    assert req.sandbox_config.linux.cgroup_parent == "/b"


def test_apply_to_update_resources_keeps_request_annotations_only() -> None:
    req = cri.UpdateContainerResourcesRequest(container_id="c", linux=cri.LinuxContainerResources(cpu_shares=2),
                                              annotations={"a": "1"})
    final = hook.ContainerResourceHookRequest(container_resources=R(cpu_shares=1024),
                                              container_annotations={"a": "2", "b": "3"})
    convert.apply_to_update_resources(req, final)
    assert req.linux.cpu_shares == 1024 and dict(req.annotations) == {"a": "2"}


VALIDATION_CASES = [
    ("good", hook.ContainerResourceHookResponse(container_resources=R(cpu_quota=-1, cpuset_cpus="0-3,5",
                                                                      unified={"memory.max": "1"})), []),
    ("bad cpuset", hook.ContainerResourceHookResponse(container_resources=R(cpuset_cpus="0-a")), ["cpuset_cpus"]),
    ("reversed range", hook.ContainerResourceHookResponse(container_resources=R(cpuset_cpus="3-1")), ["cpuset_cpus"]),
    ("negative shares", hook.ContainerResourceHookResponse(container_resources=R(cpu_shares=-2)), ["cpu_shares"]),
    ("quota below -1", hook.ContainerResourceHookResponse(container_resources=R(cpu_quota=-2)), ["cpu_quota"]),
    ("memory below -1", hook.ContainerResourceHookResponse(container_resources=R(memory_limit_in_bytes=-7)),
     ["memory_limit_in_bytes"]),
    # Non-ASCII digits used to pass (\d), so StartContainer failed later inside runc.
    ("arabic-indic cpu", hook.ContainerResourceHookResponse(container_resources=R(cpuset_cpus="١")), ["cpuset_cpus"]),
    ("arabic-indic range", hook.ContainerResourceHookResponse(container_resources=R(cpuset_mems="٣-٥")),
     ["cpuset_mems"]),
    ("huge cpu range", hook.ContainerResourceHookResponse(container_resources=R(cpuset_cpus="0-4000000000")),
     ["cpuset_cpus"]),
    # What the kernel files accept (koordlet's answer for batch-cpu 1e15 was shares 1.024e15, quota 1e17).
    ("shares above the kernel's", hook.ContainerResourceHookResponse(container_resources=R(cpu_shares=1024 * 10**12)),
     ["cpu_shares"]),
    ("shares below the kernel's", hook.ContainerResourceHookResponse(container_resources=R(cpu_shares=1)),
     ["cpu_shares"]),
    ("largest shares", hook.ContainerResourceHookResponse(container_resources=R(cpu_shares=262144)), []),
    ("quota above the kernel's", hook.ContainerResourceHookResponse(container_resources=R(cpu_quota=10**17)),
     ["cpu_quota"]),
    ("quota below 1 ms", hook.ContainerResourceHookResponse(container_resources=R(cpu_quota=999)), ["cpu_quota"]),
    ("largest quota", hook.ContainerResourceHookResponse(container_resources=R(cpu_quota=2**44 - 1)), []),
    ("int64 max quota", hook.ContainerResourceHookResponse(container_resources=R(cpu_quota=2**63 - 1)),
     ["cpu_quota"]),
    ("period above 1 s", hook.ContainerResourceHookResponse(container_resources=R(cpu_period=1000001)),
     ["cpu_period"]),
    ("period below 1 ms", hook.ContainerResourceHookResponse(container_resources=R(cpu_period=999)), ["cpu_period"]),
    ("int64 max memory", hook.ContainerResourceHookResponse(container_resources=R(memory_limit_in_bytes=2**63 - 1)),
     []),
    ("swap below -1", hook.ContainerResourceHookResponse(container_resources=R(memory_swap_limit_in_bytes=-2)),
     ["memory_swap_limit_in_bytes"]),
    ("oom out of range", hook.ContainerResourceHookResponse(container_resources=R(oom_score_adj=1001)),
     ["oom_score_adj"]),
    ("empty env key", hook.ContainerResourceHookResponse(container_envs={"": "x"}), ["container_envs"]),
    ("env key with =", hook.ContainerResourceHookResponse(container_envs={"A=B": "x"}), ["container_envs"]),
    ("unified key malformed", hook.ContainerResourceHookResponse(container_resources=R(unified={"../x": "1"})),
     ["unified"]),
    ("cgroup parent escapes", hook.ContainerResourceHookResponse(pod_cgroup_parent="/kubepods/../x"),
     ["pod_cgroup_parent"]),
    ("bad page size", hook.ContainerResourceHookResponse(
        container_resources=R(hugepage_limits=[hook.HugepageLimit(page_size="huge")])), ["page_size"]),
]


@pytest.mark.parametrize("name,resp,expected", VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
def test_validate_container_response(name, resp, expected) -> None:
    problems = convert.validate_container_response(resp)
    assert len(problems) == len(expected)
    for problem, word in zip(problems, expected, strict=True):
        assert word in problem


def test_validate_pod_response() -> None:
    assert convert.validate_pod_response(hook.PodSandboxHookResponse(labels={"a": "b"})) == []
    problems = convert.validate_pod_response(hook.PodSandboxHookResponse(
        labels={"": "b"}, resources=R(cpuset_mems="x")))
    assert any("labels" in p for p in problems) and any("cpuset_mems" in p for p in problems)
