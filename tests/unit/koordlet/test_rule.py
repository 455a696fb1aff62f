"""parse_rules: NodeSLO and Node annotations to Rules, defaults, and errors naming the field."""

from __future__ import annotations

import json

import pytest

from koord.koordlet.resources import KoordQoS, KubeQoS
from koord.koordlet.runtimehooks.plugins import REGISTRY, parse_rules
from koord.koordlet.runtimehooks.plugins.batchresource import BATCH_CFS_QUOTA
from koord.koordlet.runtimehooks.plugins.cpunormalization import CPU_NORMALIZATION_RATIO
from koord.koordlet.runtimehooks.plugins.cpusetrule import CPUSET, CPUSharedPool
from koord.koordlet.runtimehooks.plugins.groupidentity import GROUP_IDENTITY
from koord.koordlet.runtimehooks.rule import RuleError


def node_slo(**classes: dict) -> dict:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
            "spec": {"resourceQOSStrategy": {k: {"cpuQOS": v} for k, v in classes.items()}}}


ALL_ON = node_slo(lsrClass={"enable": True}, lsClass={"enable": True}, beClass={"enable": True},
                  systemClass={"enable": True})


def test_defaults_without_anything() -> None:
    rules = parse_rules(None, None)
    assert all(rules[rule] == rule.absent for rule in REGISTRY.rules())
    assert not rules[GROUP_IDENTITY].enabled
    assert rules[CPUSET].kubelet_cpu_manager_policy == "none"
    assert rules[CPU_NORMALIZATION_RATIO] is None
    assert rules[CPUSET].cpu_shared_pools == () and rules[CPUSET].be_cpu_shared_pools == ()


@pytest.mark.parametrize("slo, qos, annotations, bvt", [
    # upstream defaults once enabled: LSR 2, LS 2, BE -1, SYSTEM 0, none 0
    (ALL_ON, KoordQoS.LSR, {}, 2),
    (ALL_ON, KoordQoS.LSE, {}, 2),
    (ALL_ON, KoordQoS.LS, {}, 2),
    (ALL_ON, KoordQoS.BE, {}, -1),
    (ALL_ON, KoordQoS.SYSTEM, {}, 0),
    (ALL_ON, KoordQoS.NONE, {}, 0),
    # a disabled class is neutral
    (None, KoordQoS.LS, {}, 0),
    (None, KoordQoS.BE, {}, 0),
    (node_slo(beClass={"enable": True}), KoordQoS.LS, {}, 0),
    (node_slo(beClass={"enable": True}), KoordQoS.BE, {}, -1),
    # NodeSLO values win over defaults
    (node_slo(lsClass={"enable": True, "groupIdentity": 1}), KoordQoS.LS, {}, 1),
    # the LS pod annotation overrides
    (ALL_ON, KoordQoS.LS, {"koordinator.sh/cpuQOS": '{"enable":true,"groupIdentity":-1}'}, -1),
    (ALL_ON, KoordQoS.LS, {"koordinator.sh/cpuQOS": '{"enable":false}'}, 0),
    (ALL_ON, KoordQoS.LS, {"koordinator.sh/cpuQOS": '{"enable":true}'}, 2),
    (ALL_ON, KoordQoS.BE, {"koordinator.sh/cpuQOS": '{"groupIdentity":2}'}, -1),  # LS only
    # core scheduling replaces group identity
    ({"spec": {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                       "lsClass": {"cpuQOS": {"enable": True}}}}}, KoordQoS.LS, {}, 0),
])
def test_pod_bvt(slo: dict | None, qos: KoordQoS, annotations: dict, bvt: int) -> None:
    assert parse_rules(slo, None)[GROUP_IDENTITY].pod_bvt(qos, annotations) == bvt


@pytest.mark.parametrize("slo, kube_qos, bvt", [
    (ALL_ON, KubeQoS.GUARANTEED, 0),
    (ALL_ON, KubeQoS.BURSTABLE, 2),
    (ALL_ON, KubeQoS.BESTEFFORT, -1),
    (node_slo(lsClass={"enable": True, "groupIdentity": 1}), KubeQoS.BURSTABLE, 1),
    (node_slo(lsClass={"enable": True}), KubeQoS.BESTEFFORT, 0),
    (None, KubeQoS.BURSTABLE, 0),
])
def test_kube_qos_bvt(slo: dict | None, kube_qos: KubeQoS, bvt: int) -> None:
    assert parse_rules(slo, None)[GROUP_IDENTITY].kube_qos_bvt(kube_qos) == bvt


def test_spec_alone_is_accepted() -> None:
    assert parse_rules(ALL_ON["spec"], None) == parse_rules(ALL_ON, None)
    assert parse_rules(ALL_ON, None)[GROUP_IDENTITY].enabled


