"""CoreSched: upstream's rule table (per-class params under cpuPolicy coreSched), the
kube-QoS cpu.idle values over a fake tree, and the one-line report of a kernel without core
scheduling (prctl stubbed)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from koord.koordlet.resourceexecutor.executor import CgroupError, CgroupExecutor
from koord.koordlet.runtimehooks.hooks import PluginEnv
from koord.koordlet.runtimehooks.plugins.coresched import CoreSched
from koord.koordlet.runtimehooks.protocol import KubeQoS, Resources
from koord.koordlet.runtimehooks.rule import CoreSchedParam, CoreSchedRule, RuleError, parse_rules
from koord.testing.cgroupfs import make_fake_v1_cgroup


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
    assert parse_rules(node_slo, None).core_sched == want


def test_no_node_slo_no_rule() -> None:
    assert parse_rules(None, None).core_sched is None


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
    plugin = CoreSched(PluginEnv(CgroupExecutor(tmp_path, version=1, driver="cgroupfs"), tmp_path, tmp_path))
    plugin.update_rules(parse_rules(node_slo, None))
    assert {q: plugin.kube_qos_resources(q) for q in KubeQoS} == {q: Resources(cpu_idle=v) for q, v in want.items()}


def test_kernel_without_cpu_idle_or_node_slo_writes_nothing(tmp_path: Path, caplog) -> None:
    make_fake_v1_cgroup(tmp_path, "kubepods/besteffort")
    plugin = CoreSched(PluginEnv(CgroupExecutor(tmp_path, version=1, driver="cgroupfs"), tmp_path, tmp_path))
    plugin.update_rules(parse_rules(None, None))
    assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
    plugin.update_rules(parse_rules(slo("coreSched", beClass={"schedIdle": 1}), None))
    with caplog.at_level(logging.WARNING):
        assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
        assert plugin.kube_qos_resources(KubeQoS.BESTEFFORT) is None
    assert sum("no cpu.idle" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("supported, says", [(False, "not supported by this kernel: EINVAL"),
                                             (True, "supports core scheduling")])
def test_core_scheduling_support_is_said_once(tmp_path: Path, caplog, supported: bool, says: str) -> None:
    plugin = CoreSched(PluginEnv(CgroupExecutor(tmp_path, version=1), tmp_path, tmp_path))
    calls = []
    plugin.probe = lambda: (calls.append(1), (supported, "EINVAL"))[1]
    with caplog.at_level(logging.INFO):
        plugin.update_rules(parse_rules(slo("coreSched", lsClass={"schedIdle": 1}), None))  # nothing enabled
        for enable_ls in (True, False, True):
            plugin.update_rules(parse_rules(slo("coreSched", lsClass={"enable": enable_ls}), None))
    assert len(calls) == 1
    assert sum(says in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("value", [-1, 2, "1"])
def test_executor_range_checks_cpu_idle(tmp_path: Path, value) -> None:
    make_fake_v1_cgroup(tmp_path, "kubepods/besteffort")
    (tmp_path / "cpu/kubepods/besteffort/cpu.idle").write_text("0\n")
    ex = CgroupExecutor(tmp_path, version=1)
    if value == "1":
        assert ex.write("kubepods/besteffort", "cpu_idle", value)
        return
    with pytest.raises(CgroupError, match="cpu_idle"):
        ex.write("kubepods/besteffort", "cpu_idle", value)
