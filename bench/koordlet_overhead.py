"""koordlet's own cost on a busy node: CPU and RSS of the real process, as a user measures it.

    .venv/bin/python bench/koordlet_overhead.py [--pods 100] [--containers 3] [--seconds 60]
                                                [--warmup 20] [--no-cri] [--profile FILE] [--threads]
                                                [--churn N]

The set-up a node with ``--pods`` pods of ``--containers`` containers each gives koordlet:

- a cgroup v1 tree generated under a temp dir (``--cgroup-root-dir``; every pod and
  container has cpuacct.usage, memory.stat, cpu.stat and the files the hooks write), whose
  counters this script advances every second, as a kernel would;
- a kubelet answering ``/pods`` on a local port (``--pods-source=kubelet
  --kubelet-insecure-tls``): a quarter of the pods Koordinator BE with batch resources;
- a CRI endpoint (an in-memory fake) knowing the same pods, for the Standalone reconciler
  (``--no-cri``: none, the reconciler only finds the socket missing);
- LS containers with kubelet's CFS quota for their 500m limit and every cgroup with the
  kernel's burst file (so CPU burst has work to do, as on a real node);
- Node, NodeSLO (BE CPU suppress on) and NodeMetric files, the status reported every 60 s
  with the peak predictor's fields (the predictor trains every minute at its defaults);
- the real /proc and /sys for the node collectors; every default collector at 1 s.

koordlet runs as its own process (``python -m koord.koordlet``) at its default flags. After
``--warmup`` seconds its CPU time (user + system, of the process and its waited-for children,
from /proc/<pid>/stat) is measured over ``--seconds`` and printed as a share of one core,
with its RSS at the end (and at the start and peak of the window) and the busiest second
(a NodeMetric report lands in any 60 s).
``--profile FILE`` records koordlet's stacks with py-spy (``pip install py-spy``) during the
measured window, as collapsed stacks for a flame graph (``--format raw``); sampling costs
koordlet a little, so measure without it. ``--threads`` adds each thread's share of one core over
the window (``/proc/<pid>/task/*/stat``; Python's thread names from ``py-spy dump``).
``--churn N`` replaces the N oldest pods with new ones every 10 s (new uids, container ids
and cgroups; gone from kubelet's list and the CRI), as a node running short jobs sees, and
prints the RSS and the last minute's CPU every minute: what koordlet keeps per pod must go with the pod.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from koord_testing.cgroupfs import make_fake_v1_cgroup, memory_stat_text
from koord_testing.fakecri import FakeCRI

MiB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Node:
    """The generated node: pods as kubelet lists them and the cgroup files behind them."""

    def __init__(self, root: Path, pods: int, containers: int) -> None:
        self.root = root
        self.containers = containers
        self.rng = random.Random(1)
        self.items: list[dict] = []
        self.cgroups: list[str] = ["kubepods", "kubepods/burstable", "kubepods/besteffort"]
        self.cpu_ns: dict[str, int] = {}
        self.periods: dict[str, int] = {}
        self.made = 0
        self.fake: FakeCRI | None = None
        self._pod_list: tuple[list[dict], bytes] | None = None
        for qos_dir in self.cgroups:
            make_fake_v1_cgroup(root, qos_dir)
            self._counters(qos_dir)
        for _ in range(pods):
            self._add_pod()
        self.tick()

    def _counters(self, rel: str) -> None:
        self.cpu_ns[rel], self.periods[rel] = 10**15, 10**10
        (self.root / "cpuacct" / rel).mkdir(parents=True, exist_ok=True)

    def _add_pod(self) -> dict:
        """Pod number ``self.made`` (a new uid and container ids each): every fourth BE."""
        i, root, containers = self.made, self.root, self.containers
        self.made += 1
        be = i % 4 == 3
        uid = f"00000000-0000-0000-0000-{i:012d}"
        qos = "besteffort" if be else "burstable"
        pod_dir = f"kubepods/{qos}/pod{uid}"
        make_fake_v1_cgroup(root, pod_dir)
        specs, statuses, ids = [], [], []
        for j in range(containers):
            cid = f"{i:032x}{j:032x}"
            make_fake_v1_cgroup(root, f"{pod_dir}/{cid}")
            (root / "cpu" / pod_dir / cid / "cpu.cfs_burst_us").write_text("0\n")  # kernels >= 5.14
            if not be:  # kubelet's CFS quota for a 500m limit, so CPU burst has work to do
                (root / "cpu" / pod_dir / cid / "cpu.cfs_quota_us").write_text("50000\n")
            resources = ({"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "512Mi"},
                          "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}}
                         if be else {"requests": {"cpu": "100m", "memory": "128Mi"},
                                     "limits": {"cpu": "500m", "memory": "256Mi"}})
            specs.append({"name": f"c{j}", "image": "bench", "resources": resources})
            statuses.append({"name": f"c{j}", "containerID": f"containerd://{cid}",
                             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
            ids.append(cid)
        (root / "cpu" / pod_dir / "cpu.cfs_burst_us").write_text("0\n")
        if not be:
            (root / "cpu" / pod_dir / "cpu.cfs_quota_us").write_text(f"{50000 * containers}\n")
        labels = {"koordinator.sh/qosClass": "BE" if be else "LS"}
        item = {
            "metadata": {"name": f"pod-{i}", "namespace": "bench", "uid": uid, "labels": labels,
                         "annotations": {}},
            "spec": {"containers": specs, "priority": 5500 if be else 9500},
            "status": {"phase": "Running", "qosClass": "BestEffort" if be else "Burstable",
                       "containerStatuses": statuses},
            "_cgroup": (qos, ids)}
        rels = [pod_dir, *(f"{pod_dir}/{cid}" for cid in ids)]
        for rel in rels:
            self._counters(rel)
        self.cgroups = self.cgroups + rels
        self.items = self.items + [item]
        if self.fake is not None:
            self._add_to_cri(item)
        return item

    def churn(self, count: int) -> None:
        """The ``count`` oldest pods go (from kubelet's list, the CRI and the cgroup tree)
        and as many new ones come, as on a node running short jobs."""
        gone, self.items = self.items[:count], self.items[count:]
        for item in gone:
            qos, ids = item["_cgroup"]
            pod_dir = f"kubepods/{qos}/pod{item['metadata']['uid']}"
            if self.fake is not None:
                self.fake.remove_pod(item["metadata"]["uid"])
            self.cgroups = [rel for rel in self.cgroups if rel != pod_dir and not rel.startswith(pod_dir + "/")]
            for subsystem in os.listdir(self.root):
                shutil.rmtree(self.root / subsystem / pod_dir, ignore_errors=True)
        for _ in gone:
            self._add_pod()

    def pod_list(self) -> bytes:
        """kubelet's ``/pods`` answer, made again only after a churn replaced the list."""
        held = self._pod_list
        if held is not None and held[0] is self.items:
            return held[1]
        listed = self.items
        items = [{k: v for k, v in item.items() if k != "_cgroup"} for item in listed]
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items}).encode()
        self._pod_list = (listed, body)
        return body

    def tick(self) -> None:
        """Advances every counter as a second of a busy node would. Each file is rewritten in
        place with one pwrite of the same length (the counters start where their digit count
        stays put for days), so a reader never sees it empty or short, as with the kernel's
        files; a replaced file would also hide changes from a reader holding the old one open."""
        for rel in self.cgroups:
            self.cpu_ns[rel] += self.rng.randrange(1, 50) * 1_000_000
            self.periods[rel] += 10
            anon = self.rng.randrange(100, 900) * MiB
            self._put(f"cpuacct/{rel}/cpuacct.usage", f"{self.cpu_ns[rel]}\n")
            self._put(f"cpu/{rel}/cpu.stat", f"nr_periods {self.periods[rel]}\n"
                      f"nr_throttled {self.periods[rel] // 20 + 10**9}\nthrottled_time 0\n")
            self._put(f"memory/{rel}/memory.stat", memory_stat_text(1, anon, 10 * MiB))

    def _put(self, rel: str, text: str) -> None:
        fd = os.open(self.root / rel, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)

    def fake_cri(self, fake: FakeCRI) -> None:
        """The pods in ``fake`` from now on (churned pods too)."""
        self.fake = fake
        for item in self.items:
            self._add_to_cri(item)

    def _add_to_cri(self, item: dict) -> None:
        assert self.fake is not None
        qos, ids = item["_cgroup"]
        meta = item["metadata"]
        sid = meta["uid"]
        pod = self.fake.add_pod(sid, meta["name"], meta["labels"], f"/kubepods/{qos}/pod{meta['uid']}",
                                namespace=meta["namespace"])
        pod.config.metadata.uid = meta["uid"]
        for j, cid in enumerate(ids):
            self.fake.add_container(cid, sid, f"c{j}", resources={"cpu_shares": 102, "cpu_period": 100000,
                                                                  "cpu_quota": 50000})


