"""The cost of one NodeMetric report on a full node.

    .venv/bin/python bench/nodemetric_report.py [--pods 110] [--containers 3] [--minutes 30] [--rounds 5]

An on-disk metric cache is filled with ``--minutes`` of 1 s samples (node, system, every pod
and container: CPU and memory), then the report the reporter builds each interval (node and
system averages, the 5/10/30-minute windows with avg and p50..p99, every pod's and
container's average over the 5-minute aggregate duration) is built ``--rounds`` times, and
the same status is written to a NodeMetric file. Prints wall time and CPU per report; at
upstream's 60 s report interval, CPU per report / 60 s is koordlet's share of one core.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from koord.koordlet import metriccache as mc
from koord.koordlet.statesinformer.nodemetric import collect, status_of
from koord.koordlet.statesinformer.reporter import FileStatusWriter
from koord.koordlet.statesinformer.specs import node_metric_collect_policy
from koord_testing.pods import container_meta, pod_meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="koord-bench-nodemetric-"))
    try:
        cache = mc.MetricCache(work / "tsdb")
        pods = [pod_meta("bench", f"pod-{i}", f"uid-{i}", f"kubepods/burstable/poduid-{i}",
                         containers=[container_meta(f"c{j}", f"cid-{i}-{j}", "x") for j in range(a.containers)])
                for i in range(a.pods)]
        now = time.time()
        for t in range(a.minutes * 60):
            ts = now - a.minutes * 60 + t
            batch = [mc.Sample(mc.NODE_CPU_USAGE, {}, ts, 1.5), mc.Sample(mc.NODE_MEMORY_USAGE, {}, ts, 8e9),
                     mc.Sample(mc.SYS_CPU_USAGE, {}, ts, 0.2), mc.Sample(mc.SYS_MEMORY_USAGE, {}, ts, 1e9)]
            for p in pods:
                batch += [mc.Sample(mc.POD_CPU_USAGE, {mc.POD_UID: p.uid}, ts, 0.01 * (t % 7)),
                          mc.Sample(mc.POD_MEMORY_USAGE, {mc.POD_UID: p.uid}, ts, 5e7)]
                for c in p.containers:
                    batch += [mc.Sample(mc.CONTAINER_CPU_USAGE, {mc.CONTAINER_ID: c.id}, ts, 0.003),
                              mc.Sample(mc.CONTAINER_MEMORY_USAGE, {mc.CONTAINER_ID: c.id}, ts, 1.6e7)]
            cache.append(batch)
        policy = node_metric_collect_policy(None)
        target = work / "nodemetric.json"
        target.write_text(json.dumps({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
                                      "metadata": {"name": "bench"}}))
        writer = FileStatusWriter(target)
        walls, cpus = [], []
        for _ in range(a.rounds):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            status = status_of(collect(cache, pods, policy, now=now))
            writer.write({}, status)
            walls.append(time.perf_counter() - wall0)
            cpus.append(time.process_time() - cpu0)
        cache.close()
        print(f"{a.pods} pods x {a.containers} containers, {a.minutes} min of 1 s samples, {a.rounds} reports")
        print(f"per report: wall median {statistics.median(walls) * 1000:.0f} ms, "
              f"CPU median {statistics.median(cpus) * 1000:.0f} ms "
              f"({statistics.median(cpus) / 60 * 100:.2f}% of one core at a 60 s interval); "
              f"status {target.stat().st_size} bytes")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
