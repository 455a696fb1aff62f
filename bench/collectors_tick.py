"""One tick of koordlet's 1 s collectors, timed in-process on a generated node.

    .venv/bin/python bench/collectors_tick.py [--pods 100] [--containers 3] [--ticks 10]
                                              [--sleep 1.0] [--cgroup v1|v2|real]

The node is ``--pods`` pods of ``--containers`` containers as cgroup files under a temp dir
(v1: the tree of ``koordlet_overhead.py``; v2: one unified tree), their counters advanced
before every tick. ``--cgroup real`` (root, a cgroup v1 machine) makes the same pods real,
idle cgroups of the machine's hierarchy instead (under ``koord-bench-tick-<pid>/kubepods``
in each controller read, removed afterwards): the kernel then makes each file's content on
every read, as on a node, and reading the tick's files alone, with nothing parsed or kept, is
timed too: what any collector reading the same files pays.

The metrics advisor runs every collector of the 1 s group (node, pods, host applications,
system, BE, throttling) into an on-disk metric cache, as koordlet does, ``--sleep`` seconds
apart (a tick after a one-second sleep finds the CPU caches cold, as in koordlet). Prints the
thread CPU time of a tick (median, min, max): the number that ``koordlet_overhead.py``'s
collectors' thread shows per second, without the rest of koordlet.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from koordlet_overhead import Node

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.metricsadvisor import AdvisorConfig, MetricsAdvisor
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.statesinformer.kubelet import pods_of_list
from koord.koordlet.statesinformer.meta import PodMeta
from koord_testing.cgroupfs import memory_stat_text, write_usage
from koord_testing.pods import FakeStatesInformer

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


REAL_ROOT = Path("/sys/fs/cgroup")
REAL_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
"""The v1 controllers whose files the collectors read."""
REAL_READS = (("cpuacct", "cpuacct.usage"), ("memory", "memory.stat"), ("cpu", "cpu.stat"))
"""Each pod's and container's files read every tick (CPU time, memory, throttling)."""


class RealNode:
    """The pods' cgroups made for real under ``parent`` in every controller read (idle: no
    process runs in them), removed by ``remove``."""

    def __init__(self, parent: str, pods: list[PodMeta]) -> None:
        if not os.path.isdir(REAL_ROOT / "cpuacct") or os.path.exists(REAL_ROOT / "cgroup.controllers"):
            raise SystemExit(f"--cgroup real: needs a cgroup v1 hierarchy at {REAL_ROOT} "
                             "(cpu, cpuacct, cpuset, memory)")
        if os.geteuid() != 0:
            raise SystemExit("--cgroup real: run as root (it makes cgroups)")
        kube = f"{parent}/kubepods"
        self.targets = [p.cgroup_dir for p in pods] + [c.cgroup_dir for p in pods for c in p.containers]
        self.made: list[Path] = []
        try:
            for rel in [parent, kube, f"{kube}/burstable", f"{kube}/besteffort", *self.targets]:
                for controller in REAL_CONTROLLERS:
                    d = REAL_ROOT / controller / rel
                    d.mkdir()
                    self.made.append(d)
        except OSError:
            self.remove()
            raise

    def files(self) -> list[Path]:
        return [REAL_ROOT / controller / rel / name for rel in self.targets for controller, name in REAL_READS]

    def remove(self) -> None:
        """Deepest first: a cgroup with children cannot go."""
        for d in sorted(self.made, key=lambda d: len(d.parts), reverse=True):
            try:
                d.rmdir()
            except OSError as exc:
                print(f"could not remove {d}: {exc}")


def reads_alone(paths: list[Path], ticks: int, sleep: float) -> tuple[list[float], dict[str, float]]:
    """ms of thread CPU time to ``pread`` every file once (kept open, one file name after the
    other), ``sleep`` s apart; and the median µs a read of each file name took."""
    groups: dict[str, list[int]] = {}
    for path in paths:
        groups.setdefault(path.name, []).append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    try:
        times = []
        per_name: dict[str, list[float]] = {name: [] for name in groups}
        for _ in range(ticks):
            time.sleep(sleep)
            total = 0.0
            for name, fds in groups.items():
                t0 = time.thread_time()
                for fd in fds:
                    os.pread(fd, 4096, 0)
                spent = time.thread_time() - t0
                per_name[name].append(spent / len(fds) * 1e6)
                total += spent
            times.append(total * 1000)
        return times, {name: statistics.median(v) for name, v in per_name.items()}
    finally:
        for fds in groups.values():
            for fd in fds:
                os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=1.0, help="seconds between ticks (default: 1)")
    ap.add_argument("--cgroup", choices=("v1", "v2", "real"), default="v1")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="koord-bench-tick-"))
    real: RealNode | None = None
    try:
        v1 = Node(work / "cgroup-v1", a.pods, a.containers)
        kube_dir = f"koord-bench-tick-{os.getpid()}/kubepods" if a.cgroup == "real" else "kubepods"
        pods = pods_of_list(v1.pod_list(), CgroupLayout(work / "cgroup-v1", kube_dir, "cgroupfs"), "cgroupfs")
        node: Node | V2Node | None = v1
        root = work / "cgroup-v1"
        if a.cgroup == "v2":
            root = work / "cgroup-v2"
            node = V2Node(root, pods)
        elif a.cgroup == "real":
            real = RealNode(kube_dir.split("/")[0], pods)
            root, node = REAL_ROOT, None
        cache = MetricCache(work / "tsdb")
        advisor = MetricsAdvisor(AdvisorConfig(), FakeStatesInformer(pods), cache,
                                 CgroupExecutor(CgroupLayout(root, kube_dir, "cgroupfs")))
        group = [c for c in advisor.collectors if c.interval == advisor.config.collect_res_used_interval]
        for _ in range(2):  # the first ticks prime the rates and create the series
            if node is not None:
                node.tick()
            advisor.tick(group)
        times = []
        for _ in range(a.ticks):
            if node is not None:
                node.tick()
            time.sleep(a.sleep)
            t0 = time.thread_time()
            advisor.tick(group)
            times.append((time.thread_time() - t0) * 1000)
        cache.close()
        print(f"collectors' tick, cgroup {a.cgroup}, {a.pods} pods x {a.containers} containers "
              f"({', '.join(c.name for c in group)}), {a.ticks} ticks {a.sleep:g} s apart: "
              f"median {statistics.median(times):.2f} ms, min {min(times):.2f}, max {max(times):.2f}")
        if real is not None:
            paths = real.files()
            alone, per_read = reads_alone(paths, a.ticks, a.sleep)
            names = ", ".join(f"{name} {us:.1f} µs" for name, us in per_read.items())
            print(f"reading the tick's {len(paths)} pod and container files alone (kept open): median "
                  f"{statistics.median(alone):.2f} ms, min {min(alone):.2f}, max {max(alone):.2f}; a read of {names}")
    finally:
        if real is not None:
            real.remove()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
