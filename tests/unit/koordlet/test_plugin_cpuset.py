"""CPUSetAllocator through Hooks: allocated cpusets, shared pools, kubelet static policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import Resources
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.cpuset import CPUSetAllocator, host_app_cpuset
from koord.koordlet.runtimehooks.plugins.cpusetrule import CPUSET
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    HookPodMeta,
    PodContext,
    PodRequest,
)

STATUS = "scheduling.koordinator.sh/resource-status"
POOLS = [{"socket": 0, "node": 0, "cpuset": "0-7"}, {"socket": 1, "node": 1, "cpuset": "8-15"}]
NO_FS = Path("/nonexistent")  # the plugin must not touch the file system
BE_POOLS = [{"socket": 0, "node": 0, "cpuset": "0-3"}, {"socket": 1, "node": 1, "cpuset": "8-11"}]


def node(policy: str = "none", pools: list | None = POOLS, be_pools: list | None = BE_POOLS,
         system: str | None = None) -> dict:
    annotations = {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": policy})}
    if system is not None:
        annotations["node.koordinator.sh/system-qos-resource"] = system
    if pools is not None:
        annotations["node.koordinator.sh/cpu-shared-pools"] = json.dumps(pools)
    if be_pools is not None:
        annotations["node.koordinator.sh/be-cpu-shared-pools"] = json.dumps(be_pools)
    return {"metadata": {"annotations": annotations}}


def run(node_obj: dict | None, qos: str, annotations: dict | None = None,
        stage: HookPoint = HookPoint.PRE_CREATE_CONTAINER, parent: str = "/kubepods/pod1",
        gates: dict[str, bool] | None = None, disable_unset: bool = False,
        container: str = "c1") -> ContainerContext:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS,
                                       feature_gates=gates or {}, disable_unset_cpu_quota=disable_unset))
    if node_obj is not None:
        plugin.update_rules(parse_rules(None, node_obj))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    labels = {"koordinator.sh/qosClass": qos} if qos else {}
    ctx = ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name=container, container_id="cid",
        pod_labels=labels, pod_annotations=annotations or {}, pod_cgroup_parent=parent))
    hooks.run(stage, ctx)
    return ctx


def numa(*nodes: tuple[int, dict]) -> dict[str, str]:
    """A resource-status granting ``resources`` on each NUMA node."""
    return {STATUS: json.dumps({"numaNodeResources": [{"node": n, "resources": r} for n, r in nodes]})}


BURSTABLE, BESTEFFORT = "/kubepods/burstable/pod1", "/kubepods/besteffort/pod1"
CPU2, HUGE = {"cpu": "2"}, {"hugepages-1Gi": "2Gi"}


@pytest.mark.parametrize("node_obj, qos, annotations, expected", [
    # allocated by the scheduler: exactly that cpuset, and no cfs quota whatever the class
    (node(), "LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (node(), "LSE", {STATUS: '{"cpuset":"2,4"}'}, Resources(cpuset_cpus="2,4", cpu_quota=-1)),
    (None, "LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (node(policy="static"), "LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (node(), "LS", {STATUS: '{"cpuset":"5"}'}, Resources(cpuset_cpus="5", cpu_quota=-1)),
    (node(), "LS", {STATUS: '{"cpuset":"5","numaNodeResources":[{"node":1,"resources":{"cpu":"2"}}]}'},
     Resources(cpuset_cpus="5", cpu_quota=-1)),
    # every share pool, joined in order as upstream joins them
    (node(), "LS", {}, Resources(cpuset_cpus="0-7,8-15")),
    (node(), "", {}, Resources(cpuset_cpus="0-7,8-15")),
    (node(), "LSR", {STATUS: '{"numaNodeResources":[]}'}, Resources(cpuset_cpus="0-7,8-15")),
    (node(pools=[{"socket": 0, "node": 0, "cpuset": "0-7"}]), "LS", {}, Resources(cpuset_cpus="0-7")),
    (node(pools=None), "LS", {}, Resources(cpuset_cpus="")),
    # NUMA-aware: the pools of the granted NUMA nodes only
    (node(), "LS", numa((1, CPU2)), Resources(cpuset_cpus="8-15")),
    (node(), "LS", numa((0, {"cpu": "500m"}), (1, CPU2)), Resources(cpuset_cpus="0-7,8-15")),
    (node(), "LS", numa((1, {"kubernetes.io/batch-cpu": "1000"})), Resources(cpuset_cpus="8-15")),
    (node(), "LS", numa((1, {"cpu": "0"})), Resources(cpuset_cpus="0-7,8-15")),
    (node(), "LS", numa((1, {"kubernetes.io/batch-cpu": "0"})), Resources(cpuset_cpus="0-7,8-15")),
    (node(), "LS", numa((1, HUGE)), Resources(cpuset_cpus="0-7,8-15")),
    (node(), "LS", {STATUS: '{"numaNodeResources":[{"node":1}]}'}, Resources(cpuset_cpus="0-7,8-15")),
    (node(), "LS", numa((3, CPU2)), Resources(cpuset_cpus="")),
    (node(), "", numa((0, CPU2)), Resources(cpuset_cpus="0-7")),
    (node(policy="static"), "", numa((1, CPU2)), Resources(cpuset_cpus="8-15")),
    # QoS=BE without BECPUManager: the besteffort tier's empty cpuset (kube QoS guaranteed here)
    (node(), "BE", numa((1, CPU2)), Resources(cpuset_cpus="0-7,8-15")),
    # kubelet static policy owns pods without a Koordinator class; LS still gets pools
    (node(policy="static"), "", {}, Resources()),
    (node(policy="static"), "LSR", {}, Resources()),
    (node(policy="static"), "LS", {}, Resources(cpuset_cpus="0-7,8-15")),
    # SYSTEM without a system-qos-resource: like a pod without a class
    (node(), "SYSTEM", {}, Resources(cpuset_cpus="0-7,8-15")),
    (node(policy="static"), "SYSTEM", {}, Resources()),
    (node(system='{"cpuset":"16-17"}'), "SYSTEM", {}, Resources(cpuset_cpus="16-17")),
    (node(system='{"cpuset":"16-17"}'), "SYSTEM", numa((1, HUGE)), Resources(cpuset_cpus="16-17")),
    (node(system='{"cpuset":""}'), "SYSTEM", {}, Resources(cpuset_cpus="0-7,8-15")),
    (node(system='{"cpuset":"16-17"}'), "LS", {}, Resources(cpuset_cpus="0-7,8-15")),
    (None, "LS", {}, Resources()),
])
def test_container_cpuset(node_obj: dict | None, qos: str, annotations: dict, expected: Resources) -> None:
    assert run(node_obj, qos, annotations).response.resources == expected


@pytest.mark.parametrize("qos, annotations, parent, gates, expected", [
    # upstream's getContainerCPUSet table (pools: LS 0-7 / 8-15, BE 0-3 / 8-11)
    ("BE", numa((0, CPU2)), BURSTABLE, {"BECPUManager": True}, "0-3"),
    ("", numa((0, CPU2)), BURSTABLE, {}, "0-7"),
    ("LS", {}, BURSTABLE, {}, "0-7,8-15"),
    ("LS", numa((0, HUGE)), BURSTABLE, {}, "0-7,8-15"),
    ("", {}, BURSTABLE, {}, "0-7,8-15"),
    ("", {}, BESTEFFORT, {}, ""),
    ("LS", numa((1, CPU2)), BURSTABLE, {}, "8-15"),
    ("BE", numa((1, {"kubernetes.io/batch-cpu": "2000"})), BESTEFFORT, {"BECPUManager": True}, "8-11"),
    # BE pods are left to CPU suppress unless BECPUManager names their pools
    ("BE", numa((1, {"kubernetes.io/batch-cpu": "2000"})), BESTEFFORT, {}, ""),
    ("BE", {}, BESTEFFORT, {"BECPUManager": True}, ""),
    ("BE", {}, BESTEFFORT, {}, ""),
    ("BE", {}, BURSTABLE, {}, "0-7,8-15"),
    ("LS", {}, BESTEFFORT, {}, "0-7,8-15"),
    ("SYSTEM", {}, BESTEFFORT, {}, ""),
])
def test_container_cpuset_by_kube_qos_and_gates(qos: str, annotations: dict, parent: str,
                                                gates: dict[str, bool], expected: str) -> None:
    res = run(node(), qos, annotations, parent=parent, gates=gates).response.resources
    assert res.cpuset_cpus == expected


def test_static_policy_leaves_burstable_and_clears_besteffort() -> None:
    assert run(node(policy="static"), "", {}, parent=BURSTABLE).response.resources == Resources()
    assert run(node(policy="static"), "", {}, parent=BESTEFFORT).response.resources == Resources(cpuset_cpus="")


def test_sandbox_container_is_decided_like_the_pods_containers() -> None:
    ctx = run(node(), "LS", numa((1, CPU2)), container="")
    assert ctx.response.resources.cpuset_cpus == "8-15"


@pytest.mark.parametrize("disable_unset, expected", [
    (False, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (True, Resources(cpuset_cpus="0-3")),
])
def test_disable_unset_cpu_quota_keeps_container_quota(disable_unset: bool, expected: Resources) -> None:
    ctx = run(node(), "LSR", {STATUS: '{"cpuset":"0-3"}'}, disable_unset=disable_unset)
    assert ctx.response.resources == expected


def test_update_container_resources_too() -> None:
    ctx = run(node(), "LS", stage=HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    assert ctx.response.resources.cpuset_cpus == "0-7,8-15"
    assert ctx.to_proto().container_resources.cpuset_cpus == "0-7,8-15"


@pytest.mark.parametrize("status, reason", [
    ("{not json", "bad JSON"),
    ('["0-3"]', "JSON object"),
    ('{"cpuset": 3}', "not a string"),
    ('{"cpuset": "3-1"}', "bad cpuset"),
    ('{"numaNodeResources": {"node": 1}}', "numaNodeResources=.* is not a list"),
    ('{"numaNodeResources": [3]}', r"numaNodeResources\[0\]=3 is not an object"),
    ('{"numaNodeResources": [{"node": -1}]}', r"numaNodeResources\[0\]\.node"),
    ('{"numaNodeResources": [{"node": "1"}]}', r"numaNodeResources\[0\]\.node"),
    ('{"numaNodeResources": [{"node": 1, "resources": []}]}', r"numaNodeResources\[0\]\.resources"),
    ('{"numaNodeResources": [{"node": 1, "resources": {"cpu": "two"}}]}', r"\.resources: bad quantity"),
])
def test_bad_resource_status(status: str, reason: str) -> None:
    with pytest.raises(HookError, match=reason) as info:
        run(node(), "LSR", {STATUS: status})
    assert STATUS in str(info.value)
    assert "ns/p container c1" in str(info.value)


@pytest.mark.parametrize("qos, annotations, expected", [
    # upstream's TestUnsetPodCPUQuota cases: a cpuset in resource-status unsets the pod's quota
    ("LS", {STATUS: '{"cpuset":"2-4"}'}, Resources(cpu_quota=-1)),
    ("LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpu_quota=-1)),
    ("LS", {STATUS: '{"numaNodeResources":[{"node":0}]}'}, Resources()),  # a share-pool allocation
    ("BE", {}, Resources()),
    ("", {}, Resources()),
])
def test_pod_cpu_quota_unset_for_cpuset_pods(qos: str, annotations: dict, expected: Resources) -> None:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"),
                                labels={"koordinator.sh/qosClass": qos} if qos else {},
                                annotations=annotations, cgroup_parent="/kubepods/pod1"))
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    assert ctx.response.resources == expected


def test_pod_cpu_quota_bad_resource_status_is_an_error() -> None:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"),
                                annotations={STATUS: "bad-format"}, cgroup_parent="/kubepods/pod1"))
    with pytest.raises(HookError, match=STATUS):
        hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)


@pytest.mark.parametrize("disable_unset, expected", [
    (False, Resources(cpu_quota=-1)),
    (True, Resources()),
])
def test_disable_unset_cpu_quota_keeps_pod_quota(disable_unset: bool, expected: Resources) -> None:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS,
                                       disable_unset_cpu_quota=disable_unset))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid="1"),
                                labels={"koordinator.sh/qosClass": "LSR"},
                                annotations={STATUS: '{"cpuset":"0-3"}'}, cgroup_parent="/kubepods/pod1"))
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    assert ctx.response.resources == expected


@pytest.mark.parametrize("qos, expected", [
    # upstream's getHostAppCpuset table: LS gets every share pool, any other class is an error
    ("LS", "0-7,8-15"),
    ("LSR", None),
    ("BE", None),
])
def test_host_app_cpuset(qos: str, expected: str | None) -> None:
    rules = parse_rules(None, node())
    if expected is None:
        with pytest.raises(ValueError, match="host application nginx: qos"):
            host_app_cpuset(rules[CPUSET], "nginx", qos)
    else:
        assert host_app_cpuset(rules[CPUSET], "nginx", qos) == expected


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"node": "n1", **labels})


@pytest.mark.parametrize("per_cpu", [False, True])
def test_share_pool_metrics(per_cpu: bool) -> None:
    registry = CollectorRegistry()
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(CgroupLayout(NO_FS, version=1)), NO_FS, NO_FS, registry=registry,
                                       node="n1", feature_gates={"PerCPUMetric": per_cpu}))
    plugin.update_rules(parse_rules(None, node(pools=[{"socket": 0, "node": 0, "cpuset": "0-2"},
                                                      {"socket": 0, "node": 1, "cpuset": "5"}],
                                               be_pools=[{"socket": 0, "node": 0, "cpuset": "1"}])))
    assert sample(registry, "koordlet_cpuset_share_pool_cpu_cores") == 4
    assert sample(registry, "koordlet_cpuset_be_share_pool_cpu_cores") == 1
    assert sample(registry, "koordlet_cpuset_share_pool_info", cpu="5") == (1 if per_cpu else None)
    assert sample(registry, "koordlet_cpuset_be_share_pool_info", cpu="1") == (1 if per_cpu else None)
    # a cpu that left the pool stops being reported
    plugin.update_rules(parse_rules(None, node(pools=[{"socket": 0, "node": 0, "cpuset": "0-2"}], be_pools=None)))
    assert sample(registry, "koordlet_cpuset_share_pool_cpu_cores") == 3
    assert sample(registry, "koordlet_cpuset_be_share_pool_cpu_cores") == 0
    assert sample(registry, "koordlet_cpuset_share_pool_info", cpu="5") is None
    assert sample(registry, "koordlet_cpuset_share_pool_info", cpu="2") == (1 if per_cpu else None)
