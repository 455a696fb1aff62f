"""Allocatable evictions end to end: real BE pods on containerd with batch requests (from a
kubelet ``/pods`` stand-in), the real metrics advisor measuring them, and the QoS manager
stopping the victim's container through CRI when batch requests exceed the node's batch
allocatable (the Node object shrinks it, as koord-manager does when LS pods grow)."""

from __future__ import annotations

import time

import pytest

from koord.koordlet.metriccache import Aggregation
from koord.koordlet.qosmanager import QOSConfig
from koord_testing.containerd import Containerd
from koord_testing.wait import wait_for
from koord_testing.workloads import hold_command

from .qos_rig import QOSRig, qos_rig  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

ENABLED = {"koordinator.sh/eviction-enabled": "true"}


@pytest.mark.parametrize("resource", ["cpu", "memory"])
def test_batch_requests_above_allocatable_evict_the_largest(qos_rig: QOSRig, containerd: Containerd,  # noqa: F811
                                                            resource: str) -> None:
    rig = qos_rig
    batch = "kubernetes.io/batch-cpu" if resource == "cpu" else "kubernetes.io/batch-memory"
    big_req, small_req = ("3000", "1000") if resource == "cpu" else ("3Gi", "1Gi")
    _, big = rig.run_pod("be-big", "besteffort", "BE", hold_command(8), labels=ENABLED, priority=5000,
                         requests={batch: big_req})
    _, small = rig.run_pod("be-small", "besteffort", "BE", hold_command(8), labels=ENABLED, priority=5000,
                           requests={batch: small_req})
    _, unlabelled = rig.run_pod("be-other", "besteffort", "BE", hold_command(8), priority=5000,
                                requests={batch: small_req})
    allocatable = {"cpu": "8", "memory": "16Gi", batch: "8000" if resource == "cpu" else "8Gi"}
    rig.node({"cpu": "8", "memory": "16Gi"}, allocatable)
    gate = "CPUAllocatableEvict" if resource == "cpu" else "MemoryAllocatableEvict"
    rig.slo({"resourceUsedThresholdWithBE": {
        "enable": True, f"{resource}AllocatableEvictThresholdPercent": 100,
        f"{resource}AllocatableEvictLowerPercent": 90, "allocatableEvictPriorityThreshold": 5999}})
    rig.start(QOSConfig(cpu_evict_interval=1, memory_evict_interval=1, cpu_evict_cool_time=0,
                        memory_evict_cool_time=0, gates={gate: True}, cri_endpoint=containerd.endpoint),
              advisor=True)
    assert rig.cache is not None and rig.informer is not None
    kind = "pod_cpu_usage" if resource == "cpu" else "pod_memory_usage"

    def measured() -> bool:
        uids = [p.uid for p in rig.informer.get_all_pods()]  # type: ignore[union-attr]
        now = time.time()
        return len(uids) == 3 and all(rig.cache.aggregate(kind, now - 3, now, Aggregation.LAST,  # type: ignore[union-attr]
                                                          {"pod_uid": u}) is not None for u in uids)

    wait_for(measured, "the advisor measuring all three pods", 30)
    time.sleep(3)
    pb = rig.kubelet.pb
    for cid in (big, small, unlabelled):
        assert rig.kubelet.container_status(cid).status.state == pb.CONTAINER_RUNNING, \
            "evicted while batch requests (5 of 8) were within the allocatable"

    # koord-manager shrinks the batch allocatable: 5 requested > 100% of 4 -> release 5 - 3.6 = 1.4
    allocatable[batch] = "4000" if resource == "cpu" else "4Gi"
    rig.node({"cpu": "8", "memory": "16Gi"}, allocatable)
    wait_for(lambda: rig.kubelet.container_status(big).status.state == pb.CONTAINER_EXITED,
             "the larger batch request's container stopped", 30)
    time.sleep(3)
    assert rig.kubelet.container_status(small).status.state == pb.CONTAINER_RUNNING
    assert rig.kubelet.container_status(unlabelled).status.state == pb.CONTAINER_RUNNING
