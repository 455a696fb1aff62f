"""plugins/__init__: order, feature gates, and building the enabled plugins."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from koord.apis.runtime.v1alpha1 import api_pb2, api_pb2_grpc
from koord.hookapi import HookPoint
from koord.koordlet import cli, flags
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.features import (
    ADVISOR_FEATURE_GATES,
    ALL_GATE_DEFAULTS,
    MODULE_FEATURE_GATES,
    QOS_FEATURE_GATES,
    STATES_FEATURE_GATES,
    UPSTREAM_GATES,
    parse_feature_gates,
)
from koord.koordlet.nodeslocheck import check_node_slo
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import CgroupFile
from koord.koordlet.runtimehooks import plugins
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv, RuntimePlugin
from koord.koordlet.runtimehooks.plugins import REGISTRY, PluginRegistry, build_plugins, implemented_gates
from koord.koordlet.runtimehooks.protocol import PodContext
from koord.koordlet.runtimehooks.rule import Rule, RuleError, Source, rule_object
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.fakecri import FakeCRI

from .test_cli import wait_for

NO_FS = Path("/nonexistent")
ENV = PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS)


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


# ---- the registry: a plugin defined here, outside koordlet's modules, joins with one line

TOY_WEIGHT = CgroupFile("toy_weight", "cpu", "cpu.toy_weight", "cpu.toy_weight", 0, 100)
"""The toy's own cgroup file: a fake kernel file the fake tree below has."""


def parse_toy_weight(spec: dict) -> int | None:
    """NodeSLO ``spec.extensions.toy.weight`` (merged spec: missing sections are absent)."""
    weight = rule_object(rule_object(spec.get("extensions"), "extensions").get("toy"), "extensions.toy").get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int)):
        raise RuleError(f"spec.extensions.toy.weight={weight!r}: want an integer")
    return weight


TOY_RULE = Rule("toyWeight", Source.NODE_SLO, parse_toy_weight, absent=None)


class Toy(RuntimePlugin):
    name = "Toy"
    gate_default = True
    rules_read = (TOY_RULE,)
    cgroup_files = (TOY_WEIGHT,)

    def register(self, hooks: Hooks) -> None:
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "toy weight of the pod", self.set_weight)

    def set_weight(self, ctx: PodContext) -> None:
        weight = self.rules[TOY_RULE] if self.rules is not None else None
        if weight is not None:
            ctx.response.resources.files[TOY_WEIGHT] = weight


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> PluginRegistry:
    """koordlet's plugin registry, as it is again after the test."""
    extended = plugins.REGISTRY.copy()
    monkeypatch.setattr(plugins, "REGISTRY", extended)
    return extended


def toy_node_slo(weight: int) -> str:
    return json.dumps({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n1"},
                       "spec": {"extensions": {"toy": {"weight": weight}}}})


RUNNING, CALLED = "kubepods/besteffort/podu1", "kubepods/besteffort/podu2"


def test_a_toy_hook_plugin_needs_one_registry_line(registry: PluginRegistry, short_socket_dir: Path,
                                                   tmp_path: Path, fake_cri: FakeCRI) -> None:
    """The whole koordlet with the toy: its rule parsed at each NodeSLO, the hook server's
    answer and the reconciler's rounds writing its file in a fake cgroup tree."""
    registry.register(Toy)

    root = tmp_path / "cg"
    for pod in (RUNNING, CALLED):
        (make_fake_v1_cgroup(root, pod) / "cpu.toy_weight").write_text("0\n")
    (tmp_path / "proc").mkdir()
    slo = tmp_path / "nodeslo.json"
    slo.write_text(toy_node_slo(7))
    fake_cri.add_pod("p1", "running", {}, "/" + RUNNING)
    koordlet = cli.Koordlet(flags.parse_args([
        "--runtime-hooks-addr", str(short_socket_dir / "k.sock"), "--cgroup-root-dir", str(root),
        "--proc-root-dir", str(tmp_path / "proc"), "--node-slo-file", str(slo),
        "--runtime-hooks-reconcile-interval", "1h", "--tsdb-path", str(tmp_path / "tsdb"), "--addr", "",
        "--prediction-checkpoint-filepath", str(tmp_path / "prediction"),
        "--containerd-endpoint", fake_cri.endpoint]))
    assert [p.name for p in koordlet.hooks.plugins][-1] == "Toy"
    koordlet.start()
    try:
        running = root / "cpu" / RUNNING / "cpu.toy_weight"
        wait_for(lambda: running.read_text().strip() == "7", "the reconciler's first round")
        with grpc.insecure_channel("unix:" + koordlet.hooks.server.endpoint) as channel:
            answer = api_pb2_grpc.RuntimeHookServiceStub(channel).PreRunPodSandboxHook(api_pb2.PodSandboxHookRequest(
                pod_meta=api_pb2.PodSandboxMetadata(name="p2", namespace="ns", uid="u2"),
                cgroup_parent="/" + CALLED), timeout=5)
        assert not answer.HasField("resources")  # koordlet-only: never on the wire
        assert (root / "cpu" / CALLED / "cpu.toy_weight").read_text().strip() == "7"
        slo.write_text(toy_node_slo(9))
        # the interval is an hour: only the rule callback brings this round
        wait_for(lambda: running.read_text().strip() == "9", "the NodeSLO update's round")
    finally:
        koordlet.stop()
    # the states informer's check of each NodeSLO version parses the toy's rule too
    with pytest.raises(RuleError, match="toy.weight"):
        check_node_slo({"spec": {"extensions": {"toy": {"weight": "heavy"}}}})


class Renamed(Toy):
    name = "GroupIdentity"
    gate_default = None


class Upstreams(Toy):
    name = "TCNetworkQoS"


class ClashingRule(Toy):
    name = "Toy2"
    rules_read = (Rule("groupIdentity", Source.NODE_SLO, parse_toy_weight, absent=None),)


class ClashingFile(Toy):
    name = "Toy3"
    rules_read = ()
    cgroup_files = (CgroupFile("cpu_idle", "cpu", "cpu.idle2", "cpu.idle2", 0, 1),)


@pytest.mark.parametrize("cls, refusal", [
    (Renamed, "registered twice"),
    (Upstreams, "gate_default"),     # upstream has this gate: its default is written there
    (ClashingRule, "rule 'groupIdentity'"),
    (ClashingFile, "cgroup file 'cpu_idle'"),
])
def test_registry_refuses_a_clash(cls: type[RuntimePlugin], refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        plugins.REGISTRY.copy().register(cls)
