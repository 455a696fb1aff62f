"""A koordlet QoS rig for end-to-end tests that need pod specs: the states informer reads
Node and NodeSLO from files and pods from a kubelet ``/pods`` stand-in describing pods run
on the real containerd, under a private kube dir; the QoS manager writes real cgroups.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.metricsadvisor.advisor import MetricsAdvisor
from koord.koordlet.metricsadvisor.config import AdvisorConfig
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.statesinformer import NODE, NODE_SLO, CriPodsSource, FileObjectsSource, StatesInformer
from koord.koordlet.statesinformer.kubelet import KubeletPodsSource
from koord_testing.cgroups import CGROUP_ROOT, enable_v2_controllers
from koord_testing.containerd import Containerd
from koord_testing.kubelet import KubeletClient
from koord_testing.kubeletpods import KubeletPodsServer, pod_json

QOS_LABEL = "koordinator.sh/qosClass"


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


@dataclass
class QOSRig:
    kubelet: KubeletClient
    image: str
    kube: str
    server: KubeletPodsServer
    node_file: Path
    slo_file: Path
    informer: StatesInformer | None = None
    cache: MetricCache | None = None
    qos: QOSManager | None = None
    executor: ResourceExecutor | None = None
    advisor: MetricsAdvisor | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)

    def node(self, capacity: dict[str, str], allocatable: dict[str, str]) -> None:
        write_json(self.node_file, {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"},
            "status": {"capacity": capacity, "allocatable": allocatable,
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}})

    def slo(self, spec: dict) -> None:
        write_json(self.slo_file, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                                   "metadata": {"name": "test-node"}, "spec": spec})

    def run_pod(self, name: str, qos: str, koord_qos: str, command: list[str], *,
                requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
                resources: dict | None = None, annotations: dict[str, str] | None = None,
                priority: int | None = None, labels: dict[str, str] | None = None) -> tuple[str, str]:
        """A pod with one container ``main`` on containerd, listed by the kubelet stand-in
        with the given spec; returns (sandbox id, container id)."""
        sandbox = self.kubelet.run_pod(name, labels={QOS_LABEL: koord_qos, **(labels or {})}, qos=qos,
                                       kube_dir=self.kube, annotations=annotations)
        cid = self.kubelet.run_container(sandbox, "main", self.image, command=command, resources=resources)
        self.pods.append(pod_json(self.kubelet, sandbox, {"main": cid}, qos=qos,
                                  requests={"main": requests or {}}, limits={"main": limits or {}},
                                  priority=priority))
        self.server.pods = list(self.pods)
        return sandbox, cid

    def forget(self, sandbox: str) -> None:
        uid = self.kubelet.sandbox_configs[sandbox].metadata.uid
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != uid]
        self.server.pods = list(self.pods)

    def start(self, config: QOSConfig, cri_endpoint: str | None = None, advisor: bool = False) -> QOSManager:
        """The modules, pods listed from the kubelet stand-in, or from CRI when ``cri_endpoint``
        is given (CRI knows the sandbox, not the requests); with ``advisor`` the metrics
        advisor measures the pods' usage into the metric cache."""
        box: dict[str, StatesInformer] = {}
        layout = CgroupLayout(CGROUP_ROOT, driver="cgroupfs", kube_dir=self.kube)
        pods: KubeletPodsSource | CriPodsSource = KubeletPodsSource(
            lambda: box["informer"].get_node(), layout, insecure_tls=True, read_only_port=self.server.port)
        if cri_endpoint is not None:
            pods = CriPodsSource(cri_endpoint, layout)
        informer = StatesInformer(objects=FileObjectsSource({NODE: self.node_file, NODE_SLO: self.slo_file}),
                                  pods=pods, pods_interval=1.0)
        box["informer"] = informer
        self.informer, self.cache = informer, MetricCache(None)
        self.executor = ResourceExecutor(layout)
        self.qos = QOSManager(config, informer, self.cache, self.executor)
        informer.start()
        if advisor:
            self.advisor = MetricsAdvisor(AdvisorConfig(), informer, self.cache, self.executor)
            self.advisor.start()
        self.qos.start()
        return self.qos

    def stop(self) -> None:
        if self.qos is not None:
            self.qos.stop()
        if self.advisor is not None:
            self.advisor.stop()
        if self.informer is not None:
            self.informer.stop()
        if self.cache is not None:
            self.cache.close()


def remove_kube_dir(kube: str) -> None:
    """The rig's kube dirs on every hierarchy, deepest first, once its pods are gone."""
    top = kube.split("/")[0]
    bases = [CGROUP_ROOT / top] + [h / top for h in CGROUP_ROOT.iterdir() if h.is_dir()]
    for base in bases:
        if not base.is_dir():
            continue
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            base.rmdir()
        except OSError:
            pass


@pytest.fixture
def qos_rig(containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> Iterator[QOSRig]:
    kube = f"koordtest-{uuid.uuid4().hex[:8]}/kubepods"
    for qos_dir in ("burstable", "besteffort"):
        enable_v2_controllers(f"{kube}/{qos_dir}")
    server = KubeletPodsServer()
    rig = QOSRig(kubelet, containerd.image, kube, server, tmp_path / "node.json", tmp_path / "nodeslo.json")
    rig.node({"cpu": "2", "memory": "4Gi"}, {"cpu": "2", "memory": "4Gi"})
    rig.slo({})
    try:
        yield rig
    finally:
        rig.stop()
        server.close()
        kubelet.cleanup()
        remove_kube_dir(kube)
