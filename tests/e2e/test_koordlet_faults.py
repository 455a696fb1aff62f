"""koordlet under faults, run as users run it (pods from a kubelet ``/pods``, Node, NodeSLO
and NodeMetric as files, the metric cache on its own path): what the NodeMetric shows while
and after something breaks under the running process."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord_testing.wait import wait_for

from .fault_rig import REPORT_SECONDS, FaultNode, MiB, dump, fill

pytestmark = pytest.mark.e2e

# 8 pods: half vanish, half grow. Emulated in the cgroup v2 lane, each pod costs seconds.
PODS, HOLD_MIB, MORE_MIB = 8, 20, 40


@pytest.mark.cgroup
def test_pods_whose_cgroups_vanished_do_not_hold_back_the_others_memory(fault_node: FaultNode) -> None:
    """Half the pods' cgroup dirs are removed while kubelet still lists them (a collector
    racing every pod's teardown on a node) and the other half hold 40 MiB more: the NodeMetric
    shows the survivors' new memory within a few report intervals, and the vanished pods
    are said at debug level only."""
    node = fault_node
    pods = [node.run_pod(f"pod-{i:02d}", HOLD_MIB) for i in range(PODS)]
    node.start_koordlet()
    names = {p.name for p in pods}
    before = wait_for(lambda: (found := node.pod_memory()).keys() >= names
                      and min(found[n] for n in names) >= HOLD_MIB * MiB and found,
                      f"all {PODS} pods reported holding {HOLD_MIB} MiB", timeout=60)
    gone, staying = pods[::2], pods[1::2]
    for pod in gone:
        node.vanish(pod)
    usage = {p.name: p.cgroup.memory_usage() for p in staying}
    for pod in staying:
        node.hold_more(pod, MORE_MIB)
    for pod in staying:  # what the kernel says, read apart from koordlet
        wait_for(lambda p=pod: p.cgroup.memory_usage() >= usage[p.name] + MORE_MIB * MiB,
                 f"{pod.name}'s cgroup holding {MORE_MIB} MiB more")

    want = {p.name: before[p.name] + (MORE_MIB - 5) * MiB for p in staying}
    seen: list[dict[str, float]] = []

    def survivors_grown() -> bool:
        seen[:] = [node.pod_memory()]
        return all(seen[0].get(name, 0) >= floor for name, floor in want.items())
    try:
        wait_for(survivors_grown, f"the {len(staying)} surviving pods' new memory in the NodeMetric",
                 timeout=10 * REPORT_SECONDS + 10)
    except AssertionError:
        print("before:", dump(before), "\nlast seen:", dump(seen), "\nwanted at least:", dump(want))
        raise
    print("survivors after:", {n: round(seen[0][n] / MiB, 1) for n in want})
    logs = node.logs()
    assert "Traceback" not in logs, logs


def test_storing_resumes_once_a_full_disk_has_room_again(fault_node: FaultNode, small_disk: Path) -> None:
    """The metric cache's disk fills up under a running koordlet, a pod's memory grows, the
    disk is freed: each collector said the failure once (not every tick) and the NodeMetric
    shows the new memory within a few report intervals after the disk has room again."""
    node = fault_node
    pod = node.run_pod("holder", HOLD_MIB)
    node.start_koordlet(tsdb=small_disk / "tsdb")
    before = wait_for(lambda: node.pod_memory().get(pod.name, 0) >= HOLD_MIB * MiB and node.pod_memory(),
                      f"the pod reported holding {HOLD_MIB} MiB", timeout=60)
    filler = small_disk / "filler"
    fill(filler)
    wait_for(lambda: "failed: database or disk is full" in node.logs(), "the write failure said")
    usage = pod.cgroup.memory_usage()
    node.hold_more(pod, MORE_MIB)
    wait_for(lambda: pod.cgroup.memory_usage() >= usage + MORE_MIB * MiB, f"the pod holding {MORE_MIB} MiB more")
    filler.unlink()
    want = before[pod.name] + (MORE_MIB - 5) * MiB
    seen: list[float] = []

    def grown() -> bool:
        seen[:] = [node.pod_memory().get(pod.name, 0)]
        return seen[0] >= want
    try:
        wait_for(grown, "the pod's new memory in the NodeMetric after the disk was freed",
                 timeout=10 * REPORT_SECONDS + 10)
    except AssertionError:
        print(f"before {before[pod.name] / MiB:.1f} MiB, last seen {seen[0] / MiB:.1f} MiB")
        raise
    store_failures = [line for line in node.logs().splitlines() if ": append of " in line]
    said_by = [line.split(" collector ")[1].split(":")[0] for line in store_failures]
    assert store_failures and len(said_by) == len(set(said_by)), \
        f"each collector says the failure once, not every tick: {store_failures}"
