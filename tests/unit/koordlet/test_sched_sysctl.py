"""The kernel switches of GroupIdentity and CoreSched on a fake /proc/sys tree: which policy
sets which switch (upstream's initSysctl / initSystem), when bvt is answered at all
(upstream's prepare), and files that hold what a switch cannot."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet import schedsysctl
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KubeQoS
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins.coresched import CoreSched
from koord.koordlet.runtimehooks.plugins.groupidentity import GroupIdentity
from koord.koordlet.runtimehooks.protocol import PodContext, PodMeta, PodRequest
from koord.koordlet.runtimehooks.rule import parse_rules

from .test_plugin_coresched import FakeCookies

GI_ON = {"spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}}}}}
GI_OFF = {"spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": False}}}}}
CORE_SCHED_ON = {"spec": {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                                  "beClass": {"cpuQOS": {"enable": True}}}}}
GI, CORE = schedsysctl.GROUP_IDENTITY, schedsysctl.SCHED_CORE


def proc_tree(tmp_path: Path, switches: dict[str, str]) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    for name, value in switches.items():
        schedsysctl.path(proc, name).write_text(value + "\n")
    return proc


def read(proc: Path, switches: dict[str, str]) -> dict[str, str]:
    return {name: schedsysctl.path(proc, name).read_text().strip() for name in switches}


def be_bvt(plugin: GroupIdentity) -> int | None:
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=PodMeta(name="p", namespace="ns", uid="1"),
                                labels={"koordinator.sh/qosClass": "BE"}, cgroup_parent="/kubepods/besteffort/pod1"))
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    return ctx.response.resources.cpu_bvt_warp_ns


@pytest.mark.parametrize("name, switches, node_slo, want_switches, want_bvt", [
    ("enabled: sched_core off, group identity on", {GI: "0", CORE: "1"}, GI_ON, {GI: "1", CORE: "0"}, -1),
    ("enabled: already on, left", {GI: "1"}, GI_ON, {GI: "1"}, -1),
    ("enabled, no sched_core", {GI: "0"}, GI_ON, {GI: "1"}, -1),
    ("disabled, switch off: nothing to undo", {GI: "0", CORE: "1"}, GI_OFF, {GI: "0", CORE: "1"}, None),
    ("disabled, switch on: bvt reset", {GI: "1"}, GI_OFF, {GI: "1"}, 0),
    ("disabled, kernel without switch: bvt reset", {}, GI_OFF, {}, 0),
    ("enabled, kernel without switch", {CORE: "1"}, GI_ON, {CORE: "1"}, -1),
])
def test_group_identity_switches(tmp_path: Path, name: str, switches: dict, node_slo: dict,
                                 want_switches: dict, want_bvt: int | None) -> None:
    proc = proc_tree(tmp_path, switches)
    cgroups = tmp_path / "cgroup"
    (cgroups / "cpu" / "kubepods").mkdir(parents=True)
    (cgroups / "cpu" / "kubepods" / "cpu.bvt_warp_ns").write_text("0\n")
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(cgroups), tmp_path / "sys-fs", proc))
    plugin.update_rules(parse_rules(node_slo, None))
    assert read(proc, switches) == want_switches
    assert be_bvt(plugin) == want_bvt
    want_dir = None if want_bvt is None else (-1 if want_bvt == -1 else 0)
    resources = plugin.kube_qos_resources(KubeQoS.BESTEFFORT)
    assert (resources.cpu_bvt_warp_ns if resources else None) == want_dir


def test_group_identity_switch_holding_garbage_is_said_once(tmp_path: Path, caplog) -> None:
    proc = proc_tree(tmp_path, {GI: "yes"})
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(tmp_path / "cgroup"), tmp_path / "sys-fs", proc))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            plugin.update_rules(parse_rules(GI_ON, None))
    assert sum("sched_group_identity_enabled: 'yes' is neither 0 nor 1" in r.message for r in caplog.records) == 1
    assert schedsysctl.path(proc, GI).read_text() == "yes\n"


def test_kernel_without_group_identity_says_so_once(tmp_path: Path, caplog) -> None:
    proc = proc_tree(tmp_path, {})
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(tmp_path / "cgroup"), tmp_path / "sys-fs", proc))
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            plugin.update_rules(parse_rules(GI_ON, None))
            assert be_bvt(plugin) is None
    assert sum("group identity is off on this node" in r.message for r in caplog.records) == 1
    assert not list((proc / "sys" / "kernel").iterdir())


@pytest.mark.parametrize("name, switches, node_slo, want_switches", [
    ("enabled: group identity off, sched_core on", {GI: "1", CORE: "0"}, CORE_SCHED_ON, {GI: "0", CORE: "1"}),
    ("enabled, mainline kernel: nothing to switch", {}, CORE_SCHED_ON, {}),
    ("enabled, only sched_core", {CORE: "0"}, CORE_SCHED_ON, {CORE: "1"}),
    ("policy groupIdentity: untouched", {GI: "1", CORE: "0"}, GI_ON, {GI: "1", CORE: "0"}),
])
def test_core_sched_switches(tmp_path: Path, name: str, switches: dict, node_slo: dict,
                             want_switches: dict) -> None:
    proc = proc_tree(tmp_path, switches)
    plugin = CoreSched(PluginEnv(CgroupExecutor(tmp_path / "cgroup", version=1), tmp_path / "sys-fs", proc),
                       FakeCookies(set()))
    plugin.update_rules(parse_rules(node_slo, None))
    assert read(proc, switches) == want_switches
    assert sorted(p.name for p in (proc / "sys" / "kernel").iterdir()) == sorted(
        Path(n).name for n in switches)
