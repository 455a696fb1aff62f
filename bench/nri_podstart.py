"""Pod start on containerd 2.x with koordlet's NRI plugin vs without any plugin.

    .venv/bin/python bench/nri_podstart.py [--pods 30]

Two private containerd 2.x instances (``scripts/containerd2.sh``) in one run, pods interleaved
so both see the same load: one with koordlet connected to its NRI socket (reconciler off, so
only NRI acts), one with no NRI plugin. Each pod is a BE pod with batch resources, so the
hooks compute and adjust for real. Printed: the median pod start (RunPodSandbox +
CreateContainer + StartContainer) of each and their ratio, and CreateContainer's p50/p99
on each with the difference: the latency the plugin adds where kubelet waits for it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import percentile  # noqa: E402

from koord_testing.cgroups import Cgroup, shares_to_weight  # noqa: E402
from koord_testing.containerd import Containerd  # noqa: E402
from koord_testing.koordlet import KoordletProcess  # noqa: E402
from koord_testing.kubelet import KubeletClient  # noqa: E402
from koord_testing.runtimes import resolve  # noqa: E402
from koord_testing.wait import wait_for  # noqa: E402

CHECKOUT = Path(__file__).resolve().parent.parent
LIMITS = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"}
ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(
    {"containers": {"c": {"requests": LIMITS, "limits": LIMITS}}})}


def start_pod(client: KubeletClient, image: str, expect_shares: int | None = None) -> tuple[float, float]:
    """Seconds of the whole start and of its CreateContainer; ``expect_shares``: the container's
    cpu shares are checked to be that (the plugin really adjusted it)."""
    begin = time.perf_counter()
    sandbox = client.run_pod("bench", uid=str(uuid.uuid4()), labels={"koordinator.sh/qosClass": "BE"},
                             annotations=ANNOTATIONS, qos="besteffort")
    created = time.perf_counter()
    container = client.create_container(sandbox, "c", image, resources={"cpu_shares": 2})
    create = time.perf_counter() - created
    client.start_container(container)
    elapsed = time.perf_counter() - begin
    if expect_shares is not None:
        weight = Cgroup.of_container(client.pod_cgroup_parent(sandbox), container).cpu_weight()
        if weight != shares_to_weight(expect_shares):
            raise RuntimeError(f"the container's cpu weight is {weight}, not {shares_to_weight(expect_shares)}: "
                               "the NRI plugin did not adjust it")
    client.cleanup()
    return elapsed, create


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=30)
    args = parser.parse_args()
    runtime = resolve("2", CHECKOUT)
    work = Path(tempfile.mkdtemp(prefix="koord-bench-nri-"))
    with Containerd(work / "with", runtime=runtime) as hooked, Containerd(work / "without", runtime=runtime) as bare:
        koordlet = KoordletProcess(work / "koordlet", [
            "--log-level", "INFO", "--runtime-hooks-reconcile-interval", "0", "--containerd-endpoint", hooked.endpoint,
            f"-var-run-root-dir={hooked.workdir}", "-runtime-hooks-nri-socket-path=nri.sock"]).start()
        try:
            wait_for(lambda: "NRI plugin 00-koordlet_nri registered" in koordlet.logs(tail=400),
                     "koordlet to register with containerd's NRI")
            clients = {"no NRI plugin": (KubeletClient(bare.endpoint), bare),
                       "koordlet's NRI plugin": (KubeletClient(hooked.endpoint), hooked)}
            start_pod(clients["no NRI plugin"][0], bare.image, expect_shares=2)
            start_pod(clients["koordlet's NRI plugin"][0], hooked.image, expect_shares=512)
            starts: dict[str, list[float]] = {name: [] for name in clients}
            creates: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(args.pods):
                for name, (client, backend) in clients.items():
                    whole, create = start_pod(client, backend.image)
                    starts[name].append(whole)
                    creates[name].append(create)
            for client, _ in clients.values():
                client.close()
            adjusted = koordlet.logs(tail=100000).count("NRI: synchronized")
        finally:
            koordlet.stop()
    base, nri = "no NRI plugin", "koordlet's NRI plugin"
    med = {name: statistics.median(s) for name, s in starts.items()}
    print(f"containerd {runtime.version}, BE pods with batch resources, {args.pods} each, interleaved")
    print("pod start (Run+Create+Start), median, ms")
    for name, value in med.items():
        print(f"  {name:24} {value * 1e3:8.1f}")
    print(f"  ratio with/without: {med[nri] / med[base]:.3f}")
    print("CreateContainer, ms        p50      p99")
    for name, samples in creates.items():
        print(f"  {name:22} {percentile(samples, 50) * 1e3:8.2f} {percentile(samples, 99) * 1e3:8.2f}")
    print(f"  added                  {(percentile(creates[nri], 50) - percentile(creates[base], 50)) * 1e3:8.2f} "
          f"{(percentile(creates[nri], 99) - percentile(creates[base], 99)) * 1e3:8.2f}")
    print(f"  (koordlet synchronized with containerd {adjusted} time(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
