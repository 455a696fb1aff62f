"""The local demo: a private containerd, koordlet's runtime hooks, koord-runtime-proxy in
front, pods started through it the way kubelet would, and what koordlet did to them shown
from the real cgroup files.  Run with ``scripts/demo.sh`` (as root).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from koord.testing.containerd import Containerd
from koord.testing.kubelet import KubeletClient, read_cgroup
from koord.testing.processes import stop_process
from koord.testing.proxy import RuntimeProxy

QOS_LABEL = "koordinator.sh/qosClass"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def start_koordlet(work: Path, hook_dir: Path, backend: Containerd) -> subprocess.Popen:
    log = open(work / "koordlet.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "koord.koordlet", "--runtime-hooks-addr", str(work / "koordlet.sock"),
         "--runtime-hooks-config-path", str(hook_dir), "--containerd-endpoint", backend.endpoint,
         "--runtime-hooks-reconcile-interval", "0"], stdout=log, stderr=log)
    registration = hook_dir / "koordlet.json"
    deadline = time.monotonic() + 20
    while not registration.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"koordlet did not register:\n{(work / 'koordlet.log').read_text()[-2000:]}")
        time.sleep(0.05)
    say(f"koordlet registered itself: {json.dumps(json.loads(registration.read_text()))}")
    return proc


def show(client: KubeletClient, sandbox: str, container: str, files: list[tuple[str, str]]) -> None:
    parent = client.pod_cgroup_parent(sandbox)
    for subsystem, name in files:
        say(f"    {subsystem}/{parent.strip('/')}/{container[:12]}…/{name} = "
            f"{read_cgroup(subsystem, parent, container, name)}")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="koord-demo-"))
    hook_dir = work / "hookserver.d"
    with ExitStack() as stack:
        say(f"starting a private containerd under {work}")
        backend = Containerd(work / "containerd").start()
        stack.callback(backend.stop)
        koordlet = start_koordlet(work, hook_dir, backend)
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
        lsr: dict[str, Any] = {"labels": {QOS_LABEL: "LSR"},
                               "annotations": {RESOURCE_STATUS: json.dumps({"cpuset": "0"})}, "qos": "guaranteed"}
        say(f"LSR pod with {RESOURCE_STATUS}={{\"cpuset\":\"0\"}}, started through the proxy:")
        sandbox = via_proxy.run_pod("demo-lsr", uid=str(uuid.uuid4()), **lsr)
        container = via_proxy.run_container(sandbox, "app", backend.image, resources=limit)
        show(via_proxy, sandbox, container, [("cpuset", "cpuset.cpus"), ("cpu", "cpu.cfs_quota_us")])

        say("the same pod started directly at containerd (no proxy, so no koordlet):")
        sandbox = direct.run_pod("demo-lsr-direct", uid=str(uuid.uuid4()), **lsr)
        container = direct.run_container(sandbox, "app", backend.image, resources=limit)
        show(direct, sandbox, container, [("cpuset", "cpuset.cpus"), ("cpu", "cpu.cfs_quota_us")])

        spec = {"containers": {"app": {"requests": {"kubernetes.io/batch-cpu": "500",
                                                    "kubernetes.io/batch-memory": "2Gi"},
                                       "limits": {"kubernetes.io/batch-cpu": "500",
                                                  "kubernetes.io/batch-memory": "2Gi"}}}}
        say("BE pod with batch resources 500m / 2Gi, started through the proxy:")
        sandbox = via_proxy.run_pod("demo-be", uid=str(uuid.uuid4()), labels={QOS_LABEL: "BE"},
                                    annotations={EXTENDED_SPEC: json.dumps(spec)}, qos="besteffort")
        container = via_proxy.run_container(sandbox, "app", backend.image)
        show(via_proxy, sandbox, container, [("cpu", "cpu.shares"), ("cpu", "cpu.cfs_quota_us"),
                                             ("memory", "memory.limit_in_bytes")])
        say("cleaning up")
    say(f"done; logs are in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
