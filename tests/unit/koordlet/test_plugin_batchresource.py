"""BatchResource through Hooks: BE pods' shares, quota and memory from extended-resource-spec."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint, parse_quantity
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import Resources
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins.batchresource import BATCH_CFS_QUOTA, BatchResource
from koord.koordlet.runtimehooks.plugins.cpunormalization import CPU_NORMALIZATION_RATIO
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    HookPodMeta,
    KubeQoS,
    PodContext,
    PodRequest,
)
from koord.koordlet.runtimehooks.rule import Rules

SPEC = "node.koordinator.sh/extended-resource-spec"
BE = {"koordinator.sh/qosClass": "BE"}
NO_FS = Path("/nonexistent")


def container(requests: dict | None = None, limits: dict | None = None) -> dict:
    body = {}
    if requests is not None:
        body["requests"] = {f"kubernetes.io/batch-{k}": v for k, v in requests.items()}
    if limits is not None:
        body["limits"] = {f"kubernetes.io/batch-{k}": v for k, v in limits.items()}
    return body


def spec(**containers: dict) -> dict[str, str]:
    return {SPEC: json.dumps({"containers": containers})}


def hooks() -> Hooks:
    h = Hooks(FailurePolicy.FAIL)
    BatchResource(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS)).register(h)
    return h


def run_pod(labels: dict, annotations: dict, period: int | None = None) -> PodContext:
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"), labels=labels,
                                annotations=annotations, cgroup_parent="/kubepods/besteffort/pod1",
                                resources=Resources(cpu_period=period)))
    hooks().run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    return ctx


def run_container(labels: dict, annotations: dict, name: str = "c1",
                  stage: HookPoint = HookPoint.PRE_CREATE_CONTAINER) -> ContainerContext:
    ctx = ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name=name, container_id="cid",
        pod_labels=labels, pod_annotations=annotations, pod_cgroup_parent="/kubepods/besteffort/pod1",
        resources=Resources(cpu_shares=2)))
    hooks().run(stage, ctx)
    return ctx


C1 = container({"cpu": "500", "memory": "2Gi"}, {"cpu": "500", "memory": "2Gi"})


@pytest.mark.parametrize("annotations, expected", [
    # the documented example: 500m / 2Gi
    (spec(c1=C1), Resources(cpu_shares=512, cpu_quota=50000, memory_limit=2147483648)),
    (spec(c1=container({"cpu": 1000}, {"cpu": 2000, "memory": "512Mi"})),
     Resources(cpu_shares=1024, cpu_quota=200000, memory_limit=512 * 2**20)),
    (spec(c1=container({"cpu": "1"}, {})), Resources(cpu_shares=2, cpu_quota=-1, memory_limit=-1)),
    (spec(c1=container({"memory": "1G"}, {"memory": "1G"})),
     Resources(cpu_quota=-1, memory_limit=10**9)),
    (spec(c1=container({"cpu": "5"}, {"cpu": "5"})), Resources(cpu_shares=5, cpu_quota=1000, memory_limit=-1)),
    (spec(c2=C1), Resources()),          # another container's spec
    ({}, Resources()),                   # no annotation
])
def test_container(annotations: dict, expected: Resources) -> None:
    assert run_container(BE, annotations).response.resources == expected


@pytest.mark.parametrize("annotations, expected", [
    (spec(c1=C1, c2=C1), Resources(cpu_shares=1024, cpu_quota=100000, memory_limit=2 * 2147483648)),
    # any container without a limit makes the pod unlimited
    (spec(c1=C1, c2=container({"cpu": "500"}, {"memory": "1Gi"})),
     Resources(cpu_shares=1024, cpu_quota=-1, memory_limit=3 * 2**30)),
    (spec(c1=C1, c2=container({"cpu": "500"}, {"cpu": "500"})),
     Resources(cpu_shares=1024, cpu_quota=100000, memory_limit=-1)),
    (spec(), Resources()),
    ({}, Resources()),
])
def test_pod(annotations: dict, expected: Resources) -> None:
    assert run_pod(BE, annotations).response.resources == expected


def test_pod_uses_the_requested_period() -> None:
    assert run_pod(BE, spec(c1=C1), period=200000).response.resources.cpu_quota == 100000


@pytest.mark.parametrize("labels", [{}, {"koordinator.sh/qosClass": "LS"}, {"koordinator.sh/qosClass": "LSR"}])
def test_only_be_pods(labels: dict) -> None:
    assert run_pod(labels, spec(c1=C1)).response.resources.is_empty()
    assert run_container(labels, spec(c1=C1)).response.resources.is_empty()


def test_update_container_resources_and_wire() -> None:
    ctx = run_container(BE, spec(c1=C1), stage=HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    wire = ctx.to_proto().container_resources
    assert (wire.cpu_shares, wire.cpu_quota, wire.memory_limit_in_bytes) == (512, 50000, 2147483648)


@pytest.mark.parametrize("annotations, where", [
    ({SPEC: "{"}, "bad JSON"),
    ({SPEC: '{"pods": {}}'}, "containers"),
    (spec(c1="x"), "containers.c1"),
    (spec(c1=container({"cpu": "half"})), "containers.c1.requests.kubernetes.io/batch-cpu"),
    (spec(c1=container({"cpu": "0.5"})), "containers.c1.requests.kubernetes.io/batch-cpu"),
    (spec(c1=container({"cpu": "-5"})), "containers.c1.requests.kubernetes.io/batch-cpu"),
    (spec(c1=container({}, {"memory": "2Gx"})), "containers.c1.limits.kubernetes.io/batch-memory"),
    (spec(c1=container({}, {"memory": "0"})), "containers.c1.limits.kubernetes.io/batch-memory"),
])
def test_bad_spec_names_field(annotations: dict, where: str) -> None:
    for run in (lambda: run_pod(BE, annotations), lambda: run_container(BE, annotations)):
        with pytest.raises(HookError) as info:
            run()
        assert SPEC in str(info.value) and where in str(info.value)
        assert "ns/p" in str(info.value)


@pytest.mark.parametrize("text, value", [
    ("2Gi", 2 * 2**30), ("512Mi", 512 * 2**20), ("1G", 10**9), ("1000", 1000), (1000, 1000),
    ("500m", Fraction(1, 2)), ("1.5Gi", 3 * 2**29), ("1e3", 1000), ("2E", 2 * 10**18), ("1Ki", 1024),
])
def test_parse_quantity(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "1 Gi", "1gi", None, True, 1.5])
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def run_with_rules(rules: Rules, stage: HookPoint) -> Resources:
    h = Hooks(FailurePolicy.FAIL)
    plugin = BatchResource(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS))
    plugin.update_rules(rules)
    plugin.register(h)
    ctx: PodContext | ContainerContext
    if stage is HookPoint.PRE_RUN_POD_SANDBOX:
        ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"), labels=BE,
                                    annotations=spec(c1=C1), cgroup_parent="/kubepods/besteffort/pod1"))
    else:
        ctx = ContainerContext(ContainerRequest(
            pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name="c1", container_id="cid",
            pod_labels=BE, pod_annotations=spec(c1=C1), pod_cgroup_parent="/kubepods/besteffort/pod1"))
    h.run(stage, ctx)
    return ctx.response.resources


# Upstream's Test_plugin_SetPodResources / Test_plugin_SetContainerResources cases that
# depend on the rule: "a Batch pod with cfs quota unset", "... scaled with ratio", and the
# same for a container; plus a ratio at or below 1 (upstream: "no support ratio in (0, 1)").
@pytest.mark.parametrize("stage", [HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER])
@pytest.mark.parametrize("rules, quota", [
    (Rules.of({BATCH_CFS_QUOTA: False}), -1),
    (Rules.of({BATCH_CFS_QUOTA: False, CPU_NORMALIZATION_RATIO: 1.2}), -1),
    (Rules.of({CPU_NORMALIZATION_RATIO: 1.2}), 41667),  # ceil(50000 / 1.2)
    (Rules.of({CPU_NORMALIZATION_RATIO: 1.0}), 50000),
    (Rules(), 50000),
])
def test_quota_follows_node_rules(stage: HookPoint, rules: Rules, quota: int) -> None:
    assert run_with_rules(rules, stage) == Resources(cpu_shares=512, cpu_quota=quota, memory_limit=2147483648)


@pytest.mark.parametrize("rules, qos, expected", [
    (Rules(), KubeQoS.BESTEFFORT, Resources(cpu_quota=-1)),       # suppress off: besteffort unlimited first
    (Rules.of({BATCH_CFS_QUOTA: False}), KubeQoS.BESTEFFORT, None),     # suppress owns the besteffort quota
    (Rules(), KubeQoS.BURSTABLE, None),
    (None, KubeQoS.BESTEFFORT, None),
])
def test_besteffort_quota_unlimited_before_pods_get_limits(rules: Rules | None, qos: KubeQoS,
                                                           expected: Resources | None) -> None:
    plugin = BatchResource(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS))
    if rules is not None:
        plugin.update_rules(rules)
    assert plugin.kube_qos_resources(qos) == expected