def serve_kubelet(node: Node) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = node.pod_list()
            self.send_response(200 if self.path.rstrip("/") == "/pods" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def write_objects(work: Path) -> dict[str, Path]:
    cpus, memory = str(os.cpu_count() or 1), f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')}"
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench"},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                       "capacity": {"cpu": cpus, "memory": memory},
                       "allocatable": {"cpu": cpus, "memory": memory}}}
    slo = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "bench"},
           "spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}}
    metric = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": "bench"},
              "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}}}
    work.mkdir()  # a directory of their own, as /etc/koordlet: the objects' watcher sees only them
    files = {"node": work / "node.yaml", "node-slo": work / "nodeslo.yaml", "node-metric": work / "nodemetric.yaml"}
    for key, obj in (("node", node), ("node-slo", slo), ("node-metric", metric)):
        files[key].write_text(yaml.safe_dump(obj))
    return files


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime: the process and the children it waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def thread_ticks(pid: int) -> dict[int, int]:
    """utime + stime of each of the process's threads, in clock ticks."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        ticks[int(task.name)] = int(fields[11]) + int(fields[12])
    return ticks


def thread_names(pid: int) -> dict[int, str]:
    """Python's thread names by OS thread id, from ``py-spy dump`` (empty without py-spy)."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return {}
    out = subprocess.run([str(spy), "dump", "--nonblocking", "-p", str(pid)], capture_output=True, text=True).stdout
    names = {}
    for line in out.splitlines():
        if line.startswith("Thread "):
            tid, _, rest = line[len("Thread "):].partition(" ")
            if tid.isdigit():
                names[int(tid)] = rest.split(": ", 1)[-1].strip('"')
    return names


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--no-cri", action="store_true", help="no CRI endpoint for the reconciler")
    ap.add_argument("--profile", type=Path, help="py-spy's collapsed stacks of the measured window to this file")
    ap.add_argument("--threads", action="store_true",
                    help="also print each thread's share of one core over the window (names need py-spy)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (koordlet.log) for a look")
    ap.add_argument("--churn", type=int, default=0, metavar="N",
                    help="every 10 s the N oldest pods go and N new ones come (and the RSS and CPU are printed "
                         "every minute of the window)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="koord-bench-overhead-"))
    fake: FakeCRI | None = None
    proc: subprocess.Popen | None = None
    try:
        node = Node(work / "cgroup", a.pods, a.containers)
        kubelet = serve_kubelet(node)
        cri_socket = work / "cri.sock"
        if not a.no_cri:
            fake = FakeCRI(cri_socket).__enter__()
            node.fake_cri(fake)
        files = write_objects(work / "etc")
        command = [sys.executable, "-m", "koord.koordlet",
                   "--cgroup-root-dir", str(work / "cgroup"), "--cgroup-driver", "cgroupfs",
                   "--pods-source", "kubelet", "--kubelet-insecure-tls",
                   "--kubelet-read-only-port", str(kubelet.server_address[1]),
                   "--containerd-endpoint", str(cri_socket),
                   "--node-file", str(files["node"]), "--node-slo-file", str(files["node-slo"]),
                   "--node-metric-file", str(files["node-metric"]),
                   "--runtime-hooks-addr", str(work / "koordlet.sock"),
                   "--runtime-hooks-config-path", str(work / "hookserver.d"),
                   "--tsdb-path", str(work / "tsdb"), "--addr", "", "--log-level", "INFO",
                   # The predictor runs at its defaults (training every minute, so once in
                   # the window); its checkpoints stay in the work dir, not in a directory
                   # other runs share, so every run starts from no models.
                   "--prediction-checkpoint-filepath", str(work / "prediction-checkpoints")]
        log = open(work / "koordlet.log", "wb")
        proc = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        stop = threading.Event()

        def advance() -> None:
            seconds = 0
            while not stop.wait(1.0):
                seconds += 1
                if a.churn and seconds % 10 == 0:
                    node.churn(a.churn)
                node.tick()
        threading.Thread(target=advance, daemon=True).start()
        time.sleep(a.warmup)
        assert proc.poll() is None, (work / "koordlet.log").read_text()[-3000:]
        spy = None if a.profile is None else subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking", "--format", "raw",
             "-r", "200", "--threads", "-d", str(int(a.seconds)), "-o", str(a.profile), "-p", str(proc.pid)],
            stdout=subprocess.DEVNULL)
        ticks0 = thread_ticks(proc.pid)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        per_second, last_cpu, last_t = [], cpu0, t0
        rss_start, rss_peak = rss_mib(proc.pid), 0.0
        while time.monotonic() - t0 < a.seconds:
            time.sleep(1.0)
            c, t = cpu_seconds(proc.pid), time.monotonic()
            per_second.append((c - last_cpu) / (t - last_t))
            last_cpu, last_t = c, t
            rss_peak = max(rss_peak, rss_mib(proc.pid))
            if a.churn and len(per_second) % 60 == 0:
                minute = sum(per_second[-60:]) / 60 * 100
                print(f"  {len(per_second)} s: RSS {rss_mib(proc.pid):.1f} MiB, CPU {minute:.2f}% of one core over "
                      f"the last minute, {node.made} pods made so far", flush=True)
        cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        rss = rss_mib(proc.pid)
        window = time.monotonic() - t0
        ticks1 = thread_ticks(proc.pid)
        names = thread_names(proc.pid) if a.threads else {}
        stop.set()
        if spy is not None:
            spy.wait(30)
        reports = json.dumps(yaml.safe_load(files["node-metric"].read_text()).get("status", {})).count('"podUsage"')
        churn = f", {a.churn} replaced every 10 s ({node.made} made in all)" if a.churn else ""
        print(f"koordlet, {a.pods} pods x {a.containers} containers{'' if a.no_cri else ' (also in CRI)'}{churn}, "
              f"{a.seconds:.0f} s after {a.warmup:.0f} s warm-up: CPU {cpu * 100:.2f}% of one core, "
              f"RSS {rss:.1f} MiB (window start {rss_start:.1f}, peak {rss_peak:.1f}); "
              f"busiest second {max(per_second) * 100:.0f}%, "
              f"median second {sorted(per_second)[len(per_second) // 2] * 100:.1f}%; "
              f"NodeMetric lists {reports} pods")
        if a.threads:
            used = sorted(((ticks1.get(tid, 0) - ticks0.get(tid, 0), tid) for tid in ticks0.keys() | ticks1.keys()),
                          reverse=True)
            for n, tid in used:
                if n > 0:
                    print(f"  {n / CLK_TCK / window * 100:6.2f}%  {names.get(tid, '?')} (thread {tid})")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if fake is not None:
            fake.__exit__(None, None, None)
        if a.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
