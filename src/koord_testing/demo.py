"""The local demo: a private containerd, koordlet's runtime hooks, koord-runtime-proxy in
front, pods started through it the way kubelet would, and what koordlet did to them shown
from the real cgroup files.  Run with ``scripts/demo.sh`` (as root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from koord.apis.extension import (
    ANNOTATION_EXTENDED_RESOURCE_SPEC,
    ANNOTATION_RESOURCE_STATUS,
    BATCH_CPU,
    BATCH_MEMORY,
    LABEL_POD_QOS,
)
from koord.hookapi import parse_quantity
from koord_testing.cgroups import Cgroup, cgroup_version
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.processes import stop_process
from koord_testing.proxy import RuntimeProxy
from koord_testing.runtimes import resolve, system_runtime
from koord_testing.wait import scaled
from koord_testing.workloads import burn_command

_BATCH_500M_2GI = {BATCH_CPU: "500", BATCH_MEMORY: "2Gi"}
BATCH_SPEC = {"containers": {"app": {"requests": _BATCH_500M_2GI, "limits": _BATCH_500M_2GI}}}
"""The demos' BE pod: 500m / 2Gi of batch resources, which koordlet turns into shares 512, quota 50000, 2 GiB."""


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def start_koordlet(work: Path, hook_dir: Path, cri_endpoint: str) -> subprocess.Popen:
    log = open(work / "koordlet.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "koord.koordlet", "--runtime-hooks-addr", str(work / "koordlet.sock"),
         "--runtime-hooks-config-path", str(hook_dir), "--containerd-endpoint", cri_endpoint,
         "--runtime-hooks-reconcile-interval", "0", *node_agent_args(work)], stdout=log, stderr=log)
    registration = hook_dir / "koordlet.json"
    deadline = time.monotonic() + scaled(20)  # the v2 lane runs the demo emulated
    while not registration.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"koordlet did not register:\n{(work / 'koordlet.log').read_text()[-2000:]}")
        time.sleep(0.05)
    say(f"koordlet registered itself: {json.dumps(json.loads(registration.read_text()))}")
    return proc


NODE_METRIC_REPORT_SECONDS = 2


def node_agent_args(work: Path) -> list[str]:
    """koordlet as node agent in the demo: its own metric cache, a NodeMetric file whose
    status it rewrites every 2 s, no Prometheus port."""
    (work / "nodemetric.yaml").write_text(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeMetric\nmetadata: {name: demo-node}\n"
        f"spec:\n  metricCollectPolicy: {{reportIntervalSeconds: {NODE_METRIC_REPORT_SECONDS}, "
        "aggregateDurationSeconds: 10, nodeAggregatePolicy: {durations: [20s]}}\n")
    return ["--tsdb-path", str(work / "metric-data"), "--addr", "",
            "--prediction-checkpoint-filepath", str(work / "prediction"),
            "--node-metric-file", str(work / "nodemetric.yaml"), "--kubelet-sync-interval", "1s"]


def show_node_metric(work: Path, client: KubeletClient, backend: Containerd) -> None:
    """Starts a pod burning half a CPU and shows the NodeMetric koordlet reports for the demo's pods."""
    say("a BE pod burning half a CPU, then the NodeMetric koordlet writes from real cgroup usage:")
    sandbox = client.run_pod("demo-burner", uid=str(uuid.uuid4()), labels={LABEL_POD_QOS: "BE"}, qos="besteffort")
    client.run_container(sandbox, "burn", backend.image, command=burn_command(0.5))
    path = work / "nodemetric.yaml"
    deadline = time.monotonic() + scaled(60)
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = (yaml.safe_load(path.read_text()) or {}).get("status") or {}
        burner = [m for m in status.get("podsMetric", []) if m["name"] == "demo-burner"]
        if burner and parse_quantity(burner[0]["podUsage"]["resources"]["cpu"]) > Fraction(3, 10):
            break
        time.sleep(NODE_METRIC_REPORT_SECONDS / 2)
    say(f"    {path} status.updateTime = {status.get('updateTime')}")
    say(f"    nodeUsage = {json.dumps(status.get('nodeMetric', {}).get('nodeUsage'))}")
    for m in status.get("podsMetric", []):
        say(f"    podsMetric {m['namespace']}/{m['name']}: {json.dumps(m['podUsage']['resources'])}, "
            f"qos {m.get('qos')}, priority {m.get('priority')}")


