"""CPU cost of one BECPUSuppress tick: the formula, then the cfsQuota or cpuset policy over
a besteffort tree of N BE pods (fake cgroup v1 files in a temp dir), with the resource
executor's cache on, as koordlet runs it every second.

    .venv/bin/python bench/qos_suppress.py --pods 100 --ticks 200

Prints the median and p99 process CPU per tick (microseconds) per policy; one core spent
on a 1 s interval would be 1 000 000.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache, Sample
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.qosmanager.cpusuppress import CPUSuppress
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.statesinformer.specs import merged_node_slo
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.pods import FakeStatesInformer, container_meta, pod_meta


def build(root: Path, pods: int, policy: str) -> tuple[CPUSuppress, MetricCache]:
    metas = []
    cache = MetricCache(None)
    now = time.time()
    for i in range(pods):
        uid = f"be{i}"
        pod_dir = f"kubepods/besteffort/pod{uid}"
        make_fake_v1_cgroup(root, f"{pod_dir}/{uid}-c0")
        metas.append(pod_meta("bench", uid, uid, pod_dir, kube_qos="besteffort", koord_qos="BE",
                              containers=[container_meta("c0", f"{uid}-c0", f"{pod_dir}/{uid}-c0")]))
    metas.append(pod_meta("bench", "ls", "ls", "kubepods/burstable/podls", koord_qos="LS"))
    cache.set_kv("node_cpu_info", {"processors": [
        {"cpu": i, "core": i // 2, "socket": 0, "node": 0, "online": True} for i in range(32)]})
    node = {"metadata": {"name": "bench"}, "status": {"capacity": {"cpu": "32", "memory": "64Gi"},
                                                      "allocatable": {"cpu": "32", "memory": "64Gi"}}}
    slo = merged_node_slo({"metadata": {"name": "bench"}, "spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "cpuSuppressPolicy": policy, "cpuSuppressThresholdPercent": 65}}})
    informer = FakeStatesInformer(pods=metas, node_slo=slo, node=node)
    executor = ResourceExecutor(CgroupLayout(root, driver="cgroupfs"))
    manager = QOSManager(QOSConfig(collect_interval=3600), informer, cache, executor,  # type: ignore[arg-type]
                         registry=CollectorRegistry())
    cache.append([Sample("node_cpu_usage", {}, now, 20.0), Sample("pod_cpu_usage", {"pod_uid": "ls"}, now, 8.0)]
                 + [Sample("pod_cpu_usage", {"pod_uid": m.uid}, now, 0.1) for m in metas[:-1]])
    return next(s for s in manager.strategies if isinstance(s, CPUSuppress)), cache


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--ticks", type=int, default=200)
    a = p.parse_args()
    print(f"BECPUSuppress tick, {a.pods} BE pods, {a.ticks} ticks (process CPU per tick, µs)")
    print("| policy | p50 | p99 |\n|---|---|---|")
    for policy in ("cfsQuota", "cpuset"):
        with tempfile.TemporaryDirectory(prefix="koord-bench-qos-") as tmp:
            strategy, cache = build(Path(tmp), a.pods, policy)
            strategy.run_once()  # first tick writes everything; the rest is the steady state
            costs = []
            for _ in range(a.ticks):
                t0 = time.process_time()
                strategy.run_once()
                costs.append((time.process_time() - t0) * 1e6)
            cache.close()
        costs.sort()
        print(f"| {policy} | {statistics.median(costs):.0f} | {costs[int(len(costs) * 0.99) - 1]:.0f} |")


if __name__ == "__main__":
    main()
