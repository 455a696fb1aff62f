"""CRI status → hook requests: the one builder for the proxy's store and koordlet's reconciler."""

from __future__ import annotations

import json

import pytest
from cri_api.v1 import api_pb2 as cri

from koord.hookapi import fromcri
from koord.hookapi.fromcri import StatusError

CONFIG = {"metadata": {"name": "c1", "attempt": 1}, "annotations": {"a": "1"},
          "envs": [{"key": "A", "value": "1"}],
          "linux": {"resources": {"cpu_shares": 2, "memory_limit_in_bytes": 1024}}}


def container_status(config: dict | None = CONFIG, current: cri.LinuxContainerResources | None = None,
                     info: dict | None = None, raw: str | None = None) -> cri.ContainerStatusResponse:
    body = {"sandboxID": "p1", "config": config} if info is None else info
    status = cri.ContainerStatus(id="c1")
    if current is not None:
        status.resources.linux.CopyFrom(current)
    return cri.ContainerStatusResponse(status=status, info={"info": raw if raw is not None else json.dumps(body)})


@pytest.mark.parametrize("config_swap, current, want_swap, want_memory", [
    (None, None, 0, 1024),                                                              # no status resources
    (None, cri.LinuxContainerResources(memory_limit_in_bytes=1024, memory_swap_limit_in_bytes=1024), 0, 1024),
    (None, cri.LinuxContainerResources(memory_limit_in_bytes=4096, memory_swap_limit_in_bytes=4096), 0, 4096),
    (None, cri.LinuxContainerResources(memory_limit_in_bytes=4096, memory_swap_limit_in_bytes=8192), 8192, 4096),
    (2048, cri.LinuxContainerResources(memory_limit_in_bytes=2048, memory_swap_limit_in_bytes=2048), 2048, 2048),
])
def test_containerd_implicit_swap_is_dropped(config_swap, current, want_swap, want_memory) -> None:
    config = json.loads(json.dumps(CONFIG))
    if config_swap is not None:
        config["linux"]["resources"]["memory_swap_limit_in_bytes"] = config_swap
    sandbox_id, record = fromcri.container_record_from_status(container_status(config, current), "c1")
    assert sandbox_id == "p1"
    assert record.container_resources.memory_swap_limit_in_bytes == want_swap
    assert record.container_resources.memory_limit_in_bytes == want_memory


def test_container_record_carries_the_config() -> None:
    _, record = fromcri.container_record_from_status(container_status(), "c1")
    assert (record.container_meta.name, record.container_meta.id, record.container_meta.attempt) == ("c1", "c1", 1)
    assert record.container_annotations == {"a": "1"} and record.container_envs == {"A": "1"}


def test_camel_case_config_parses_too() -> None:
    config = {"metadata": {"name": "c1"}, "linux": {"resources": {"cpuShares": 7, "cpusetCpus": "0-1"}}}
    _, record = fromcri.container_record_from_status(container_status(config), "c1")
    assert (record.container_resources.cpu_shares, record.container_resources.cpuset_cpus) == (7, "0-1")


def test_pod_record_from_status() -> None:
    config = {"metadata": {"name": "web", "namespace": "prod", "uid": "u1"}, "labels": {"l": "1"},
              "annotations": {"a": "1"}, "linux": {"cgroup_parent": "/kubepods/podu1",
                                                   "resources": {"cpu_shares": 1024}}}
    response = cri.PodSandboxStatusResponse(info={"info": json.dumps({"config": config, "runtimeHandler": "runc"})})
    pod = fromcri.pod_record_from_status(response, "p1")
    assert (pod.pod_meta.namespace, pod.pod_meta.name, pod.pod_meta.uid) == ("prod", "web", "u1")
    assert (pod.cgroup_parent, pod.runtime_handler, pod.resources.cpu_shares) == ("/kubepods/podu1", "runc", 1024)
    assert dict(pod.labels) == {"l": "1"} and dict(pod.annotations) == {"a": "1"}


@pytest.mark.parametrize("response, problem", [
    (container_status(raw=""), "no verbose info"),
    (container_status(raw="{not json"), "not JSON"),
    (container_status(raw="[1]"), "not a JSON object"),
    (container_status(raw="[" * 100000), "not JSON"),
    (container_status(info={"sandboxID": "p1"}), "has no config"),
    (container_status(info={"sandboxID": "p1", "config": {"linux": {"resources": {"cpu_shares": "x"}}}}),
     "does not parse"),
    (container_status(info={"config": CONFIG}), "names no sandboxID"),
    (container_status(info={"sandboxID": 5, "config": CONFIG}), "names no sandboxID"),
])
def test_bad_status_names_the_container(response: cri.ContainerStatusResponse, problem: str) -> None:
    with pytest.raises(StatusError) as info:
        fromcri.container_record_from_status(response, "c1")
    assert problem in str(info.value) and "container c1" in str(info.value)
