"""What koordlet writes validates against upstream's CRD schemas (tests/data/crds), and
what upstream's NodeSLO defaults look like is accepted by the NodeSLO schema."""

from __future__ import annotations

import json

import pytest

from koord.koordlet.statesinformer import topology as t
from koord.koordlet.statesinformer import topologyinputs as ti
from koord.koordlet.statesinformer.nodemetric import build_status
from koord.koordlet.statesinformer.specs import DEFAULT_NODE_SLO_SPEC, node_metric_collect_policy
from koord_testing import crds
from koord_testing.pods import pod_meta

from .test_node_topology import compute
from .test_nodemetric import NOW, ByAggregation


def test_node_metric_status_validates():
    pods = [pod_meta("default", "p", "u1", "kubepods/besteffort/podu1", kube_qos="besteffort", koord_qos="BE")]
    status = build_status(ByAggregation(), pods, node_metric_collect_policy(None), now=NOW)
    obj = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": "n1"},
           "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
                                            "nodeAggregatePolicy": {"durations": ["5m0s"]}}},
           "status": status}
    assert crds.errors("NodeMetric", obj) == []


def test_node_resource_topology_validates():
    kubelet = ti.KubeletConfig(cpu_manager_policy="static", reserved_system_cpus="0")
    status = compute({"metadata": {"name": "n1", "uid": "u"}}, kubelet=kubelet,
                     state=json.dumps({"entries": {"g": {"c": "2-3"}}}).encode())
    obj = t.updated(status, t.new_nrt({"metadata": {"name": "n1", "uid": "u"}}))
    assert crds.errors("NodeResourceTopology", obj) == []


def test_upstream_nodeslo_defaults_validate():
    obj = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n1"},
           "spec": DEFAULT_NODE_SLO_SPEC}
    assert crds.errors("NodeSLO", obj) == []


@pytest.mark.parametrize("kind, obj, where", [
    # the schemas do catch what they should: a misspelt field, a bad quantity, a wrong type
    ("NodeMetric", {"metadata": {}, "status": {"nodeMetric": {"nodeUsage": {"resource": {}}}}}, "nodeUsage"),
    ("NodeMetric", {"metadata": {}, "status": {"nodeMetric": {"nodeUsage": {"resources": {"cpu": "1 core"}}}}},
     "resources.cpu"),
    ("NodeResourceTopology", {"metadata": {}, "zones": [{"name": "node-0"}]}, "zones.0"),
    ("NodeResourceTopology", {"metadata": {}, "topologyPolicies": "None"}, "topologyPolicies"),
])
def test_schemas_refuse_what_upstream_refuses(kind, obj, where):
    found = crds.errors(kind, obj)
    assert found and any(where in e for e in found), found


def test_nodeslo_rendered_from_upstreams_default_configmap_is_read_with_its_meaning():
    """upstream's slo-controller renders resourceUsedThresholdWithBE as its
    DefaultResourceThresholdStrategy with the ConfigMap's clusterStrategy over it."""
    from pathlib import Path

    import yaml

    from koord.koordlet.slo import threshold_config
    from koord.koordlet.statesinformer.specs import merged_node_slo

    configmap = yaml.safe_load((Path(crds.CRD_DIR).parent / "slo-controller-config.yaml").read_text())
    cluster = json.loads(configmap["data"]["resource-threshold-config"])["clusterStrategy"]
    upstream_default = {"enable": False, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
                        "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"}
    node_slo = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n1"},
                "spec": {"resourceUsedThresholdWithBE": {**upstream_default, **cluster}}}
    assert crds.errors("NodeSLO", node_slo) == []
    got = threshold_config(merged_node_slo(node_slo))
    assert got is not None
    assert (got.enable, got.cpu_suppress_threshold_percent, got.cpu_suppress_policy,
            got.memory_evict_threshold_percent) == (True, 65, "cpuset", 70)
