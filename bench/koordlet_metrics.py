"""koordlet's metrics advisor and metric cache with 100 fake pods.

    .venv/bin/python bench/koordlet_metrics.py [--pods 100] [--containers 3] [--seconds 60] [--hours 1]

1. Collect: a generated cgroup v1 tree (pods x containers under kubepods/burstable) and the
   machine's real /proc and /sys; every default collector at the default 1 s interval for
   ``--seconds``; reports the process's CPU (% of one core) and RSS. The counters in the tree
   do not move, so CPU rates are 0 but every file is read and parsed as on a real node.
2. Store: ``--hours`` of samples as the collectors write them at 1 s (per pod and container:
   CPU, memory, throttling; node, system and BE series; one ``Samples`` a tick with the
   series keys made once) appended tick by tick into an on-disk metric cache with a
   simulated clock; reports append CPU per tick and the size on disk.
3. Query: a 30-minute p95 of each pod's CPU (one query per pod), repeated; reports p50/p99
   latency, and one 30-minute p95 over all pods merged.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from koord.koordlet import metriccache as mc
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metricsadvisor import AdvisorConfig, MetricsAdvisor
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KoordQoS
from koord.koordlet.statesinformer.meta import ContainerMeta, PodMeta
from koord_testing.cgroupfs import memory_stat_text, write_usage
from koord_testing.pods import FakeStatesInformer

MiB = 1024 * 1024


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fake_pods(root: Path, pods: int, containers: int) -> list[PodMeta]:
    out = []
    for i in range(pods):
        uid = f"00000000-0000-0000-0000-{i:012d}"
        pod_dir = f"kubepods/burstable/pod{uid}"
        write_usage(root, pod_dir, 1, cpu_ns=10**9 * i, memory_stat=memory_stat_text(1, 100 * MiB))
        metas = []
        for j in range(containers):
            cid = f"{i:032x}{j:032x}"
            write_usage(root, f"{pod_dir}/{cid}", 1, cpu_ns=10**9 * j, memory_stat=memory_stat_text(1, 30 * MiB))
            metas.append(ContainerMeta(name=f"c{j}", id=cid, cgroup_dir=f"{pod_dir}/{cid}", running=True))
        out.append(PodMeta(namespace="bench", name=f"pod-{i}", uid=uid, labels={}, annotations={},
                           kube_qos="burstable", koord_qos=KoordQoS.LS, priority=None, cgroup_dir=pod_dir,
                           sandbox_id=f"sb{i}", running=True, containers=metas))
    # The BE QoS dir the BE collector reads.
    write_usage(root, "kubepods/besteffort", 1, cpu_ns=0, memory_stat=memory_stat_text(1, 0))
    for sub, name, value in (("cpuset", "cpuset.cpus", "0-1"), ("cpu", "cpu.cfs_quota_us", "-1"),
                             ("cpu", "cpu.cfs_period_us", "100000")):
        (root / sub / "kubepods/besteffort").mkdir(parents=True, exist_ok=True)
        (root / sub / "kubepods/besteffort" / name).write_text(value + "\n")
    return out


def bench_collect(work: Path, pods: list[PodMeta], seconds: float) -> None:
    cache = mc.MetricCache(work / "collect-tsdb")
    advisor = MetricsAdvisor(AdvisorConfig(), FakeStatesInformer(pods), cache,
                             CgroupExecutor(CgroupLayout(work / "cgroup", driver="cgroupfs")))
    advisor.start()
    time.sleep(3)  # first ticks: imports, priming, series creation
    cpu0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu = (time.process_time() - cpu0) / (time.monotonic() - t0)
    advisor.stop()
    n = cache.aggregate(mc.POD_MEMORY_USAGE, 0, time.time() + 1, mc.Aggregation.COUNT) or 0
    cache.close()
    print(f"collect: {len(pods)} pods x {len(pods[0].containers)} containers at 1s for {seconds:.0f}s: "
          f"CPU {cpu * 100:.2f}% of one core, RSS {rss_mib():.1f} MiB "
          f"(max {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB), "
          f"{int(n)} pod memory samples stored")


def bench_store_and_query(work: Path, pods: list[PodMeta], hours: float) -> None:
    now = [1_800_000_000.0]
    cache = mc.MetricCache(work / "tsdb", clock=lambda: now[0])
    rng = random.Random(1)
    start = now[0]
    ticks = int(hours * 3600)
    append_cpu = 0.0
    samples_total = 0
    mem = {p.uid: rng.randrange(50, 500) * MiB for p in pods}
    # Series keys made once per pod and container, as the pod collectors make them.
    pod_keys = {p.uid: [mc.series_key(kind, {mc.POD_UID: p.uid})
                        for kind in (mc.POD_CPU_USAGE, mc.POD_MEMORY_USAGE, mc.POD_CPU_THROTTLED)] for p in pods}
    container_keys = {c.id: [mc.series_key(kind, {mc.CONTAINER_ID: c.id})
                             for kind in (mc.CONTAINER_CPU_USAGE, mc.CONTAINER_MEMORY_USAGE,
                                          mc.CONTAINER_CPU_THROTTLED)] for p in pods for c in p.containers}
    for tick in range(ticks):
        now[0] = start + tick
        batch = mc.Samples(now[0])
        batch.add(mc.NODE_CPU_USAGE, {}, rng.uniform(0.5, 1.5))
        batch.add(mc.NODE_MEMORY_USAGE, {}, float(8 * 1024 * MiB + rng.randrange(0, 100) * MiB))
        batch.add(mc.NODE_MEMORY_USAGE_WITH_PAGE_CACHE, {}, float(12 * 1024 * MiB))
        batch.add(mc.SYS_CPU_USAGE, {}, rng.uniform(0.1, 0.2))
        batch.add(mc.SYS_MEMORY_USAGE, {}, float(1024 * MiB))
        for alloc in (mc.BE_ALLOCATION_USAGE, mc.BE_ALLOCATION_REQUEST, mc.BE_ALLOCATION_REAL_LIMIT):
            batch.add(mc.NODE_BE, {mc.BE_RESOURCE: "cpu", mc.BE_ALLOCATION: alloc}, 2000.0)
        for p in pods:
            if rng.random() < 0.01:
                mem[p.uid] += rng.randrange(-4, 5) * MiB
            cpu, memory, throttled = pod_keys[p.uid]
            batch.add_keyed(cpu, rng.uniform(0, 0.3))
            batch.add_keyed(memory, float(mem[p.uid]))
            batch.add_keyed(throttled, 0.0)
            for c in p.containers:
                cpu, memory, throttled = container_keys[c.id]
                batch.add_keyed(cpu, rng.uniform(0, 0.1))
                batch.add_keyed(memory, float(mem[p.uid] // 3))
                batch.add_keyed(throttled, 0.0)
        c0 = time.process_time()
        cache.append_ticks([batch])
        append_cpu += time.process_time() - c0
        samples_total += len(batch)
    print(f"store: {hours:g} h of 1s samples, {samples_total / ticks:.0f} per tick, {samples_total} in all: "
          f"append CPU {append_cpu / ticks * 1000:.2f} ms per tick, on disk {cache.disk_bytes() / MiB:.1f} MiB "
          f"({cache.disk_bytes() / samples_total:.1f} bytes per sample)")

    end = now[0]
    latencies = []
    for _ in range(5):
        for p in pods:
            q0 = time.perf_counter()
            value = cache.aggregate(mc.POD_CPU_USAGE, end - 1800, end, mc.Aggregation.P95, {mc.POD_UID: p.uid})
            latencies.append(time.perf_counter() - q0)
            assert value is not None
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[max(int(len(latencies) * 0.99) - 1, 0)]
    q0 = time.perf_counter()
    cache.aggregate(mc.POD_CPU_USAGE, end - 1800, end, mc.Aggregation.P95)
    merged = time.perf_counter() - q0
    print(f"query: 30-minute p95 of one pod's CPU, {len(latencies)} queries: p50 {p50 * 1000:.2f} ms, "
          f"p99 {p99 * 1000:.2f} ms; over all {len(pods)} pods merged: {merged * 1000:.0f} ms")
    cache.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--hours", type=float, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="koord-bench-metrics-"))
    try:
        pods = fake_pods(work / "cgroup", args.pods, args.containers)
        bench_collect(work, pods, args.seconds)
        bench_store_and_query(work, pods, args.hours)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
