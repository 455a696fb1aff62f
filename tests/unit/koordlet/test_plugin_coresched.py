"""CoreSched: upstream's rule table (per-class params under cpuPolicy coreSched), the
kube-QoS cpu.idle values over a fake tree, and the one-line report of a kernel without core
scheduling (prctl stubbed)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from koord.apis.extension import LABEL_CORE_SCHED_GROUP_ID, LABEL_CORE_SCHED_POLICY
from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupError, CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.cookies import CookieError, CookieManager, PrctlCookies, pod_group, supported
from koord.koordlet.runtimehooks.plugins.coresched import CPU_IDLE, CoreSched
from koord.koordlet.runtimehooks.plugins.coreschedrule import CORE_SCHED, CoreSchedParam, CoreSchedRule
from koord.koordlet.runtimehooks.protocol import ContainerContext, ContainerRequest, HookPodMeta, KubeQoS, Resources
from koord.koordlet.runtimehooks.rule import RuleError
from koord_testing.cgroupfs import make_fake_v1_cgroup


def slo(policy: str | None, **classes: dict) -> dict:
    strategy: dict = {k: {"cpuQOS": v} for k, v in classes.items()}
    if policy is not None:
        strategy["policies"] = {"cpuPolicy": policy}
    return {"spec": {"resourceQOSStrategy": strategy}}


ON = CoreSchedParam(enable=True, expeller=True)
OFF_EXPELLER = CoreSchedParam(expeller=True)


# upstream's Test_parseRuleForNodeSLO (coresched)
@pytest.mark.parametrize("name, node_slo, want", [
    ("keep disabled", slo("groupIdentity", lsrClass={"enable": True}, lsClass={"enable": True}), CoreSchedRule()),
    ("policy disabled", slo(None, lsClass={"enable": True, "schedIdle": 1}), CoreSchedRule()),
    ("policy enabled", slo("coreSched", lsrClass={"enable": True}, lsClass={"enable": True}),
     CoreSchedRule(lsr=ON, ls=ON)),
    ("enabled on LS and BE", slo("coreSched", lsClass={"enable": True}, beClass={"enable": True, "schedIdle": 1}),
     CoreSchedRule(lsr=OFF_EXPELLER, ls=ON, be=CoreSchedParam(enable=True, cpu_idle=True))),
    ("policy enabled on BE", slo("coreSched", beClass={"enable": True, "schedIdle": 1, "coreExpeller": False}),
     CoreSchedRule(lsr=OFF_EXPELLER, ls=OFF_EXPELLER, be=CoreSchedParam(enable=True, cpu_idle=True))),
])
def test_rule(name: str, node_slo: dict, want: CoreSchedRule) -> None:
    assert parse_rules(node_slo, None)[CORE_SCHED] == want


def test_no_node_slo_no_rule() -> None:
    assert parse_rules(None, None)[CORE_SCHED] is None


@pytest.mark.parametrize("cpu_qos, field", [
    ({"schedIdle": 2}, "beClass.cpuQOS.schedIdle"), ({"schedIdle": True}, "beClass.cpuQOS.schedIdle"),
    ({"coreExpeller": "yes"}, "beClass.cpuQOS.coreExpeller"),
])
def test_bad_fields_name_the_field(cpu_qos: dict, field: str) -> None:
    with pytest.raises(RuleError, match=field):
        parse_rules(slo("coreSched", beClass=cpu_qos), None)


# upstream's SetKubeQOSCPUIdle: the kube-QoS dirs' cpu.idle
@pytest.mark.parametrize("node_slo, want", [
    (slo("coreSched", beClass={"enable": True, "schedIdle": 1}),
     {KubeQoS.BESTEFFORT: 1, KubeQoS.BURSTABLE: 0, KubeQoS.GUARANTEED: 0}),
    (slo("coreSched", beClass={"schedIdle": 1}),   # idle without enabling cookies, as upstream
     {KubeQoS.BESTEFFORT: 1, KubeQoS.BURSTABLE: 0, KubeQoS.GUARANTEED: 0}),
    (slo("coreSched", lsClass={"enable": True, "schedIdle": 1}),
     {KubeQoS.BESTEFFORT: 0, KubeQoS.BURSTABLE: 1, KubeQoS.GUARANTEED: 1}),
    (slo("coreSched", lsrClass={"enable": True}, lsClass={"enable": True, "schedIdle": 1}),
     {KubeQoS.BESTEFFORT: 0, KubeQoS.BURSTABLE: 1, KubeQoS.GUARANTEED: 0}),
    (slo("groupIdentity", beClass={"enable": True, "schedIdle": 1}),   # another policy: back to 0
     {KubeQoS.BESTEFFORT: 0, KubeQoS.BURSTABLE: 0, KubeQoS.GUARANTEED: 0}),
])
def test_kube_qos_cpu_idle(tmp_path: Path, node_slo: dict, want: dict) -> None:
    for d in ("kubepods/besteffort", "kubepods/burstable"):
        make_fake_v1_cgroup(tmp_path, d)
        for rel in (d, "kubepods"):
            (tmp_path / "cpu" / rel / "cpu.idle").write_text("0\n")
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1, driver="cgroupfs")),
                                 tmp_path, tmp_path))
    plugin.update_rules(parse_rules(node_slo, None))
    want_resources = {q: Resources(files={CPU_IDLE: v}) for q, v in want.items()}
    assert {q: plugin.kube_qos_resources(q) for q in KubeQoS} == want_resources


def test_kernel_without_cpu_idle_or_node_slo_writes_nothing(tmp_path: Path, caplog) -> None:
    make_fake_v1_cgroup(tmp_path, "kubepods/besteffort")
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1, driver="cgroupfs")),
                                 tmp_path, tmp_path))
    plugin.update_rules(parse_rules(None, None))
    assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
    plugin.update_rules(parse_rules(slo("coreSched", beClass={"schedIdle": 1}), None))
    with caplog.at_level(logging.WARNING):
        assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
        assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
    assert sum("no cpu.idle" in r.message for r in caplog.records) == 1


class FakeCookies:
    """The kernel's cookies as a dict pid -> cookie; ``supported=False`` answers EINVAL, a pid
    not in ``alive`` ESRCH; ``log`` names every call that changes a cookie."""

    def __init__(self, alive: set[int], supported: bool = True) -> None:
        self.cookies: dict[int, int] = {}
        self.alive, self.supported, self.next, self.calls = alive, supported, 0x100, 0
        self.log: list[str] = []

    def _check(self, pid: int) -> None:
        self.calls += 1
        if not self.supported:
            raise CookieError(errno.EINVAL, "Invalid argument")
        if pid not in self.alive and pid != os.getpid():
            raise CookieError(errno.ESRCH, "No such process")

    def get(self, pid: int) -> int:
        self._check(pid)
        return self.cookies.get(pid, 0)

    def create(self, pid: int) -> int:
        self.log.append("create")
        self._check(pid)
        self.next += 1
        self.cookies[pid] = self.next
        return self.next

    def share(self, from_pid: int, to_pid: int) -> None:
        self.log.append("share")
        self._check(from_pid)
        self._check(to_pid)
        self.cookies[to_pid] = self.cookies.get(from_pid, 0)

    def clear(self, pid: int) -> None:
        self.log.append("clear")
        self._check(pid)
        self.cookies.pop(pid, None)


@pytest.mark.parametrize("kernel_supports, says", [(False, "not supported by this kernel: EINVAL"),
                                                   (True, "supports core scheduling")])
def test_core_scheduling_support_is_said_once(tmp_path: Path, caplog, kernel_supports: bool, says: str) -> None:
    ops = FakeCookies(set(), supported=kernel_supports)
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1)), tmp_path, tmp_path), ops)
    with caplog.at_level(logging.INFO):
        plugin.update_rules(parse_rules(slo("coreSched", lsClass={"schedIdle": 1}), None))  # nothing enabled
        for enable_ls in (True, False, True):
            plugin.update_rules(parse_rules(slo("coreSched", lsClass={"enable": enable_ls}), None))
    assert ops.calls == 1
    assert sum(says in r.message for r in caplog.records) == 1


def test_real_kernel_probe_answers() -> None:
    ok, why = supported(PrctlCookies())
    assert ok or "no CONFIG_SCHED_CORE" in why


# upstream's getPodEnabledAndGroup: (enabled, group)
LS_BE_ON = parse_rules(slo("coreSched", lsClass={"enable": True}, beClass={"enable": True}), None)[CORE_SCHED]


@pytest.mark.parametrize("labels, kube_qos, want", [
    ({"koordinator.sh/qosClass": "LS"}, KubeQoS.BURSTABLE, (True, "-expeller")),
    ({"koordinator.sh/qosClass": "BE"}, KubeQoS.BESTEFFORT, (True, "")),
    ({"koordinator.sh/qosClass": "BE", LABEL_CORE_SCHED_GROUP_ID: "g1"}, KubeQoS.BESTEFFORT, (True, "g1")),
    ({"koordinator.sh/qosClass": "BE", LABEL_CORE_SCHED_POLICY: "exclusive"}, KubeQoS.BESTEFFORT, (True, "uid1")),
    ({"koordinator.sh/qosClass": "BE", LABEL_CORE_SCHED_POLICY: "none"}, KubeQoS.BESTEFFORT, (False, "")),
    ({"koordinator.sh/qosClass": "LSR"}, KubeQoS.GUARANTEED, (False, "-expeller")),
    ({}, KubeQoS.BESTEFFORT, (True, "")),                  # no Koordinator class: by kube QoS
])
def test_pod_group(labels: dict, kube_qos: KubeQoS, want: tuple) -> None:
    assert LS_BE_ON is not None
    assert pod_group(LS_BE_ON, labels, kube_qos, "uid1") == want


def test_cookie_manager_groups_processes(tmp_path: Path) -> None:
    """"sync cookie correctly ... for multiple containers", "with expeller and non-expeller
    groups": one cookie per group shared by every process in it, a disabled pod's processes
    lose theirs, an exited holder does not lose the group its cookie, an exited pid is skipped."""
    ops = FakeCookies({1, 2, 3, 4, 5, 6})
    m = CookieManager(ops)
    be = m.apply(True, "", [1, 2])
    assert be and ops.cookies == {1: be, 2: be}
    assert m.apply(True, "", [3]) == be                       # another BE container: the same group
    expeller = m.apply(True, "-expeller", [4])
    assert expeller not in (0, be)
    ops.alive.discard(1)
    ops.cookies.pop(1)
    assert m.apply(True, "", [5, 99]) == be and ops.cookies[5] == be   # 99 exited: skipped
    assert m.apply(False, "", [2, 3]) == 0 and 2 not in ops.cookies and 3 not in ops.cookies
    for pid in (5,):
        ops.alive.discard(pid)
        ops.cookies.pop(pid)
    fresh = m.apply(True, "", [6])                           # every holder gone: a new cookie
    assert fresh not in (0, be) and ops.cookies[6] == fresh


def run_container(tmp_path: Path, plugin: CoreSched, labels: dict, pids: list[int], cid: str,
                  parent: str = "kubepods/besteffort/pod1") -> None:
    procs = tmp_path / "cpu" / parent / cid / "cgroup.procs"
    procs.parent.mkdir(parents=True, exist_ok=True)
    procs.write_text("".join(f"{p}\n" for p in pids))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    hooks.run(HookPoint.POST_START_CONTAINER, ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name="c", container_id=cid,
        pod_labels=labels, pod_cgroup_parent="/" + parent)))


def test_plugin_gives_containers_their_group_cookie(tmp_path: Path) -> None:
    ops = FakeCookies({10, 11, 20, 30})
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1)), tmp_path, tmp_path), ops)
    plugin.update_rules(parse_rules(slo("coreSched", lsClass={"enable": True}, beClass={"enable": True}), None))
    run_container(tmp_path, plugin, {"koordinator.sh/qosClass": "BE"}, [10, 11], "c1")
    run_container(tmp_path, plugin, {"koordinator.sh/qosClass": "BE"}, [20], "c2")
    run_container(tmp_path, plugin, {"koordinator.sh/qosClass": "SYSTEM"}, [30], "c3")
    assert ops.cookies[10] == ops.cookies[11] == ops.cookies[20] != 0
    assert 30 not in ops.cookies, "SYSTEM pods are left alone"
    plugin.update_rules(parse_rules(slo("coreSched", lsClass={"enable": True}), None))  # BE off
    run_container(tmp_path, plugin, {"koordinator.sh/qosClass": "BE"}, [10, 11], "c1")
    assert 10 not in ops.cookies and 11 not in ops.cookies


def test_no_cookie_work_where_the_kernel_lacks_core_scheduling(tmp_path: Path) -> None:
    ops = FakeCookies({10}, supported=False)
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1)), tmp_path, tmp_path), ops)
    plugin.update_rules(parse_rules(slo("coreSched", beClass={"enable": True}), None))
    run_container(tmp_path, plugin, {"koordinator.sh/qosClass": "BE"}, [10], "c1")
    assert ops.calls == 1 and ops.cookies == {}


@pytest.mark.parametrize("value, written", [(1, ["cpu_idle"]), (0, []), (-1, None), (2, None), (True, None)])
def test_executor_range_checks_cpu_idle(tmp_path: Path, value, written) -> None:
    make_fake_v1_cgroup(tmp_path, "kubepods/besteffort")
    (tmp_path / "cpu/kubepods/besteffort/cpu.idle").write_text("0\n")
    ex = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    if written is not None:
        assert ex.apply("kubepods/besteffort", Resources(files={CPU_IDLE: value})) == written
        return
    with pytest.raises(CgroupError, match="cpu_idle"):
        ex.apply("kubepods/besteffort", Resources(files={CPU_IDLE: value}))
