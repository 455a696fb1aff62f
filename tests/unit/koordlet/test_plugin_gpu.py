"""GPUEnvInject through Hooks: NVIDIA_VISIBLE_DEVICES from device-allocated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins.gpu import GPUEnvInject
from koord.koordlet.runtimehooks.protocol import ContainerContext, ContainerRequest, HookPodMeta

ALLOCATED = "scheduling.koordinator.sh/device-allocated"
NO_FS = Path("/nonexistent")


def run(annotations: dict, envs: dict | None = None,
        stage: HookPoint = HookPoint.PRE_CREATE_CONTAINER) -> ContainerContext:
    hooks = Hooks(FailurePolicy.FAIL)
    GPUEnvInject(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS)).register(hooks)
    ctx = ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name="c1",
        pod_annotations=annotations, envs=envs or {}))
    hooks.run(stage, ctx)
    return ctx


@pytest.mark.parametrize("annotations, envs", [
    ({ALLOCATED: '{"gpu":[{"minor":0},{"minor":1}]}'}, {"NVIDIA_VISIBLE_DEVICES": "0,1"}),
    ({ALLOCATED: '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100"}}]}'},
     {"NVIDIA_VISIBLE_DEVICES": "3"}),
    ({ALLOCATED: '{"gpu":[]}'}, {}),
    ({ALLOCATED: '{"rdma":[{"minor":1}]}'}, {}),
    ({}, {}),
])
def test_env(annotations: dict, envs: dict) -> None:
    ctx = run(annotations)
    assert ctx.response.envs == envs
    assert dict(ctx.to_proto().container_envs) == envs
    assert ctx.response.resources.is_empty()


def test_only_at_create() -> None:
    assert run({ALLOCATED: '{"gpu":[{"minor":0}]}'}, stage=HookPoint.PRE_START_CONTAINER).response.envs == {}


@pytest.mark.parametrize("annotation, reason", [
    ("{", "bad JSON"),
    ("[]", "JSON object"),
    ('{"gpu":{"minor":0}}', "list"),
    ('{"gpu":[{"minor":-1}]}', "gpu[0].minor"),
    ('{"gpu":[{"id":"x"}]}', "gpu[0].minor"),
])
def test_bad_annotation(annotation: str, reason: str) -> None:
    with pytest.raises(HookError, match=re.escape(reason)) as info:
        run({ALLOCATED: annotation})
    assert ALLOCATED in str(info.value) and "ns/p container c1" in str(info.value)
