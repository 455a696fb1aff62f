"""SystemConfig end to end on the real ``/proc/sys/vm`` files: only inside the cgroup v2 VM
lane (``KOORD_TEST_LANE=v2``), whose kernel and ``/proc/sys`` belong to the VM. Anywhere else
writing them would change the host's memory reclaim for every process on it, so there the
test is skipped with that reason; the unit tests cover the same logic on a fake tree.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.statesinformer import NODE, NODE_SLO, FileObjectsSource, StatesInformer
from koord_testing.wait import wait_for

from .qos_rig import write_json

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]

VM = Path("/proc/sys/vm")
MEMORY = 4 << 30


def read(name: str) -> str:
    return (VM / name).read_text().strip()


@pytest.fixture
def v2_lane() -> None:
    if os.environ.get("KOORD_TEST_LANE") != "v2":
        pytest.skip("writes the kernel's /proc/sys/vm: runs only in the cgroup v2 VM lane "
                    "(KOORD_TEST_LANE=v2), never on a shared host")


def test_system_strategy_sets_and_restores_vm_knobs(v2_lane: None, tmp_path: Path) -> None:
    before = {n: read(n) for n in ("min_free_kbytes", "watermark_scale_factor")}
    # Values that differ from what the kernel holds, so a write is visible.
    factor = 100 if int(before["min_free_kbytes"]) != MEMORY // 1024 * 100 // 10000 else 120
    wsf = 99 if before["watermark_scale_factor"] != "99" else 98
    node_file, slo_file = tmp_path / "node.json", tmp_path / "nodeslo.json"
    write_json(node_file, {"metadata": {"name": "vm"}, "status": {"capacity": {"memory": str(MEMORY)}}})
    write_json(slo_file, {"metadata": {"name": "vm"}, "spec": {"systemStrategy": {
        "minFreeKbytesFactor": factor, "watermarkScaleFactor": wsf, "memcgReapBackGround": 1}}})
    informer = StatesInformer(objects=FileObjectsSource({NODE: node_file, NODE_SLO: slo_file}))
    cache = MetricCache(None)
    qos = QOSManager(QOSConfig(reconcile_interval=1.0, gates={"SystemConfig": True}), informer, cache,
                     ResourceExecutor(CgroupLayout()))
    informer.start()
    qos.start()
    try:
        want = str(MEMORY // 1024 * factor // 10000)
        wait_for(lambda: read("min_free_kbytes") == want and read("watermark_scale_factor") == str(wsf),
                 f"min_free_kbytes {want} and watermark_scale_factor {wsf}", 20)
        print(f"before {before}; set to min_free_kbytes {want}, watermark_scale_factor {wsf}")
        write_json(slo_file, {"metadata": {"name": "vm"}, "spec": {"systemStrategy": {
            "minFreeKbytesFactor": factor}}})
        wait_for(lambda: read("watermark_scale_factor") == before["watermark_scale_factor"],
                 "watermark_scale_factor restored when its field left the NodeSLO", 20)
        assert read("min_free_kbytes") == want
    finally:
        qos.stop()
        informer.stop()
        cache.close()
    assert {n: read(n) for n in before} == before, "stopping did not restore the values found at start"
