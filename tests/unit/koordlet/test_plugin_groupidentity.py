"""GroupIdentity through Hooks: pod bvt by QoS class, kube-QoS values, kernel support."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KubeQoS, Resources
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.groupidentity import GroupIdentity
from koord.koordlet.runtimehooks.protocol import HookPodMeta, PodContext, PodRequest

ALL_ON = {"spec": {"resourceQOSStrategy": {
    k: {"cpuQOS": {"enable": True}} for k in ("lsrClass", "lsClass", "beClass", "systemClass")}}}


def make_plugin(tmp_path: Path, bvt_file: bool = True, kernel_switch: bool = False,
                node_slo: dict | None = ALL_ON) -> GroupIdentity:
    root = tmp_path / "cgroup"
    (root / "cpu" / "kubepods").mkdir(parents=True)
    if bvt_file:
        (root / "cpu" / "kubepods" / "cpu.bvt_warp_ns").write_text("0\n")
    proc = tmp_path / "proc"
    if kernel_switch:
        (proc / "sys" / "kernel").mkdir(parents=True)
        (proc / "sys" / "kernel" / "sched_group_identity_enabled").write_text("1\n")
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(CgroupLayout(root)), tmp_path / "sys" / "fs", proc))
    plugin.update_rules(parse_rules(node_slo, None))
    return plugin


def run_pod(plugin: GroupIdentity, labels: dict, annotations: dict | None = None,
            parent: str = "/kubepods/burstable/pod1") -> PodContext:
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"), labels=labels,
                                annotations=annotations or {}, cgroup_parent=parent))
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    return ctx


@pytest.mark.parametrize("labels, annotations, bvt", [
    ({"koordinator.sh/qosClass": "LSR"}, {}, 2),
    ({"koordinator.sh/qosClass": "LSE"}, {}, 2),
    ({"koordinator.sh/qosClass": "LS"}, {}, 2),
    ({"koordinator.sh/qosClass": "BE"}, {}, -1),
    ({"koordinator.sh/qosClass": "SYSTEM"}, {}, 0),
    ({}, {}, 0),
    ({"koordinator.sh/qosClass": "bogus"}, {}, 0),
    ({"koordinator.sh/qosClass": "LS"}, {"koordinator.sh/cpuQOS": '{"enable":true,"groupIdentity":-1}'}, -1),
])
def test_pod_bvt_by_qos(tmp_path: Path, labels: dict, annotations: dict, bvt: int) -> None:
    ctx = run_pod(make_plugin(tmp_path), labels, annotations)
    assert ctx.response.resources == Resources(cpu_bvt_warp_ns=bvt)
    assert ctx.to_proto().resources.ByteSize() == 0  # bvt never travels to the proxy


def test_disabled_class_gets_neutral_value(tmp_path: Path) -> None:
    slo = {"spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}}}}}
    plugin = make_plugin(tmp_path, node_slo=slo)
    assert run_pod(plugin, {"koordinator.sh/qosClass": "LS"}).response.resources.cpu_bvt_warp_ns == 0
    assert run_pod(plugin, {"koordinator.sh/qosClass": "BE"}).response.resources.cpu_bvt_warp_ns == -1


def test_kernel_switch_alone_means_supported(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path, bvt_file=False, kernel_switch=True)
    assert run_pod(plugin, {"koordinator.sh/qosClass": "BE"}).response.resources.cpu_bvt_warp_ns == -1


def test_unsupported_kernel_does_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plugin = make_plugin(tmp_path, bvt_file=False)
    for _ in range(3):
        assert run_pod(plugin, {"koordinator.sh/qosClass": "BE"}).response.resources.is_empty()
    assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
    assert sum("group identity is off" in r.message for r in caplog.records) == 1


def test_without_rules_does_nothing(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path)
    plugin.rules = None
    assert run_pod(plugin, {"koordinator.sh/qosClass": "BE"}).response.resources.is_empty()


@pytest.mark.parametrize("qos, bvt", [
    (KubeQoS.GUARANTEED, 0), (KubeQoS.BURSTABLE, 2), (KubeQoS.BESTEFFORT, -1),
])
def test_kube_qos_resources(tmp_path: Path, qos: KubeQoS, bvt: int) -> None:
    assert make_plugin(tmp_path).kube_qos_resources(qos) == Resources(cpu_bvt_warp_ns=bvt)


def test_bad_annotation_is_hook_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(HookError, match="koordinator.sh/cpuQOS") as info:
        run_pod(make_plugin(tmp_path), {"koordinator.sh/qosClass": "LS"}, {"koordinator.sh/cpuQOS": "{"})
    assert "ns/p" in str(info.value)


def test_rule_change_is_reported(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path)
    assert plugin.update_rules(parse_rules(ALL_ON, None)) is False
    assert plugin.update_rules(parse_rules(None, None)) is True