def show(client: KubeletClient, sandbox: str, container: str, values: list[str]) -> None:
    """The container's real cgroup files holding ``values`` (keys of ``Cgroup.SHOWN``): v1's
    per-controller files or v2's unified ones, whichever this kernel has."""
    cg = Cgroup.of_container(client.pod_cgroup_parent(sandbox), container)
    for what in values:
        path, text = cg.shown(what)
        say(f"    {str(path).replace(container, container[:12] + '…')} = {text}")


def demo_be_suppress(work: Path, backend: Containerd) -> None:
    """BE CPU suppress: a koordlet with NodeSLO ``cpuSuppressPolicy: cfsQuota`` at 65%, a BE
    pod burning every CPU, then an LS pod burning one: the besteffort quota before and after.
    Pods live under a private kube dir so the machine's own ``kubepods`` is never touched."""
    cpus = os.cpu_count() or 1
    kube = f"koord-demo-{uuid.uuid4().hex[:8]}/kubepods"
    node_file, slo_file = work / "node.json", work / "nodeslo.json"
    node_file.write_text(json.dumps({"metadata": {"name": "demo-node"}, "status": {
        "capacity": {"cpu": str(cpus), "memory": "8Gi"}, "allocatable": {"cpu": str(cpus), "memory": "8Gi"}}}))
    slo_file.write_text(json.dumps({"metadata": {"name": "demo-node"}, "spec": {"resourceUsedThresholdWithBE": {
        "enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 65}}}))
    koordlet = KoordletProcess(work / "koordlet-qos", [
        "--node-slo-file", str(slo_file), "--node-file", str(node_file), "--cgroup-kube-dir", kube,
        "--cgroup-driver", "cgroupfs", "--containerd-endpoint", backend.endpoint,
        "--kubelet-sync-interval", "1s", "--runtime-hooks-reconcile-interval", "0"]).start()
    besteffort = Cgroup(f"{kube}/besteffort")
    client = KubeletClient(backend.endpoint, on_pod_created=backend.track_pod_cgroup)

    def watch(seconds: float) -> None:
        for _ in range(int(seconds)):
            time.sleep(1)
            if besteffort.exists():
                say("    {} = {}".format(*besteffort.shown("quota")))
            else:
                say(f"    {besteffort.rel}: no besteffort cgroup yet")
        formulas = [line for line in koordlet.logs(200).splitlines() if "BECPUSuppress: suppress" in line]
        if formulas:
            say("    koordlet's last calculation: " + formulas[-1].split("BECPUSuppress: ", 1)[-1])

    try:
        say(f"BE CPU suppress: NodeSLO cfsQuota at 65% of {cpus} cpus; BE quota = (capacity x 65% "
            "- LS pods' use - system use) x 100, at least 2000")
        sandbox = client.run_pod("demo-be-burner", labels={LABEL_POD_QOS: "BE"}, qos="besteffort", kube_dir=kube)
        client.run_container(sandbox, "burn", backend.image, command=burn_command(cpus))
        say(f"a BE pod burns {cpus} cpus; no LS pod yet:")
        watch(6)
        sandbox = client.run_pod("demo-ls-burner", labels={LABEL_POD_QOS: "LS"}, qos="burstable", kube_dir=kube)
        client.run_container(sandbox, "burn", backend.image, command=burn_command(1))
        say("an LS pod starts burning 1 cpu: its use comes off the BE quota at once")
        watch(6)
    finally:
        koordlet.stop()
        client.cleanup()
        client.close()


def demo_nri(work: Path) -> None:
    """The same LSR and BE pods on containerd 2.x, created straight on containerd: koordlet's
    hooks reach them through NRI, with no proxy in the path and its reconciler off."""
    try:
        runtime = resolve("2", Path.cwd())
    except RuntimeError as err:
        say(f"NRI: no containerd 2.x to show it on ({err})")
        return
    say(f"NRI mode: a private containerd {runtime.version} with NRI on, koordlet connected to its NRI socket, "
        "pods created directly at containerd (no proxy, no reconciler):")
    with ExitStack() as stack:
        backend = Containerd(work / "containerd2", runtime=runtime).start()
        stack.callback(backend.stop)
        koordlet = KoordletProcess(work / "koordlet-nri", [
            "--containerd-endpoint", backend.endpoint, "--runtime-hooks-reconcile-interval", "0",
            f"-var-run-root-dir={backend.workdir}", "-runtime-hooks-nri-socket-path=nri.sock"]).start()
        stack.callback(koordlet.stop)
        deadline = time.monotonic() + scaled(20)
        while "NRI plugin 00-koordlet_nri registered" not in koordlet.logs(400):
            if time.monotonic() > deadline:
                raise SystemExit(f"koordlet did not register with NRI:\n{koordlet.logs(60)}")
            time.sleep(0.1)
        say(f"    koordlet registered as NRI plugin 00-koordlet_nri at {backend.nri_socket}")
        client = stack.enter_context(KubeletClient(backend.endpoint, on_pod_created=backend.track_pod_cgroup))
        stack.callback(client.cleanup)
        sandbox = client.run_pod("demo-lsr-nri", uid=str(uuid.uuid4()), labels={LABEL_POD_QOS: "LSR"},
                                 annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0"})},
                                 qos="guaranteed")
        container = client.run_container(sandbox, "app", backend.image,
                                         resources={"cpu_period": 100000, "cpu_quota": 100000})
        say("    LSR pod:")
        show(client, sandbox, container, ["cpuset", "quota"])
        sandbox = client.run_pod("demo-be-nri", uid=str(uuid.uuid4()), labels={LABEL_POD_QOS: "BE"},
                                 annotations={ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps(BATCH_SPEC)},
                                 qos="besteffort")
        container = client.run_container(sandbox, "app", backend.image)
        say("    BE pod with batch resources 500m / 2Gi:")
        show(client, sandbox, container, ["shares", "quota", "memory"])


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="koord-demo-"))
    hook_dir = work / "hookserver.d"
    with ExitStack() as stack:
        runtime = system_runtime()
        say(f"cgroup v{cgroup_version()}; starting a private containerd {runtime.version} "
            f"({runtime.binary('containerd')}) under {work}")
        backend = Containerd(work / "containerd", runtime=runtime).start()
        stack.callback(backend.stop)
        koordlet = start_koordlet(work, hook_dir, backend.endpoint)
        stack.callback(koordlet.wait, 15)
        stack.callback(stop_process, koordlet)
        proxy = RuntimeProxy(work / "proxy", backend.endpoint, hook_config_dir=hook_dir).start()
        stack.callback(proxy.stop)
        say(f"koord-runtime-proxy serves CRI on {proxy.endpoint}, forwarding to {backend.endpoint}")

        via_proxy = stack.enter_context(KubeletClient(proxy.endpoint, on_pod_created=backend.track_pod_cgroup))
        stack.callback(via_proxy.cleanup)
        direct = stack.enter_context(KubeletClient(backend.endpoint, on_pod_created=backend.track_pod_cgroup))
        stack.callback(direct.cleanup)

        limit = {"cpu_period": 100000, "cpu_quota": 100000}  # what kubelet sends for a 1-CPU limit
        lsr: dict[str, Any] = {"labels": {LABEL_POD_QOS: "LSR"},
                               "annotations": {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0"})},
                               "qos": "guaranteed"}
        say(f"LSR pod with {ANNOTATION_RESOURCE_STATUS}={{\"cpuset\":\"0\"}}, started through the proxy:")
        sandbox = via_proxy.run_pod("demo-lsr", uid=str(uuid.uuid4()), **lsr)
        container = via_proxy.run_container(sandbox, "app", backend.image, resources=limit)
        show(via_proxy, sandbox, container, ["cpuset", "quota"])

        say("the same pod started directly at containerd (no proxy, so no koordlet):")
        sandbox = direct.run_pod("demo-lsr-direct", uid=str(uuid.uuid4()), **lsr)
        container = direct.run_container(sandbox, "app", backend.image, resources=limit)
        show(direct, sandbox, container, ["cpuset", "quota"])

        say("BE pod with batch resources 500m / 2Gi, started through the proxy:")
        sandbox = via_proxy.run_pod("demo-be", uid=str(uuid.uuid4()), labels={LABEL_POD_QOS: "BE"},
                                    annotations={ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps(BATCH_SPEC)},
                                    qos="besteffort")
        container = via_proxy.run_container(sandbox, "app", backend.image)
        show(via_proxy, sandbox, container, ["shares", "quota", "memory"])
        show_node_metric(work, via_proxy, backend)
        demo_be_suppress(work, backend)
        demo_nri(work)
        say("cleaning up")
    say(f"done; logs are in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
