"""Pass-through cost of the proxy: Version and ListContainers, direct vs proxied, in one run.

    .venv/bin/python bench/passthrough.py [--calls 2000] [--containers 20]

Prints p50/p99 latency of each path, the added microseconds and ratio, and the proxy's own
CPU microseconds per call (from /proc).  Calls alternate between direct and proxied so both
see the same machine load.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import containerd, cpu_seconds, percentile, proxy, us  # noqa: E402
from cri_api.v1 import api_pb2 as cri  # noqa: E402

from koord.testing.kubelet import KubeletClient  # noqa: E402


def measure(calls: int, fn) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--containers", type=int, default=20)
    args = parser.parse_args()
    with containerd() as (backend, work):
        direct = KubeletClient(backend.endpoint)
        sandbox = direct.run_pod("bench", uid=str(uuid.uuid4()))
        for i in range(args.containers):
            direct.run_container(sandbox, f"c{i}", backend.image)
        with proxy(backend, work, work / "hooks") as (sock, pid):
            proxied = KubeletClient(sock)
            methods = {
                "Version": lambda c: c.runtime.Version(cri.VersionRequest()),
                f"ListContainers ({args.containers})": lambda c: c.runtime.ListContainers(cri.ListContainersRequest()),
            }
            print(f"{args.calls} calls each, direct vs through koord-runtime-proxy (no plugins)")
            print(f"{'method':26} {'direct p50':>10} {'proxy p50':>10} {'added p50':>10} {'ratio':>6}"
                  f" {'direct p99':>10} {'proxy p99':>10} {'proxy CPU/call':>15}  (µs)")
            for name, fn in methods.items():
                measure(200, lambda fn=fn: fn(direct))
                measure(200, lambda fn=fn: fn(proxied))
                d_samples: list[float] = []
                p_samples: list[float] = []
                cpu_before = cpu_seconds(pid)
                for _ in range(args.calls // 100):
                    d_samples += measure(100, lambda fn=fn: fn(direct))
                    p_samples += measure(100, lambda fn=fn: fn(proxied))
                cpu_per_call = (cpu_seconds(pid) - cpu_before) / len(p_samples)
                d50, p50 = percentile(d_samples, 50), percentile(p_samples, 50)
                print(f"{name:26} {us(d50):>10} {us(p50):>10} {us(p50 - d50):>10} {p50 / d50:6.2f}"
                      f" {us(percentile(d_samples, 99)):>10} {us(percentile(p_samples, 99)):>10}"
                      f" {us(cpu_per_call):>15}")
            proxied.close()
        direct.cleanup()
        direct.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
