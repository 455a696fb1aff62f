"""CPUNormalization through Hooks: quota scaled by the node ratio for LS/none pods without cpuset."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import Resources
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import REGISTRY, build_plugins, parse_rules
from koord.koordlet.runtimehooks.plugins.cpunormalization import CPUNormalization
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    HookPodMeta,
    PodContext,
    PodRequest,
)

STATUS = "scheduling.koordinator.sh/resource-status"
NO_FS = Path("/nonexistent")
ENV = PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS)


def node(ratio: str | None) -> dict:
    annotations = {} if ratio is None else {"node.koordinator.sh/cpu-normalization-ratio": ratio}
    return {"metadata": {"annotations": annotations}}


def hooks_with(ratio: str | None) -> Hooks:
    plugin = CPUNormalization(ENV)
    plugin.update_rules(parse_rules(None, node(ratio)))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    return hooks


def container_ctx(qos: str, quota: int | None, annotations: dict | None = None) -> ContainerContext:
    return ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name="c1",
        pod_labels={"koordinator.sh/qosClass": qos} if qos else {},
        pod_annotations=annotations or {}, resources=Resources(cpu_quota=quota, cpu_period=100000)))


@pytest.mark.parametrize("ratio, qos, quota, annotations, expected", [
    ("1.2", "LS", 100000, {}, 83334),
    ("1.2", "", 100000, {}, 83334),
    ("1.2", "LS", 120000, {}, 100000),       # exact: not 100001
    ("1.5", "LS", 150000, {}, 100000),
    ("2", "", 1000, {}, 1000),               # 500 would be below the kernel's 1 ms minimum
    ("2", "", 1600, {}, 1000),
    ("1.2", "LS", -1, {}, None),             # unlimited stays unlimited
    ("1.2", "LS", None, {}, None),
    ("1.0", "LS", 100000, {}, None),         # ratio 1: nothing to do
    (None, "LS", 100000, {}, None),
    ("1.2", "BE", 100000, {}, None),
    ("1.2", "LSR", 100000, {}, None),
    ("1.2", "SYSTEM", 100000, {}, None),
    ("1.2", "LS", 100000, {STATUS: '{"cpuset":"0-3"}'}, None),   # bound to cpus: exempt
    ("1.2", "LS", 100000, {STATUS: '{}'}, 83334),
])
def test_container_quota(ratio: str | None, qos: str, quota: int | None, annotations: dict,
                         expected: int | None) -> None:
    ctx = container_ctx(qos, quota, annotations)
    hooks_with(ratio).run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    assert ctx.response.resources.cpu_quota == expected


def test_update_stage_and_earlier_answer_wins_over_request() -> None:
    ctx = container_ctx("LS", 100000)
    ctx.response.resources.cpu_quota = 240000   # set by an earlier plugin
    hooks_with("1.2").run(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, ctx)
    assert ctx.response.resources.cpu_quota == 200000


def test_pod_quota() -> None:
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"),
                                labels={"koordinator.sh/qosClass": "LS"},
                                resources=Resources(cpu_quota=200000)))
    hooks_with("1.2").run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    assert ctx.response.resources == Resources(cpu_quota=166667)


def test_runs_after_cpuset_allocator_in_plugin_order() -> None:
    """An LSR pod bound by CPUSetAllocator (quota -1) is left alone by the later normalization."""
    plugins = build_plugins(ENV, {"CPUNormalization": True, "GroupIdentity": False})
    assert [type(p) for p in plugins] == [c for c in REGISTRY.plugins if c.__name__ in
                                          ("BatchResource", "CPUSetAllocator", "CPUNormalization")]
    hooks = Hooks(FailurePolicy.FAIL)
    rules = parse_rules(None, node("1.2"))
    for plugin in plugins:
        plugin.update_rules(rules)
        plugin.register(hooks)
    ctx = container_ctx("LSR", 100000, {STATUS: '{"cpuset":"0-3"}'})
    hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    assert ctx.response.resources == Resources(cpuset_cpus="0-3", cpu_quota=-1)


BASE = "koordlet.koordinator.sh/cpu-normalization-base-quota"


@pytest.mark.parametrize("quota, recorded, expected_quota, expected_base", [
    (100000, None, 83334, "100000"),   # first time (proxy, PreCreateContainer): scale, record the base
    (83334, "100000", 83334, "100000"),  # reconciler replay of the stored, scaled config: not scaled twice
    (50000, "100000", 41667, "50000"),   # kubelet updated the limit: the new quota is a fresh base
    (83334, "junk", 69445, "83334"),     # an unreadable record is ignored
])
def test_recorded_base_prevents_double_scaling(quota: int, recorded: str | None, expected_quota: int,
                                               expected_base: str) -> None:
    ctx = container_ctx("LS", quota)
    if recorded is not None:
        ctx.request.container_annotations[BASE] = recorded
    hooks_with("1.2").run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    assert ctx.response.resources.cpu_quota == expected_quota
    assert ctx.response.annotations[BASE] == expected_base


def test_pod_level_base_is_recorded_in_pod_annotations() -> None:
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"),
                                annotations={BASE: "100000"}, resources=Resources(cpu_quota=83334)))
    hooks_with("1.2").run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    assert ctx.response.resources.cpu_quota == 83334
    assert ctx.response.annotations[BASE] == "100000"
