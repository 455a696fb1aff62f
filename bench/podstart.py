"""Pod start (RunPodSandbox + CreateContainer + StartContainer) direct vs through the proxy.

    .venv/bin/python bench/podstart.py [--pods 30]

Five paths in one run, pods interleaved so all see the same load: direct to containerd, and
on each data plane (HAProxy, Python) through the proxy with no plugins and with two no-op
plugins registered for every hook point.  A pod start makes 4 hook points x 2 plugins = 8 plugin calls, so the
per-plugin-call overhead is (two plugins - no plugins) / 8.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import containerd, proxy, us  # noqa: E402

from koord_testing.hookplugin import RecordingPlugin  # noqa: E402
from koord_testing.kubelet import KubeletClient  # noqa: E402

PLUGIN_CALLS_PER_POD = 8


def start_pod(client: KubeletClient, image: str) -> float:
    begin = time.perf_counter()
    sandbox = client.run_pod("bench", uid=str(uuid.uuid4()))
    client.run_container(sandbox, "c", image)
    elapsed = time.perf_counter() - begin
    client.cleanup()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=30)
    args = parser.parse_args()
    with containerd() as (backend, work):
        plugins = [RecordingPlugin(work / f"noop{i}.sock", name=f"noop{i}").start() for i in (1, 2)]
        hooks_dir = work / "hooks-two"
        for i, plugin in enumerate(plugins, 1):
            plugin.registration(hooks_dir, f"{i}0-noop.json")
        try:
            with proxy(backend, work, work / "hooks-none", "bare-h", "haproxy") as bare_h, \
                    proxy(backend, work, hooks_dir, "hooked-h", "haproxy") as hooked_h, \
                    proxy(backend, work, work / "hooks-none", "bare-p", "python") as bare_p, \
                    proxy(backend, work, hooks_dir, "hooked-p", "python") as hooked_p:
                clients = {"direct": KubeletClient(backend.endpoint),
                           "haproxy, no plugins": KubeletClient(bare_h.endpoint),
                           "haproxy, 2 no-op plugins": KubeletClient(hooked_h.endpoint),
                           "python, no plugins": KubeletClient(bare_p.endpoint),
                           "python, 2 no-op plugins": KubeletClient(hooked_p.endpoint)}
                for client in clients.values():
                    start_pod(client, backend.image)
                samples: dict[str, list[float]] = {name: [] for name in clients}
                for _ in range(args.pods):
                    for name, client in clients.items():
                        samples[name].append(start_pod(client, backend.image))
                for client in clients.values():
                    client.close()
        finally:
            for plugin in plugins:
                plugin.stop()
    med = {name: statistics.median(s) for name, s in samples.items()}
    print(f"pod start (Run+Create+Start), median of {args.pods}, µs")
    for name, value in med.items():
        print(f"  {name:26} {us(value)}   ratio to direct {value / med['direct']:.2f}")
    for plane in ("haproxy", "python"):
        per_call = (med[f"{plane}, 2 no-op plugins"] - med[f"{plane}, no plugins"]) / PLUGIN_CALLS_PER_POD
        print(f"  {plane}: hook dispatch overhead per plugin call: {us(per_call).strip()} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
