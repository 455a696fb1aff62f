"""The kernel switches of GroupIdentity and CoreSched on a fake /proc/sys tree: which policy
sets which switch (upstream's initSysctl / initSystem), when bvt is answered at all
(upstream's prepare), and files that hold what a switch cannot; host applications' bvt."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet import schedsysctl
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KubeQoS
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.hostapps import HOST_APPS, host_app_updates
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.coresched import CoreSched
from koord.koordlet.runtimehooks.plugins.groupidentity import GroupIdentity
from koord.koordlet.runtimehooks.protocol import HookPodMeta, PodContext, PodRequest
from koord.koordlet.runtimehooks.rule import RuleError

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
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"),
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
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(CgroupLayout(cgroups)), tmp_path / "sys-fs", proc))
    plugin.update_rules(parse_rules(node_slo, None))
    assert read(proc, switches) == want_switches
    assert be_bvt(plugin) == want_bvt
    want_dir = None if want_bvt is None else (-1 if want_bvt == -1 else 0)
    resources = plugin.kube_qos_resources(KubeQoS.BESTEFFORT)
    assert (resources.cpu_bvt_warp_ns if resources else None) == want_dir


def test_group_identity_switch_holding_garbage_is_said_once(tmp_path: Path, caplog) -> None:
    proc = proc_tree(tmp_path, {GI: "yes"})
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup")), tmp_path / "sys-fs", proc))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            plugin.update_rules(parse_rules(GI_ON, None))
    assert sum("sched_group_identity_enabled: 'yes' is neither 0 nor 1" in r.message for r in caplog.records) == 1
    assert schedsysctl.path(proc, GI).read_text() == "yes\n"


def test_kernel_without_group_identity_says_so_once(tmp_path: Path, caplog) -> None:
    proc = proc_tree(tmp_path, {})
    plugin = GroupIdentity(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup")), tmp_path / "sys-fs", proc))
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
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup", version=1)),
                                 tmp_path / "sys-fs", proc), FakeCookies(set()))
    plugin.update_rules(parse_rules(node_slo, None))
    assert read(proc, switches) == want_switches
    assert sorted(p.name for p in (proc / "sys" / "kernel").iterdir()) == sorted(
        Path(n).name for n in switches)


def host_apps_slo(apps: list, cpu_qos: dict | None = None) -> dict:
    strategy = {k: {"cpuQOS": {"enable": True}} for k in ("lsrClass", "lsClass", "beClass")}
    if cpu_qos is not None:
        strategy["lsClass"] = {"cpuQOS": cpu_qos}
    return {"spec": {"resourceQOSStrategy": strategy, "hostApplications": apps}}


# upstream's Test_bvtPlugin_ruleUpdateCbForHostApp, and the default dirs of GetHostAppCgroupRelativePath
def apply_host_apps(plugin: GroupIdentity, executor: CgroupExecutor) -> int:
    """What the reconciler does with host applications (only this plugin's values); how many."""
    assert plugin.rules is not None
    updates = host_app_updates(plugin.rules[HOST_APPS], [plugin.host_app_resources], executor)
    for _, update in updates:
        executor.apply(update.cgroup_dir, update.resources)
    return len(updates)


@pytest.mark.parametrize("name, app, cgroup_dir, want", [
    ("upstream case: LS with cgroupPath", {"name": "test-app", "qos": "LS",
                                           "cgroupPath": {"parentDir": "test-ls", "relativePath": "test-app"}},
     "test-ls/test-app", "2"),
    ("BE default dir", {"name": "nginx", "qos": "BE"}, "host-best-effort/nginx", "-1"),
    ("LSR default dir", {"name": "db", "qos": "LSR"}, "host-latency-sensitive/db", "2"),
    ("no class: the name under the root", {"name": "misc"}, "misc", "0"),
    ("SYSTEM stays neutral", {"name": "sys", "qos": "SYSTEM"}, "sys", "0"),
    ("an unknown class is none", {"name": "gold", "qos": "GOLD"}, "gold", "0"),
    ("under besteffort", {"name": "x", "qos": "BE", "cgroupPath": {"base": "KubepodsBesteffort",
                                                                    "relativePath": "x"}},
     "kubepods/besteffort/x", "-1"),
])
def test_host_application_bvt(tmp_path: Path, name: str, app: dict, cgroup_dir: str, want: str) -> None:
    cgroups = tmp_path / "cgroup"
    for d in ("kubepods", cgroup_dir):
        (cgroups / "cpu" / d).mkdir(parents=True, exist_ok=True)
        (cgroups / "cpu" / d / "cpu.bvt_warp_ns").write_text("0\n")
    executor = CgroupExecutor(CgroupLayout(cgroups, version=1))
    plugin = GroupIdentity(PluginEnv(executor, tmp_path / "sys-fs", proc_tree(tmp_path, {})))
    plugin.update_rules(parse_rules(host_apps_slo([app]), None))
    apply_host_apps(plugin, executor)
    assert (cgroups / "cpu" / cgroup_dir / "cpu.bvt_warp_ns").read_text().strip() == want


def test_host_application_without_cgroup_is_skipped(tmp_path: Path) -> None:
    cgroups = tmp_path / "cgroup"
    (cgroups / "cpu" / "kubepods").mkdir(parents=True)
    (cgroups / "cpu" / "kubepods" / "cpu.bvt_warp_ns").write_text("0\n")
    executor = CgroupExecutor(CgroupLayout(cgroups, version=1))
    plugin = GroupIdentity(PluginEnv(executor, tmp_path / "sys-fs", proc_tree(tmp_path, {})))
    plugin.update_rules(parse_rules(host_apps_slo([{"name": "absent", "qos": "BE"}]), None))
    assert apply_host_apps(plugin, executor) == 0
    assert not (cgroups / "cpu" / "host-best-effort").exists()


@pytest.mark.parametrize("apps, field", [
    ({"name": "x"}, "spec.hostApplications: want a list"),
    (["x"], "spec.hostApplications[0]"),
    ([{"name": f"a{i}"} for i in range(257)], "at most 256"),
    ([{"name": "a/b"}], "spec.hostApplications[0].name"),
    ([{}], "spec.hostApplications[0].name"),
    ([{"name": "a", "qos": 3}], "spec.hostApplications[0].qos"),
    ([{"name": "a", "cgroupPath": {"base": "Elsewhere"}}], "spec.hostApplications[0].cgroupPath.base"),
    ([{"name": "a", "cgroupPath": {"parentDir": "../etc"}}], "spec.hostApplications[0].cgroupPath.parentDir"),
    ([{"name": "a", "cgroupPath": {"relativePath": 3}}], "spec.hostApplications[0].cgroupPath.relativePath"),
    ([{"name": "a", "cgroupPath": {}}], "names the cgroup root itself"),
])
def test_hostile_host_applications_name_the_field(apps: object, field: str) -> None:
    with pytest.raises(RuleError, match=re.escape(field)):
        parse_rules({"spec": {"hostApplications": apps}}, None)
