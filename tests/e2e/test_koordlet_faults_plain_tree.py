"""The fault tests of ``test_koordlet_faults`` over a cgroup tree of plain files, where a
changed file is a replaced one and a removed pod's files stay readable through any
descriptor still open: the NodeMetric follows what the tree holds now."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord_testing.wait import wait_for

from .fault_rig import REPORT_SECONDS, MiB, dump, fill
from .plain_tree_rig import PlainTreeNode

pytestmark = pytest.mark.e2e

PODS, HOLD_MIB, MORE_MIB = 20, 20, 40
WITHIN = 10 * REPORT_SECONDS + 10


def reported(node: PlainTreeNode, want: dict[str, float | None], what: str) -> None:
    """Waits until each pod in ``want`` is reported with at least that memory (None: not
    reported at all); says what was last seen when it never is."""
    seen: list[dict[str, float]] = [{}]

    def matches() -> bool:
        seen[0] = node.pod_memory()
        return all(name not in seen[0] if floor is None else seen[0].get(name, 0) >= floor
                   for name, floor in want.items())
    try:
        wait_for(matches, what, timeout=WITHIN)
    except AssertionError:
        print("last seen (MiB):", dump({n: round(v / MiB, 1) for n, v in seen[0].items()}))
        raise


def test_replaced_files_and_removed_pods_are_reported_as_the_tree_is_now(plain_tree_node: PlainTreeNode) -> None:
    """Half of 20 pods' dirs removed while kubelet still lists them, the other half's files
    replaced with 40 MiB more: the survivors' new memory shows, the removed pods leave the
    report, and nothing is logged above debug level for them."""
    node = plain_tree_node
    pods = node.add_pods(PODS, HOLD_MIB)
    node.start_koordlet()
    reported(node, {p.name: HOLD_MIB * MiB for p in pods}, f"all {PODS} pods holding {HOLD_MIB} MiB")
    gone, staying = pods[::2], pods[1::2]
    for pod in gone:
        node.vanish(pod)
    for pod in staying:
        node.set_memory(pod, HOLD_MIB + MORE_MIB)
    reported(node, {**{p.name: (HOLD_MIB + MORE_MIB) * MiB for p in staying}, **{p.name: None for p in gone}},
             "the survivors' new memory and the removed pods gone")
    logs = node.logs()
    assert "Traceback" not in logs, logs
    assert not [line for line in logs.splitlines() if line[:1] in "WE" and any(p.uid in line for p in gone)], logs


def test_storing_resumes_after_a_full_disk_with_replaced_files(plain_tree_node: PlainTreeNode,
                                                               small_disk: Path) -> None:
    """The metric cache's disk fills, the pod's files are replaced with more memory, the
    disk is freed: the NodeMetric shows the new memory."""
    node = plain_tree_node
    (pod,) = node.add_pods(1, HOLD_MIB)
    node.start_koordlet(tsdb=small_disk / "tsdb")
    reported(node, {pod.name: HOLD_MIB * MiB}, f"the pod holding {HOLD_MIB} MiB")
    filler = small_disk / "filler"
    fill(filler)
    wait_for(lambda: "failed: database or disk is full" in node.logs(), "the write failure said")
    node.set_memory(pod, HOLD_MIB + MORE_MIB)
    filler.unlink()
    reported(node, {pod.name: (HOLD_MIB + MORE_MIB) * MiB}, "the pod's new memory after the disk was freed")
