"""NodeResourceTopology: upstream's test tables (states_noderesourcetopology_test.go, by
name), the whole computation on a fake /sys tree, and both writers."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import config

from koord.apis.extension import (
    ANNOTATION_BE_CPU_SHARED_POOLS,
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_CPU_TOPOLOGY,
    ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_POD_CPU_ALLOCS,
    ANNOTATION_RESOURCE_STATUS,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
)
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.metriccache import kinds as mk
from koord.koordlet.metricsadvisor import AdvisorConfig
from koord.koordlet.metricsadvisor.collectors import NodeInfoCollector
from koord.koordlet.metricsadvisor.framework import Env
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.cpusetrule import CPUSET
from koord.koordlet.statesinformer import nrt
from koord.koordlet.statesinformer import topology as t
from koord.koordlet.statesinformer import topologyinputs as ti
from koord_testing.kubeapi import NODERESOURCETOPOLOGIES, FakeKubeAPI
from koord_testing.pods import FakeStatesInformer, pod_meta


def pod(uid, name, qos="", cpuset=None):
    p = pod_meta("default", name, uid, f"kubepods/pod{uid}", koord_qos=qos)
    if cpuset is not None:
        p = dataclasses.replace(p, annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": cpuset})})
    return p


# Test_calGuaranteedCpu
FILTER_STATE = json.dumps({"policyName": "none", "defaultCPUSet": "1-8", "entries": {
    "pod": {"container1": "1-2", "container2": "2-3"}, "LSPod": {"container1": "3-4"},
    "BEPod": {"container1": "4-5"}, "LSRPod": {"container1": "5-6"}, "LSEPod": {"container1": "6-7"}},
    "checksum": 962272150})
FILTER_PODS = [pod("pod", "test-pod"), pod("LSPod", "test-ls-pod", "LS", "3-4"), pod("BEPod", "test-be-pod", "BE"),
               pod("LSRPod", "test-lsr-pod", "LSR", "4-5"), pod("LSEPod", "test-lse-pod", "LSE", "5-6")]


@pytest.mark.parametrize("state, pods, want", [
    pytest.param('{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}', [], [],
                 id="Restore empty entry"),
    pytest.param('{"policyName": "none", "defaultCPUSet": "1-3", "entries": {"pod": {"container1": "1-2", '
                 '"container2": "2-3"}}, "checksum": 962272150}', [],
                 [{"uid": "pod", "cpuset": "1-3", "managedByKubelet": True}],
                 id="Restore checkpoint with normal assignment entry"),
    pytest.param(FILTER_STATE, FILTER_PODS,
                 [{"namespace": "default", "name": "test-pod", "uid": "pod", "cpuset": "1-3",
                   "managedByKubelet": True}],
                 id="Filter Managed Pods"),
])
def test_cal_guaranteed_cpu(state, pods, want):
    shared = {i: ti.CPU(i, i, 0, 0) for i in range(10)}
    assert t.pod_cpu_allocs(ti.cpu_manager_entries(state.encode()), pods, shared) == want
    assert not {1, 2, 3} & set(shared) if want else len(shared) == 10


@pytest.mark.parametrize("state", [pytest.param(b"", id="Restore non-existing checkpoint"),
                                   pytest.param(b"{", id="Restore checkpoint with invalid JSON"),
                                   pytest.param(b'{"entries": {"p": {"c": 3}}}', id="not a cpu list string")])
def test_cal_guaranteed_cpu_errors(state):
    with pytest.raises(ti.TopologyError, match="cpu_manager_state"):
        ti.cpu_manager_entries(state)


# Test_getNodeReserved: 12 cpus, 2 sockets; cpu i and i+6 are one core
FAKE_TOPO = [ti.CPU(i, i % 6, i % 2, i % 2) for i in range(12)]


def reservation(**value):
    return {ANNOTATION_NODE_RESERVATION: json.dumps(value)}


@pytest.mark.parametrize("annotations, want", [
    pytest.param({}, {}, id="node.annotation is nil"),
    pytest.param({"k": "v"}, {}, id="node.annotation not nil but nothing reserved"),
    pytest.param(reservation(), {}, id="node.annotation not nil but without cpu reserved"),
    pytest.param(reservation(resources={"cpu": "2"}), {"resources": {"cpu": "2"}, "reservedCPUs": "0,6"},
                 id="reserve cpu only by quantity"),
    pytest.param(reservation(resources={"cpu": "2500m"}), {"resources": {"cpu": "2500m"}, "reservedCPUs": "0,2,6"},
                 id="reserve cpu only by quantity but value not integer"),
    pytest.param(reservation(resources={"cpu": "-2"}), {"resources": {"cpu": "-2"}},
                 id="reserve cpu only by quantity but value is negative"),
    pytest.param(reservation(reservedCPUs="0-1"), {"reservedCPUs": "0-1"}, id="reserve cpu only by specific cpus"),
    pytest.param(reservation(reservedCPUs="-1"), {}, id="reserve cpu only by specific cpus but core id is unavailable"),
    pytest.param(reservation(resources={"cpu": "10"}, reservedCPUs="0-1"),
                 {"resources": {"cpu": "10"}, "reservedCPUs": "0-1"}, id="reserve cpu by specific cpus and quantity"),
])
def test_get_node_reserved(annotations, want):
    assert t.node_reservation(annotations, FAKE_TOPO) == want


# Test_removeSystemQOSCPUs, through compute(): the pools of a 16-cpu node minus system-QoS cpus
@pytest.mark.parametrize("system_qos, want_ls", [
    pytest.param(None, "0-15", id="system qos res is nil"),
    pytest.param({"cpuset": ""}, "0-15", id="system qos res is empty cpuset"),
    pytest.param({"cpuset": "0-3", "cpusetExclusive": False}, "0-15", id="system qos res is not exclusive"),
    pytest.param({"cpuset": "0b"}, "0-15", id="system qos with bad cpuset fmt"),
    pytest.param({"cpuset": "0-3"}, "4-15", id="exclude cpuset from share pool"),
])
def test_remove_system_qos_cpus(system_qos, want_ls):
    annotations = {ANNOTATION_SYSTEM_QOS_RESOURCE: json.dumps(system_qos)} if system_qos is not None else {}
    status = compute(node={"metadata": {"name": "n", "annotations": annotations}})
    pools = json.loads(status.annotations[ANNOTATION_CPU_SHARED_POOLS])
    assert pools == [{"socket": 0, "node": 0, "cpuset": want_ls}]
    # as Go's omitempty writes it back
    assert json.loads(status.annotations[ANNOTATION_SYSTEM_QOS_RESOURCE]) == (
        None if system_qos is None else {k: v for k, v in system_qos.items() if v != ""})


# Test_getTopologyPolicy
@pytest.mark.parametrize("policy, scope, want", [
    ("", "", "None"), ("", "container", "None"), ("best-effort", "", "None"),
    ("single-numa-node", "container", "SingleNUMANodeContainerLevel"),
    ("restricted", "container", "RestrictedContainerLevel"),
    ("best-effort", "container", "BestEffortContainerLevel"), ("none", "container", "None"),
    ("single-numa-node", "pod", "SingleNUMANodePodLevel"), ("restricted", "pod", "RestrictedPodLevel"),
    ("best-effort", "pod", "BestEffortPodLevel"), ("none", "pod", "None"),
])
def test_get_topology_policy(policy, scope, want):
    assert ti.topology_policy(policy, scope) == want


CPU_INFO_16 = {"processors": [{"cpu": i, "core": i, "socket": 0, "node": 0, "online": True} for i in range(16)]}
NUMA_16 = {"nodes": [{"id": 0, "cpus": list(range(16)), "memory_total_bytes": 64 * 2**30}]}


def compute(node, pods=(), kubelet=None, state=None, cpu_info=CPU_INFO_16, numa=NUMA_16):
    return t.compute(node=node, pods=list(pods), cpu_info=cpu_info, numa_info=numa, basic_info={},
                     kubelet=kubelet, cpu_manager_state=state)


def test_static_policy_allocations_leave_the_shared_pools():
    kubelet = ti.KubeletConfig(cpu_manager_policy="static", cpu_manager_policy_options={"full-pcpus-only": "true"},
                              reserved_system_cpus="0", topology_manager_policy="single-numa-node",
                              topology_manager_scope="pod")
    state = json.dumps({"policyName": "static", "entries": {"g": {"c": "2-3"}}}).encode()
    pods = [pod("g", "guaranteed"), pod("lse", "lse", "LSE", "4-5"), pod("lsr", "lsr", "LSR", "6-7")]
    status = compute({"metadata": {"name": "n", "annotations": reservation(reservedCPUs="15")}}, pods, kubelet, state)
    a = status.annotations
    assert a[ANNOTATION_KUBELET_CPU_MANAGER_POLICY] == '{"policy":"static","options":{"full-pcpus-only":"true"},' \
                                              '"reservedCPUs":"0"}'
    assert a[ANNOTATION_POD_CPU_ALLOCS] == '[{"namespace":"default","name":"guaranteed","uid":"g","cpuset":"2-3",' \
                                  '"managedByKubelet":true}]'
    assert a[ANNOTATION_CPU_SHARED_POOLS] == '[{"socket":0,"node":0,"cpuset":"0-1,8-14"}]'
    # LSR cpus stay shared with BE
    assert a[ANNOTATION_BE_CPU_SHARED_POOLS] == '[{"socket":0,"node":0,"cpuset":"0-1,6-14"}]'
    assert a[ANNOTATION_NODE_RESERVATION] == '{"reservedCPUs":"15"}'
    assert a[ANNOTATION_SYSTEM_QOS_RESOURCE] == "null"
    assert status.policy == "SingleNUMANodePodLevel"
    # the rules the cpuset plugin reads come from here
    rules = parse_rules(None, {"metadata": {}}, {"metadata": {"annotations": a}})
    assert rules[CPUSET].kubelet_cpu_manager_policy == "static"
    assert [p.cpuset for p in rules[CPUSET].cpu_shared_pools] == ["0-1,8-14"]


def test_without_kubelet_config_the_policy_is_empty_and_allocs_null():
    a = compute({"metadata": {"name": "n"}}).annotations
    assert a[ANNOTATION_KUBELET_CPU_MANAGER_POLICY] == "{}"
    assert (a[ANNOTATION_POD_CPU_ALLOCS], a[ANNOTATION_NODE_RESERVATION]) == ("null", "{}")


@pytest.mark.parametrize("configz, want", [
    (b'{"kubeletconfig": {"cpuManagerPolicy": "static", "kubeReserved": {"cpu": "500m"}, '
     b'"systemReserved": {"cpu": "1"}}}', ti.KubeletConfig(cpu_manager_policy="static", reserved_cpu=Fraction(3, 2))),
    (b'{"kubeletconfig": {}}', ti.KubeletConfig()),
])
def test_kubelet_configz(configz, want):
    assert ti.kubelet_config_of(configz) == want


@pytest.mark.parametrize("configz", [b"[]", b"{}", b'{"kubeletconfig": {"cpuManagerPolicy": 3}}',
                                     b'{"kubeletconfig": {"kubeReserved": {"cpu": "lots"}}}'])
def test_bad_configz_is_refused_naming_it(configz):
    with pytest.raises(ti.TopologyError, match="configz"):
        ti.kubelet_config_of(configz)



@given(st.binary(max_size=200))
def test_any_state_file_parses_or_is_refused(data):
    try:
        entries = ti.cpu_manager_entries(data)
    except ti.TopologyError:
        return
    assert all(isinstance(v, dict) for v in entries.values())



@given(st.dictionaries(st.sampled_from([ANNOTATION_NODE_RESERVATION, ANNOTATION_SYSTEM_QOS_RESOURCE, "x"]),
                       st.text(max_size=30) | st.sampled_from(['{"cpuset": 3}', "null", "[]", '{"reservedCPUs": 5}'])))
def test_any_node_annotations_compute_or_are_refused(annotations):
    try:
        compute({"metadata": {"name": "n", "annotations": annotations}})
    except ti.TopologyError:
        pass


# Test_nodeTopology_isChanged (the cases that apply to what koordlet owns)
def test_is_changed():
    status = compute({"metadata": {"name": "n"}})
    assert t.changed(status, None) == "metadata changed"
    stored = t.updated(status, t.new_nrt({"metadata": {"name": "n", "uid": "u"}}))
    assert t.changed(status, stored) is None
    reordered = json.loads(json.dumps(stored))
    key = ANNOTATION_CPU_TOPOLOGY  # same JSON, other spacing: not a change
    reordered["metadata"]["annotations"][key] = json.dumps(json.loads(stored["metadata"]["annotations"][key]))
    assert t.changed(status, reordered) is None
    stored["topologyPolicies"] = ["SingleNUMANodePodLevel"]
    assert t.changed(status, stored) == "TopologyPolicies changed"
    stored = t.updated(status, stored)
    stored["zones"][0]["resources"].append({"name": "example.com/other", "capacity": "1"})
    assert t.changed(status, stored) is None  # resources koordlet does not own
    assert {r["name"] for r in t.updated(status, stored)["zones"][0]["resources"]} >= {"example.com/other", "cpu"}
    stored["zones"][0]["resources"][0]["capacity"] = "15"
    assert t.changed(status, stored) == "Zones changed"


def fake_sys_env(tmp_path):
    """2 sockets x 2 cores x 2 threads, a NUMA node per socket, 1 GiB each."""
    for d in ("proc", "sys", "cg"):
        (tmp_path / d).mkdir()
    cfg = AdvisorConfig(proc_root=tmp_path / "proc", sys_root=tmp_path / "sys")
    env = Env(cfg, FakeStatesInformer([]), MetricCache(None),
              CgroupExecutor(CgroupLayout(tmp_path / "cg", driver="cgroupfs")))
    (env.proc / "cpuinfo").write_text("".join(f"processor : {c}\nvendor_id : GenuineIntel\nmodel name : Fake CPU\n\n"
                                              for c in range(8)))
    base = env.sys / "devices/system/cpu"
    for cpu in range(8):
        topo = base / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{cpu // 4}\n")
        (topo / "core_id").write_text(f"{cpu % 2}\n")
    (base / "smt").mkdir()
    (base / "smt" / "active").write_text("1\n")
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        d = env.sys / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {node} MemTotal: 1048576 kB\n")
    NodeInfoCollector(env).collect(1.0)
    return env


def test_report_from_a_fake_sys_tree_to_a_file(tmp_path):
    env = fake_sys_env(tmp_path)
    informer = FakeStatesInformer([], node={"metadata": {"name": "n1", "uid": "u1"}})
    path = tmp_path / "nrt.yaml"
    reporter = nrt.NodeTopologyReporter(informer, env.cache, interval=1, var_lib_kubelet=tmp_path,
                                        proc_root=env.proc, sys_root=env.sys, sys_fs_root=tmp_path / "sysfs",
                                        kubelet=None, writer=nrt.FileNRTWriter(path))
    reporter.report_once()
    obj = yaml.safe_load(path.read_text())
    a = obj["metadata"]["annotations"]
    assert json.loads(a[ANNOTATION_CPU_BASIC_INFO]) == {"cpuModel": "Fake CPU", "hyperThreadEnabled": True,
                                               "vendorID": "GenuineIntel"}
    detail = json.loads(a[ANNOTATION_CPU_TOPOLOGY])["detail"]
    assert [(c["id"], c["socket"], c["node"]) for c in detail] == [(i, i // 4, i // 4) for i in range(8)]
    assert detail[0]["core"] == detail[2]["core"] != detail[4]["core"]  # threads of one core share it
    assert json.loads(a[ANNOTATION_CPU_SHARED_POOLS]) == [{"socket": 0, "node": 0, "cpuset": "0-3"},
                                                 {"socket": 1, "node": 1, "cpuset": "4-7"}]
    assert [(z["name"], {r["name"]: r["capacity"] for r in z["resources"]}) for z in obj["zones"]] == [
        (f"node-{i}", {"cpu": "4", "hugepages-1Gi": "0", "hugepages-2Mi": "0", "memory": "1Gi"}) for i in (0, 1)]
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert informer.get_node_topo() == obj
    mtime = path.stat().st_mtime_ns
    reporter.report_once()
    assert path.stat().st_mtime_ns == mtime  # unchanged: not rewritten


def test_kube_writer_creates_once_and_updates_only_on_change(tmp_path):
    env = fake_sys_env(tmp_path)
    with FakeKubeAPI() as api:
        client = config.new_client_from_config(config_file=str(api.write_kubeconfig(tmp_path / "kc")))
        node = {"metadata": {"name": "n1", "uid": "u1"}}
        informer = FakeStatesInformer([], node=node)
        reporter = nrt.NodeTopologyReporter(informer, env.cache, interval=1, var_lib_kubelet=tmp_path,
                                            proc_root=env.proc, sys_root=env.sys, sys_fs_root=tmp_path,
                                            kubelet=None, writer=nrt.KubeNRTWriter(client, "n1"))
        for _ in range(3):
            reporter.report_once()
        verbs = [v for v, p in api.requests if p.startswith(NODERESOURCETOPOLOGIES)]
        assert verbs == ["get", "create", "update"]
        stored = api.objects[NODERESOURCETOPOLOGIES]["n1"]
        assert ANNOTATION_CPU_TOPOLOGY in stored["metadata"]["annotations"]
        node["metadata"]["annotations"] = reservation(reservedCPUs="0")
        reporter.report_once()
        assert [v for v, p in api.requests if p.startswith(NODERESOURCETOPOLOGIES)][-1] == "update"
        annotations = api.objects[NODERESOURCETOPOLOGIES]["n1"]["metadata"]["annotations"]
        pools = json.loads(annotations[ANNOTATION_CPU_SHARED_POOLS])
        assert pools[0]["cpuset"] == "1-3"


def test_kube_writer_without_the_crd_keeps_the_topology_locally(tmp_path, caplog):
    env = fake_sys_env(tmp_path)
    with FakeKubeAPI(crds=False) as api:
        client = config.new_client_from_config(config_file=str(api.write_kubeconfig(tmp_path / "kc")))
        informer = FakeStatesInformer([], node={"metadata": {"name": "n1"}})
        reporter = nrt.NodeTopologyReporter(informer, env.cache, interval=1, var_lib_kubelet=tmp_path,
                                            proc_root=env.proc, sys_root=env.sys, sys_fs_root=tmp_path,
                                            kubelet=None, writer=nrt.KubeNRTWriter(client, "n1"))
        reporter.report_once()
        reporter.report_once()
        assert informer.get_node_topo() is not None
        assert sum("does not serve NodeResourceTopology" in r.getMessage() for r in caplog.records) == 1


def test_round_is_skipped_until_inputs_exist(tmp_path, caplog):
    informer = FakeStatesInformer([], node=None)
    reporter = nrt.NodeTopologyReporter(informer, MetricCache(None), interval=1, var_lib_kubelet=tmp_path,
                                        proc_root=tmp_path, sys_root=tmp_path, sys_fs_root=tmp_path,
                                        kubelet=None, writer=None)
    assert reporter.report_once() is None
    informer.node = {"metadata": {"name": "n"}}
    assert reporter.report_once() is None
    said = [r.getMessage() for r in caplog.records if "not computed" in r.getMessage()]
    assert len(said) == 2 and "Node" in said[0] and "CPU" in said[1]
    assert mk.NODE_CPU_INFO == "node_cpu_info"


@pytest.mark.parametrize("node, named", [
    ({"metadata": []}, "Node metadata"),
    ({"metadata": {"annotations": ["x"]}}, "metadata.annotations"),
    ({"metadata": {"annotations": {ANNOTATION_SYSTEM_QOS_RESOURCE: 5}}}, ANNOTATION_SYSTEM_QOS_RESOURCE),
    ({"metadata": {"annotations": {ANNOTATION_SYSTEM_QOS_RESOURCE: '{"cpusetExclusive": "yes"}'}}}, "cpusetExclusive"),
    ({"metadata": {"labels": "x"}}, "metadata.labels"),
])
def test_hostile_node_is_refused_naming_the_field(node, named):
    with pytest.raises(ti.TopologyError, match=named):
        compute(node)


def test_informer_calls_back_when_the_topology_changes():
    from koord.koordlet.statesinformer import NODE_TOPOLOGY, StatesInformer

    informer = StatesInformer()
    fired = []
    informer.register_callback(NODE_TOPOLOGY, lambda: fired.append(informer.get_node_topo()))
    status = compute({"metadata": {"name": "n"}})
    obj = t.updated(status, t.new_nrt({"metadata": {"name": "n"}}))
    informer.set_node_topo(obj)
    informer.set_node_topo(json.loads(json.dumps(obj)))  # same content: no callback
    assert fired == [obj]
    node = {"metadata": {"annotations": {ANNOTATION_KUBELET_CPU_MANAGER_POLICY: '{"policy":"static"}'}}}
    rules = parse_rules(None, node, informer.get_node_topo())
    assert rules[CPUSET].kubelet_cpu_manager_policy == "none"  # the topology's word, not the Node's
