"""One tick of koordlet's 1 s collectors, timed in-process on a generated node.

    .venv/bin/python bench/collectors_tick.py [--pods 100] [--containers 3] [--ticks 10]
                                              [--sleep 1.0] [--cgroup v1|v2]

The node is ``--pods`` pods of ``--containers`` containers as cgroup files under a temp dir
(v1: the tree of ``koordlet_overhead.py``; v2: one unified tree), their counters advanced
before every tick. The metrics advisor runs every collector of the 1 s group (node, pods,
host applications, system, BE, throttling) into an on-disk metric cache, as koordlet does,
``--sleep`` seconds apart (a tick after a one-second sleep finds the CPU caches cold, as in
koordlet). Prints the thread CPU time of a tick (median, min, max): the number that
``koordlet_overhead.py``'s collectors' thread shows per second, without the rest of koordlet.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from koordlet_overhead import Node

from koord.koordlet.metriccache import MetricCache
from koord.koordlet.metricsadvisor import AdvisorConfig, MetricsAdvisor
from koord.koordlet.statesinformer.kubelet import pods_of_list
from koord.koordlet.statesinformer.meta import PodMeta
from koord.testing.cgroupfs import memory_stat_text, write_usage
from koord.testing.pods import FakeStatesInformer

MiB = 1024 * 1024


class V2Node:
    """The same pods on one cgroup v2 tree (cpu.stat carries CPU time and throttling)."""

    def __init__(self, root: Path, pods: list[PodMeta]) -> None:
        self.root = root
        self.rng = random.Random(1)
        qos_dirs = ["kubepods", "kubepods/burstable", "kubepods/besteffort"]
        self.dirs = qos_dirs + [p.cgroup_dir for p in pods] + [c.cgroup_dir for p in pods for c in p.containers]
        self.ns = dict.fromkeys(self.dirs, 10**15)
        self.tick()
        for rel in self.dirs:  # what the BE collector reads besides usage
            (root / rel / "cpu.max").write_text("max 100000\n")
            (root / rel / "cpuset.cpus.effective").write_text("0-1\n")

    def tick(self) -> None:
        for rel in self.dirs:
            self.ns[rel] += self.rng.randrange(1, 50) * 1_000_000
            write_usage(self.root, rel, 2, cpu_ns=self.ns[rel],
                        memory_stat=memory_stat_text(2, self.rng.randrange(100, 900) * MiB, 10 * MiB),
                        nr_periods=self.ns[rel] // 10**8, nr_throttled=self.ns[rel] // 10**9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=1.0, help="seconds between ticks (default: 1)")
    ap.add_argument("--cgroup", choices=("v1", "v2"), default="v1")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="koord-bench-tick-"))
    try:
        v1 = Node(work / "cgroup-v1", a.pods, a.containers)
        pods = pods_of_list(v1.pod_list(), "kubepods", "cgroupfs")
        node: Node | V2Node = v1
        root = work / "cgroup-v1"
        if a.cgroup == "v2":
            root = work / "cgroup-v2"
            node = V2Node(root, pods)
        cache = MetricCache(work / "tsdb")
        advisor = MetricsAdvisor(AdvisorConfig(cgroup_root=root, cgroup_driver="cgroupfs"),
                                 FakeStatesInformer(pods), cache)
        group = [c for c in advisor.collectors if c.interval == advisor.config.collect_res_used_interval]
        for _ in range(2):  # the first ticks prime the rates and create the series
            node.tick()
            advisor.tick(group)
        times = []
        for _ in range(a.ticks):
            node.tick()
            time.sleep(a.sleep)
            t0 = time.thread_time()
            advisor.tick(group)
            times.append((time.thread_time() - t0) * 1000)
        cache.close()
        print(f"collectors' tick, cgroup {a.cgroup}, {a.pods} pods x {a.containers} containers "
              f"({', '.join(c.name for c in group)}), {a.ticks} ticks {a.sleep:g} s apart: "
              f"median {statistics.median(times):.2f} ms, min {min(times):.2f}, max {max(times):.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
