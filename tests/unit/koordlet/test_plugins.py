"""plugins/__init__: order, feature gates, and building the enabled plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord.hookapi import HookPoint
from koord.koordlet.features import (
    ADVISOR_FEATURE_GATES,
    ALL_GATE_DEFAULTS,
    MODULE_FEATURE_GATES,
    QOS_FEATURE_GATES,
    STATES_FEATURE_GATES,
    UPSTREAM_GATES,
    parse_feature_gates,
)
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import REGISTRY, build_plugins, implemented_gates

NO_FS = Path("/nonexistent")
ENV = PluginEnv(CgroupExecutor(NO_FS, version=1), NO_FS, NO_FS)


def test_order_and_names_match_gates() -> None:
    assert [c.name for c in REGISTRY.plugins] == [
        "GroupIdentity", "BatchResource", "CPUSetAllocator", "CPUNormalization", "GPUEnvInject", "Resctrl",
        "OOMScoreAdj", "CoreSched"]
    assert REGISTRY.gates() == {"GroupIdentity": True, "BatchResource": True, "CPUSetAllocator": True,
                                "CPUNormalization": False, "GPUEnvInject": False, "Resctrl": False,
                                "OOMScoreAdj": False, "CoreSched": False}
    parts = (REGISTRY.gates(), QOS_FEATURE_GATES, ADVISOR_FEATURE_GATES, STATES_FEATURE_GATES)
    assert MODULE_FEATURE_GATES == {k: v for part in parts[1:] for k, v in part.items()}
    assert implemented_gates() == {k: v for part in parts for k, v in part.items()}
    assert len(implemented_gates()) == sum(map(len, parts))
    # every gate implemented here is upstream's, with upstream's default
    assert {k: ALL_GATE_DEFAULTS[k] for k in implemented_gates()} == implemented_gates()


@pytest.mark.parametrize("text, changed", [
    ("", {}),
    ("Resctrl=true", {"Resctrl": True}),
    ("GroupIdentity=false, GPUEnvInject=True", {"GroupIdentity": False, "GPUEnvInject": True}),
    ("CPUNormalization=1,BatchResource=0,", {"CPUNormalization": True, "BatchResource": False}),
    ("PSICollector=true,BECPUSuppress=false", {"PSICollector": True, "BECPUSuppress": False}),
])
def test_parse_feature_gates(text: str, changed: dict[str, bool]) -> None:
    assert parse_feature_gates(text) == {**ALL_GATE_DEFAULTS, **changed}


ALPHA = {k for k, (_, stage) in UPSTREAM_GATES.items() if stage == "Alpha"}
BETA = {k for k, (_, stage) in UPSTREAM_GATES.items() if stage == "Beta"}


@pytest.mark.parametrize("text, enabled", [
    # Kubernetes' AllAlpha/AllBeta: every gate of the stage not named explicitly, in any order
    ("AllAlpha=true,AllBeta=true", ALPHA | BETA),
    ("AllBeta=false", set()),
    ("AllAlpha=true", ALPHA | BETA),
    ("AllAlpha=true,BECPUEvict=false", (ALPHA | BETA) - {"BECPUEvict"}),
    ("BECPUEvict=false,AllAlpha=true", (ALPHA | BETA) - {"BECPUEvict"}),
    ("AllBeta=false,CPUSetAllocator=true", {"CPUSetAllocator"}),
    ("AllAlpha=false", BETA),
])
def test_all_alpha_all_beta(text: str, enabled: set[str]) -> None:
    assert {k for k, v in parse_feature_gates(text).items() if v} == enabled


@pytest.mark.parametrize("text, named", [
    ("Bogus=true", "Bogus"),
    ("Resctrl=yes", "Resctrl"),
    ("Resctrl", "Resctrl"),
    ("Resctrl=tRuE", "Resctrl"),  # strconv.ParseBool has exactly six true spellings
    ("AllAlpha=on", "AllAlpha"),
    ("AllGA=true", "AllGA"),
])
def test_parse_feature_gates_rejects(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_feature_gates(text)


def test_build_default_plugins_in_order() -> None:
    plugins = build_plugins(ENV, implemented_gates())
    assert [p.name for p in plugins] == ["GroupIdentity", "BatchResource", "CPUSetAllocator"]
    assert all(p.env is ENV for p in plugins)


def test_build_all_and_register() -> None:
    plugins = build_plugins(ENV, {name: True for name in implemented_gates()})
    assert [p.name for p in plugins] == [c.name for c in REGISTRY.plugins]
    hooks = Hooks()
    for plugin in plugins:
        plugin.register(hooks)
    assert [name for name, _ in hooks.registrations(HookPoint.PRE_CREATE_CONTAINER)] == [
        "BatchResource", "CPUSetAllocator", "CPUNormalization", "GPUEnvInject", "Resctrl", "OOMScoreAdj",
        "CoreSched"]
    assert hooks.stages() == {HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER,
                              HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, HookPoint.POST_START_CONTAINER,
                              HookPoint.POST_STOP_POD_SANDBOX}


def test_build_rejects_unknown_gate() -> None:
    with pytest.raises(ValueError, match="Bogus"):
        build_plugins(ENV, {"Bogus": True})