@pytest.mark.parametrize("slo, field", [
    (node_slo(lsClass={"enable": "yes"}), "spec.resourceQOSStrategy.lsClass.cpuQOS.enable"),
    (node_slo(beClass={"groupIdentity": 3}), "spec.resourceQOSStrategy.beClass.cpuQOS.groupIdentity"),
    (node_slo(lsrClass={"groupIdentity": "2"}), "spec.resourceQOSStrategy.lsrClass.cpuQOS.groupIdentity"),
    ({"spec": {"resourceQOSStrategy": {"lsClass": []}}}, "spec.resourceQOSStrategy.lsClass"),
    ({"spec": {"resourceQOSStrategy": {"policies": {"cpuPolicy": "magic"}}}},
     "spec.resourceQOSStrategy.policies.cpuPolicy"),
    ({"spec": "nope"}, "NodeSLO spec"),
])
def test_bad_node_slo_names_field(slo: dict, field: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_rules(slo, None)
    assert field in str(info.value)


@pytest.mark.parametrize("annotation", ["{bad", "[1]", '{"enable":"yes"}', '{"groupIdentity":5}'])
def test_bad_pod_cpu_qos_annotation(annotation: str) -> None:
    rule = parse_rules(ALL_ON, None)[GROUP_IDENTITY]
    with pytest.raises(RuleError, match="koordinator.sh/cpuQOS"):
        rule.pod_bvt(KoordQoS.LS, {"koordinator.sh/cpuQOS": annotation})


def test_node_annotations() -> None:
    n = {"metadata": {"annotations": {
        "node.koordinator.sh/cpu-shared-pools": json.dumps(
            [{"socket": 0, "node": 0, "cpuset": "0-7"}, {"socket": 1, "node": 1, "cpuset": "8-15"}]),
        "node.koordinator.sh/be-cpu-shared-pools": json.dumps([{"socket": 0, "node": 0, "cpuset": "0-15"}]),
        "kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": "static", "options": {}}),
        "node.koordinator.sh/cpu-normalization-ratio": "1.20",
        "node.koordinator.sh/system-qos-resource": json.dumps({"cpuset": "16-17"}),
    }}}
    rules = parse_rules(None, n)
    assert rules[CPUSET].system_qos_cpuset == "16-17"
    assert rules[CPUSET].cpu_shared_pools == (CPUSharedPool(0, 0, "0-7"), CPUSharedPool(1, 1, "8-15"))
    assert rules[CPUSET].be_cpu_shared_pools == (CPUSharedPool(0, 0, "0-15"),)
    assert rules[CPUSET].kubelet_cpu_manager_policy == "static"
    assert rules[CPU_NORMALIZATION_RATIO] == pytest.approx(1.2)
    assert rules[GROUP_IDENTITY] == GROUP_IDENTITY.absent


