"""Docker mode: direct to dockerd vs through koord-runtime-proxy, in one run.

    .venv/bin/python bench/docker.py [--calls 2000] [--pods 20] [--load-mib 1024]

1. ``GET /containers/json`` (20 containers, keep-alive connection): p50/p99 latency and the
   proxy's CPU per call.
2. Pod start via cri-dockerd (RunPodSandbox + CreateContainer + StartContainer): direct,
   through the proxy with no plugins, and with two no-op plugins on every hook point.
3. The proxy's RSS while a ``docker load`` body of ``--load-mib`` MiB streams through it
   (an image archive padded with a large layer).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_seconds, percentile, us  # noqa: E402

from koord_testing.docker import CriDockerd, Dockerd, UnixHTTPConnection  # noqa: E402
from koord_testing.hookplugin import RecordingPlugin  # noqa: E402
from koord_testing.kubelet import KubeletClient  # noqa: E402
from koord_testing.proxy import RuntimeProxy  # noqa: E402
from koord_testing.sockets import make_short_socket_dir  # noqa: E402

MiB = 1 << 20


def list_latencies(endpoint: str, calls: int) -> list[float]:
    conn = UnixHTTPConnection(endpoint)
    samples = []
    try:
        for _ in range(calls):
            begin = time.perf_counter()
            conn.request("GET", "/v1.41/containers/json")
            resp = conn.getresponse()
            resp.read()
            samples.append(time.perf_counter() - begin)
            assert resp.status == 200
    finally:
        conn.close()
    return samples


def start_pod(client: KubeletClient, image: str) -> float:
    begin = time.perf_counter()
    sandbox = client.run_pod("bench", uid=str(uuid.uuid4()))
    client.run_container(sandbox, "c", image, command=["/pause"])
    elapsed = time.perf_counter() - begin
    client.cleanup()
    return elapsed


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def big_archive(path: Path, mib: int) -> None:
    """A tar whose one member is ``mib`` MiB of zeros: dockerd reads it all, then refuses it (no manifest)."""
    info = tarfile.TarInfo("padding")
    info.size = mib * MiB
    zeros = bytes(MiB)
    with open(path, "wb") as out:
        out.write(info.tobuf())
        for _ in range(mib):
            out.write(zeros)
        out.write(bytes(2 * tarfile.BLOCKSIZE))


def stream_load(endpoint: str, archive: Path) -> int:
    conn = UnixHTTPConnection(endpoint, timeout=600)
    with open(archive, "rb") as f:
        conn.putrequest("POST", "/v1.41/images/load?quiet=1")
        conn.putheader("Content-Type", "application/x-tar")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        while chunk := f.read(1 << 20):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--load-mib", type=int, default=1024)
    args = parser.parse_args()
    root = make_short_socket_dir("kbd-")
    dockerd = Dockerd(root / "d").start()
    plugins = [RecordingPlugin(root / f"noop{i}.sock", name=f"noop{i}").start() for i in (1, 2)]
    hooks_two = root / "hooks-two"
    for i, plugin in enumerate(plugins, 1):
        plugin.registration(hooks_two, f"{i}0-noop.json")
    bare = RuntimeProxy(root / "bare", dockerd.endpoint, hook_config_dir=root / "hooks-none", docker=True,
                        extra_args=("--log-level", "warning")).start()
    hooked = RuntimeProxy(root / "hooked", dockerd.endpoint, hook_config_dir=hooks_two, docker=True,
                          extra_args=("--log-level", "warning")).start()
    cris = {"direct": CriDockerd(root / "c0", dockerd.endpoint).start(),
            "proxy, no plugins": CriDockerd(root / "c1", bare.endpoint).start(),
            "proxy, 2 no-op plugins": CriDockerd(root / "c2", hooked.endpoint).start()}
    try:
        for i in range(20):
            dockerd.cli("create", "--network", "none", "--name", f"bench{i}", dockerd.image)
        assert bare.pid is not None
        list_latencies(dockerd.endpoint, 200)
        list_latencies(bare.endpoint, 200)
        direct = list_latencies(dockerd.endpoint, args.calls)
        cpu0 = cpu_seconds(bare.pid)
        proxied = list_latencies(bare.endpoint, args.calls)
        cpu = (cpu_seconds(bare.pid) - cpu0) / args.calls
        print(f"GET /containers/json (20 containers), {args.calls} calls on one keep-alive connection, µs")
        print(f"  direct         p50 {us(percentile(direct, 50))}  p99 {us(percentile(direct, 99))}")
        print(f"  through proxy  p50 {us(percentile(proxied, 50))}  p99 {us(percentile(proxied, 99))}")
        print(f"  added p50 {us(percentile(proxied, 50) - percentile(direct, 50)).strip()} µs, "
              f"proxy CPU per call {us(cpu).strip()} µs")

        clients = {name: cri.client(dockerd.track_pod_cgroup) for name, cri in cris.items()}
        for client in clients.values():
            start_pod(client, dockerd.image)
        samples: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(args.pods):
            for name, client in clients.items():
                samples[name].append(start_pod(client, dockerd.image))
        med = {name: statistics.median(s) for name, s in samples.items()}
        print(f"pod start via cri-dockerd (Run+Create+Start), median of {args.pods}, µs")
        for name, value in med.items():
            print(f"  {name:24} {us(value)}   ratio to direct {value / med['direct']:.2f}")
        for client in clients.values():
            client.close()

        with tempfile.TemporaryDirectory(dir=root) as tmp:
            archive = Path(tmp) / "big.tar"
            big_archive(archive, args.load_mib)
            before = rss_mib(bare.pid)
            peak = before
            done = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_mib(bare.pid))  # type: ignore[arg-type]
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            begin = time.perf_counter()
            status = stream_load(bare.endpoint, archive)
            elapsed = time.perf_counter() - begin
            done.set()
            sampler.join()
            print(f"docker load of a {args.load_mib} MiB chunked body through the proxy: dockerd answered {status} "
                  f"after {elapsed:.1f} s; proxy RSS {before:.0f} MiB before, peak {peak:.0f} MiB "
                  f"(+{peak - before:.0f} MiB)")
    finally:
        for cri in cris.values():
            cri.stop()
        bare.stop()
        hooked.stop()
        for plugin in plugins:
            plugin.stop()
        dockerd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
