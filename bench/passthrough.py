"""Pass-through cost of the proxy on both data planes, against direct calls, in one run.

    .venv/bin/python bench/passthrough.py [--calls 2000] [--containers 20] [--seconds 5]

For Version and ListContainers: p50/p99 latency of direct calls and of calls through the
proxy with the HAProxy and with the Python data plane (no plugins), the added microseconds
and ratio, and the proxy's CPU per call (all its processes: Python, plus HAProxy when it
runs; from /proc).  Sequential calls rotate between the three paths in rounds of 100 so all
see the same machine load.  Then throughput: 8 client processes (grpcload.c, compiled with
gcc on the spot) calling Version as fast as they can for ``--seconds`` on each path.  Last,
the RSS of all proxy processes after 20
ListContainers answers of 8 MiB each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import containerd, cpu_seconds, percentile, proxy, proxy_pids, rss_bytes, us  # noqa: E402
from cri_api.v1 import api_pb2 as cri  # noqa: E402

from koord_testing.kubelet import KubeletClient  # noqa: E402

PLANES = ("haproxy", "python")
CLIENTS = 8
BIG_LIST_BYTES = 8 << 20
BIG_LIST_CONTAINERS = 16


def measure(calls: int, fn: Callable[[], object]) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def build_load_client(work: Path) -> Path:
    """Compiles grpcload.c: a C client, so the clients' own CPU does not cap the rate measured."""
    binary = work / "grpcload"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(Path(__file__).resolve().parent / "grpcload.c")],
                   check=True)
    return binary


def throughput(load_client: Path, endpoint: str, seconds: float) -> float:
    """Calls per second of CLIENTS processes, each with its own connection, calling Version in a loop."""
    procs = [subprocess.Popen([str(load_client), endpoint, "/runtime.v1.RuntimeService/Version", str(seconds)],
                              stdout=subprocess.PIPE, text=True) for _ in range(CLIENTS)]
    ok = failed = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"grpcload against {endpoint} exited with {proc.returncode}")
        good, bad = out.split()
        ok, failed = ok + int(good), failed + int(bad)
    if failed:
        raise RuntimeError(f"{failed} of {ok + failed} Version calls through {endpoint} failed")
    return ok / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--containers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with containerd() as (backend, work):
        direct = KubeletClient(backend.endpoint)
        sandbox = direct.run_pod("bench", uid=str(uuid.uuid4()))
        for i in range(args.containers):
            direct.run_container(sandbox, f"c{i}", backend.image)
        with proxy(backend, work, work / "hooks", "haproxy", "haproxy") as via_haproxy, \
                proxy(backend, work, work / "hooks", "python", "python") as via_python:
            proxies = {"haproxy": via_haproxy, "python": via_python}
            clients = {"direct": direct, **{p: KubeletClient(proxies[p].endpoint) for p in PLANES}}
            methods: dict[str, Callable[[KubeletClient], object]] = {
                "Version": lambda c: c.runtime.Version(cri.VersionRequest()),
                f"ListContainers ({args.containers})": lambda c: c.runtime.ListContainers(cri.ListContainersRequest()),
            }
            print(f"{args.calls} sequential calls per path, direct vs through koord-runtime-proxy (no plugins); µs")
            print(f"{'method':26} {'path':8} {'p50':>8} {'added':>8} {'ratio':>6} {'p99':>8} {'proxy CPU/call':>15}")
            for name, fn in methods.items():
                for client in clients.values():
                    measure(200, lambda fn=fn, client=client: fn(client))
                samples: dict[str, list[float]] = {path: [] for path in clients}
                cpu_before = {p: sum(cpu_seconds(pid) for pid in proxy_pids(proxies[p])) for p in PLANES}
                cpu_used = dict.fromkeys(PLANES, 0.0)
                for _ in range(args.calls // 100):
                    for path, client in clients.items():
                        samples[path] += measure(100, lambda fn=fn, client=client: fn(client))
                for p in PLANES:
                    cpu_used[p] = sum(cpu_seconds(pid) for pid in proxy_pids(proxies[p])) - cpu_before[p]
                d50 = percentile(samples["direct"], 50)
                for path, s in samples.items():
                    p50 = percentile(s, 50)
                    cpu = f"{us(cpu_used[path] / len(s))}" if path in cpu_used else f"{'-':>8}"
                    print(f"{name:26} {path:8} {us(p50)} {us(p50 - d50)} {p50 / d50:6.2f} "
                          f"{us(percentile(s, 99))} {cpu:>15}")
            for client in clients.values():
                if client is not direct:
                    client.close()

            print(f"\nthroughput, Version, {CLIENTS} client processes for {args.seconds:.0f}s each (calls/s)")
            load_client = build_load_client(work)
            rates = {"direct": throughput(load_client, backend.endpoint, args.seconds)}
            rates.update({p: throughput(load_client, proxies[p].endpoint, args.seconds) for p in PLANES})
            for path, rate in rates.items():
                print(f"  {path:8} {rate:8.0f}   ({rate / rates['python']:.1f}x the Python data plane)")

            pad = "x" * (BIG_LIST_BYTES // BIG_LIST_CONTAINERS)
            big = [direct.create_container(sandbox, f"big{i}", backend.image, annotations={"pad": pad})
                   for i in range(BIG_LIST_CONTAINERS)]
            print(f"\nRSS of all proxy processes (MB), before and after 20 ListContainers of "
                  f"{BIG_LIST_BYTES >> 20} MiB each")
            for p in PLANES:
                before = sum(rss_bytes(pid) for pid in proxy_pids(proxies[p]))
                with KubeletClient(proxies[p].endpoint) as client:
                    for _ in range(20):
                        size = client.runtime.ListContainers(cri.ListContainersRequest(), timeout=60).ByteSize()
                time.sleep(1.0)
                after = sum(rss_bytes(pid) for pid in proxy_pids(proxies[p]))
                print(f"  {p:8} {before / 1e6:6.1f} -> {after / 1e6:6.1f}   (list of {size / (1 << 20):.1f} MiB, "
                      f"processes {proxy_pids(proxies[p])})")
            for container_id in big:
                direct.remove_container(container_id)
        direct.cleanup()
        direct.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