@pytest.mark.parametrize("key, value, field", [
    ("node.koordinator.sh/cpu-shared-pools", "{oops", "node.koordinator.sh/cpu-shared-pools"),
    ("node.koordinator.sh/cpu-shared-pools", '{"cpuset":"0-3"}', "node.koordinator.sh/cpu-shared-pools"),
    ("node.koordinator.sh/cpu-shared-pools", '[{"socket":0,"node":0,"cpuset":"0-x"}]',
     "node.koordinator.sh/cpu-shared-pools[0].cpuset"),
    ("node.koordinator.sh/be-cpu-shared-pools", '[{"socket":-1,"node":0,"cpuset":"0"}]',
     "node.koordinator.sh/be-cpu-shared-pools[0].socket"),
    ("node.koordinator.sh/be-cpu-shared-pools", '[{"socket":0,"node":0}]',
     "node.koordinator.sh/be-cpu-shared-pools[0].cpuset"),
    ("kubelet.koordinator.sh/cpu-manager-policy", '{"policy":"dynamic"}',
     "kubelet.koordinator.sh/cpu-manager-policy"),
    ("node.koordinator.sh/system-qos-resource", "bad-fmt", "node.koordinator.sh/system-qos-resource"),
    ("node.koordinator.sh/system-qos-resource", '{"cpuset":"16-x"}',
     "node.koordinator.sh/system-qos-resource: cpuset"),
    ("node.koordinator.sh/system-qos-resource", '{"cpuset":7}', "node.koordinator.sh/system-qos-resource: cpuset"),
    ("node.koordinator.sh/cpu-normalization-ratio", "fast", "node.koordinator.sh/cpu-normalization-ratio"),
    ("node.koordinator.sh/cpu-normalization-ratio", "0.8", "node.koordinator.sh/cpu-normalization-ratio"),
    ("node.koordinator.sh/cpu-normalization-ratio", "inf", "node.koordinator.sh/cpu-normalization-ratio"),
])
def test_bad_node_annotation_names_field(key: str, value: str, field: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_rules(None, {"metadata": {"annotations": {key: value}}})
    assert field in str(info.value)


def test_rules_compare_by_value() -> None:
    """Plugins learn 'existing pods need a refresh' by comparing rules."""
    assert parse_rules(ALL_ON, None) == parse_rules(ALL_ON, None)
    assert parse_rules(ALL_ON, None) != parse_rules(None, None)
    hash(parse_rules(ALL_ON, None))


@pytest.mark.parametrize("cpuset", ["0-4000000000", "١", "٣-٥"])
@pytest.mark.parametrize("key", ["node.koordinator.sh/cpu-shared-pools", "node.koordinator.sh/be-cpu-shared-pools"])
def test_hostile_node_pool_cpuset_names_the_annotation(key, cpuset) -> None:
    import tracemalloc

    node = {"metadata": {"annotations": {key: json.dumps([{"socket": 0, "node": 0, "cpuset": cpuset}])}}}
    tracemalloc.start()
    try:
        with pytest.raises(RuleError, match=f"node annotation {key}\\[0\\].cpuset"):
            parse_rules(None, node)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("ratio", ["١.٢", "1_2", "nan", "inf", "0.5"])
def test_normalization_ratio_is_an_ascii_number_of_at_least_one(ratio) -> None:
    node = {"metadata": {"annotations": {"node.koordinator.sh/cpu-normalization-ratio": ratio}}}
    with pytest.raises(RuleError, match="cpu-normalization-ratio"):
        parse_rules(None, node)


def be_threshold(**fields: object) -> dict:
    return {"spec": {"resourceUsedThresholdWithBE": fields}}


# Upstream's Test_parseRuleForNodeSLO: the BE cfs quota is unset only while suppress is
# enabled with the cfsQuota policy.
@pytest.mark.parametrize("slo, enabled", [
    (None, True),                                                            # initialize true
    ({"spec": {}}, True),
    (be_threshold(enable=True, cpuSuppressPolicy="cfsQuota"), False),        # initialize false
    (be_threshold(enable=True, cpuSuppressPolicy="cpuset"), True),
    (be_threshold(enable=False, cpuSuppressPolicy="cfsQuota"), True),
    (be_threshold(enable=True), True),                                       # default policy cpuset
    (be_threshold(cpuSuppressPolicy="cfsQuota"), True),                      # default enable false
    ({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}, False),  # spec alone
])
def test_batch_cfs_quota(slo: dict | None, enabled: bool) -> None:
    assert parse_rules(slo, None)[BATCH_CFS_QUOTA] is enabled


def test_batch_cfs_quota_change_refreshes_pods() -> None:
    """Upstream's "rule change to false/true" and "rule not change" cases, as update_rules."""
    from koord.koordlet.runtimehooks.plugins.batchresource import BatchResource

    plugin = BatchResource.__new__(BatchResource)
    plugin.rules = None
    on = parse_rules(None, None)
    off = parse_rules(be_threshold(enable=True, cpuSuppressPolicy="cfsQuota"), None)
    assert plugin.update_rules(on)
    assert plugin.update_rules(off)
    assert not plugin.update_rules(parse_rules(be_threshold(enable=True, cpuSuppressPolicy="cfsQuota"), None))
    assert plugin.update_rules(parse_rules({"spec": {}}, None))
    assert not plugin.update_rules(parse_rules(be_threshold(enable=False, cpuSuppressPolicy="cfsQuota"), None))


@pytest.mark.parametrize("raw, field", [
    ({"enable": "yes"}, "resourceUsedThresholdWithBE.enable"),
    ({"cpuSuppressPolicy": "quota"}, "resourceUsedThresholdWithBE.cpuSuppressPolicy"),
    ("on", "resourceUsedThresholdWithBE"),
])
def test_bad_suppress_fields_name_the_field(raw: object, field: str) -> None:
    with pytest.raises(RuleError, match=field):
        parse_rules({"spec": {"resourceUsedThresholdWithBE": raw}}, None)


@pytest.mark.parametrize("strategy, field", [
    # a null section keeps upstream's defaults, a null value is refused by the rule reading it
    ({"lsClass": None, "beClass": {"cpuQOS": None}, "policies": None}, None),
    ({"lsClass": {"cpuQOS": {"enable": None}}}, "lsClass.cpuQOS.enable"),
    ({"lsClass": {"cpuQOS": {"groupIdentity": None}}}, "lsClass.cpuQOS.groupIdentity"),
    ({"beClass": {"cpuQOS": {"coreExpeller": None}}}, "beClass.cpuQOS.coreExpeller"),
    ({"beClass": {"cpuQOS": {"schedIdle": None}}}, "beClass.cpuQOS.schedIdle"),
    ({"policies": {"cpuPolicy": None}}, "policies.cpuPolicy"),
])
def test_nulls_in_the_node_slo(strategy: dict, field: str | None) -> None:
    node_slo = {"spec": {"resourceQOSStrategy": strategy}}
    if field is None:
        assert parse_rules(node_slo, None)[GROUP_IDENTITY] == GROUP_IDENTITY.absent
        return
    with pytest.raises(RuleError, match=field):
        parse_rules(node_slo, None)
