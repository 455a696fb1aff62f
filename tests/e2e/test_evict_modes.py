"""Upstream's two eviction modes end to end, on real containerd pods with a real BE burner,
the real metrics advisor, the states informer listing pods over CRI and the fake API
server (``koord_testing.kubeapi``) behind the QoS manager's API client.

``-only-evict-by-api=false`` (upstream's default): koordlet stops the BE pod's container
through CRI StopContainer on the containerd it lists pods from; the API server sees the
``evictPodSuccess`` Event and no eviction request. ``=true``: the API server sees the
eviction request and nothing is stopped (no kubelet here deletes the pod, so its
container runs on). A 429 (a PodDisruptionBudget refusing) leaves the pod running; the
next rounds ask again, with one error line in the log.

Node memory comes from a /proc whose meminfo says 95 % used, so BEMemoryEvict acts as
soon as the advisor measured the pods, whatever the machine's real memory.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import Aggregation, MetricCache
from koord.koordlet.metricsadvisor.advisor import MetricsAdvisor
from koord.koordlet.metricsadvisor.config import AdvisorConfig
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.statesinformer import NODE, NODE_SLO, CriPodsSource, FileObjectsSource, StatesInformer
from koord_testing.cgroups import CGROUP_ROOT, remove_tree
from koord_testing.containerd import Containerd
from koord_testing.kubeapi import FakeKubeAPI
from koord_testing.kubelet import KubeletClient
from koord_testing.wait import wait_for
from koord_testing.workloads import burn_command

from .qos_rig import write_json

pytestmark = pytest.mark.e2e

QOS_LABEL = "koordinator.sh/qosClass"
TOTAL_KB = 1024 * 1024


@dataclass
class Rig:
    kube: str
    api: FakeKubeAPI
    informer: StatesInformer
    cache: MetricCache
    advisor: MetricsAdvisor
    qos: QOSManager


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as server:
        yield server


def start(containerd: Containerd, api: FakeKubeAPI, tmp_path: Path, only_by_api: bool) -> Rig:
    from kubernetes import client

    kube = f"koordtest-{uuid.uuid4().hex[:8]}/kubepods"
    proc = tmp_path / "proc"
    proc.mkdir()
    for name in ("stat", "cpuinfo"):
        (proc / name).symlink_to(f"/proc/{name}")
    (proc / "meminfo").write_text(f"MemTotal: {TOTAL_KB} kB\nMemFree: {TOTAL_KB // 50} kB\n"
                                  f"MemAvailable: {TOTAL_KB // 20} kB\n")
    node_file, slo_file = tmp_path / "node.json", tmp_path / "nodeslo.json"
    write_json(node_file, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"},
                           "status": {"capacity": {"cpu": "2", "memory": "1Gi"},
                                      "allocatable": {"cpu": "2", "memory": "1Gi"}}})
    write_json(slo_file, {"metadata": {"name": "test-node"}, "spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "memoryEvictThresholdPercent": 90}}})
    layout = CgroupLayout(CGROUP_ROOT, driver="cgroupfs", kube_dir=kube)
    executor = ResourceExecutor(layout)
    informer = StatesInformer(objects=FileObjectsSource({NODE: node_file, NODE_SLO: slo_file}),
                              pods=CriPodsSource(containerd.endpoint, layout), pods_interval=1.0)
    cache = MetricCache(None)
    advisor = MetricsAdvisor(AdvisorConfig(proc_root=proc), informer, cache, executor)
    config = client.Configuration()
    config.host = api.url
    qos = QOSManager(QOSConfig(memory_evict_interval=1.0, memory_evict_cool_time=0.0,
                               only_evict_by_api=only_by_api, node_name="test-node",
                               gates={"BECPUSuppress": False, "BEMemoryEvict": True},
                               cri_endpoint=containerd.endpoint),
                     informer, cache, executor,
                     api_client=client.ApiClient(config))
    return Rig(kube, api, informer, cache, advisor, qos)


def run_burner(rig: Rig, kubelet: KubeletClient, image: str) -> str:
    sandbox = kubelet.run_pod("be-burner", labels={QOS_LABEL: "BE"}, qos="besteffort", kube_dir=rig.kube)
    return kubelet.run_container(sandbox, "main", image, command=burn_command(0.2))


def measured(rig: Rig) -> bool:
    uids = [p.uid for p in rig.informer.get_all_pods()]
    now = time.time()
    return len(uids) == 1 and rig.cache.aggregate(
        "pod_memory_usage", now - 3, now, Aggregation.LAST, {"pod_uid": uids[0]}) is not None


def state(kubelet: KubeletClient, container: str) -> int:
    return kubelet.container_status(container).status.state


@pytest.fixture
def running(containerd: Containerd, kubelet: KubeletClient, api: FakeKubeAPI, tmp_path: Path):
    """``running(only_by_api)``: the modules started, the BE burner measured; (rig, container)."""
    rigs: list[Rig] = []

    def make(only_by_api: bool) -> tuple[Rig, str]:
        rig = start(containerd, api, tmp_path, only_by_api)
        rigs.append(rig)
        rig.informer.start()
        rig.advisor.start()
        container = run_burner(rig, kubelet, containerd.image)
        wait_for(lambda: measured(rig), "the advisor measuring the burner's memory", 30)
        rig.qos.start()
        return rig, container

    yield make
    for rig in rigs:
        rig.qos.stop()
        rig.advisor.stop()
        rig.informer.stop()
        rig.cache.close()
    assert not kubelet.cleanup()
    for rig in rigs:
        remove_tree(rig.kube.split("/")[0])


def events(api: FakeKubeAPI) -> list[tuple[str, str, str]]:
    return [(e["reason"], e["involvedObject"]["name"], e["message"]) for e in api.events]


@pytest.mark.cgroup
def test_default_kills_through_cri_and_records_an_event(running, kubelet: KubeletClient,
                                                        api: FakeKubeAPI) -> None:
    rig, container = running(False)
    wait_for(lambda: state(kubelet, container) == kubelet.pb.CONTAINER_EXITED,
             "the burner's container stopped through CRI", 30)
    success = ("evictPodSuccess", "be-burner", "evict Pod:default/be-burner, reason: evicted, "
               "message: EvictPodByNodeMemoryUsage, kill pod: be-burner")
    wait_for(lambda: success in events(api), "the eviction Event", 10)
    # A round that decides before the pods source lists the container running (the emulated
    # lane's kubelet lags the runtime) finds nothing to stop: it says so and the next round kills.
    said = events(api)
    assert said[-1] == success, said
    assert all(e[0] == "evictPodFail" and e[2].endswith("error no running container") for e in said[:-1]), said
    assert all(e["source"] == {"component": "koordlet-qosManager", "host": "test-node"} for e in api.events)
    assert api.evictions == []


@pytest.mark.cgroup
def test_only_by_api_asks_for_an_eviction_and_kills_nothing(running, kubelet: KubeletClient,
                                                            api: FakeKubeAPI) -> None:
    rig, container = running(True)
    wait_for(lambda: api.evictions and api.events, "the eviction request and its Event", 30)
    assert api.evictions[0]["metadata"]["name"] == "be-burner"
    assert [e[0] for e in events(api)] == ["evictPodSuccess"]
    assert state(kubelet, container) == kubelet.pb.CONTAINER_RUNNING


@pytest.mark.cgroup
def test_refused_eviction_leaves_the_pod_running_and_is_retried(
        running, kubelet: KubeletClient, api: FakeKubeAPI, caplog: pytest.LogCaptureFixture) -> None:
    api.eviction_status = 429
    with caplog.at_level(logging.INFO, logger="koord.koordlet.qosmanager"):
        rig, container = running(True)
        wait_for(lambda: len(api.evictions) >= 3, "the refused eviction asked again in later rounds", 30)
    assert state(kubelet, container) == kubelet.pb.CONTAINER_RUNNING
    refused = [r.getMessage() for r in caplog.records
               if r.levelno >= logging.ERROR and "default/be-burner" in r.getMessage()]
    assert len(refused) == 1 and "429" in refused[0], refused
    assert [e[0] for e in events(api)] == ["evictPodFail"]
