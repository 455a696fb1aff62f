"""PLEG end to end: a BE pod created on containerd directly (no proxy, so no hook ran) gets
its batch limits from Standalone koordlet at once, not at the next poll.

Both polls are set to an hour, so only PLEG can explain the limits being written while the
test runs; the latency from StartContainer to the limits is printed, not asserted (the
deadline only bounds a hung test)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from koord.testing.cgroups import Cgroup, shares_to_weight
from koord.testing.containerd import Containerd
from koord.testing.koordlet import KoordletProcess
from koord.testing.kubelet import KubeletClient
from koord.testing.wait import wait_for

from .test_koordlet import TWO_GI, run_be_pod

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]


def test_be_pod_created_outside_the_proxy_is_limited_by_pleg(
        containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> None:
    koordlet = KoordletProcess(tmp_path / "koordlet", [
        "--runtime-hooks-reconcile-interval", "1h", "--kubelet-sync-interval", "1h",
        "--containerd-endpoint", "unix://" + containerd.endpoint]).start()
    try:
        wait_for(lambda: "PLEG: watching" in koordlet.logs(tail=400), "PLEG to watch the pod cgroups", 30)
        wait_for(lambda: "reconciler round" in koordlet.logs(tail=400), "the start-up reconcile round", 30)
        started = time.monotonic()
        sandbox, container = run_be_pod(kubelet, containerd.image)
        running = time.monotonic()
        parent = kubelet.pod_cgroup_parent(sandbox)
        be = Cgroup.of_container(parent, container)

        def limited() -> bool:
            return be.cpu_weight() == shares_to_weight(512) and be.cpu_max() == (50000, 100000)
        wait_for(limited, "the BE container's batch limits (only PLEG can trigger a round)", 30,
                 interval=0.01, tolerate=(OSError, ValueError))
        done = time.monotonic()
        print(f"BE pod limited {done - running:.3f} s after StartContainer returned "
              f"({done - started:.3f} s after RunPodSandbox was called)")
        assert be.memory_limit() == TWO_GI
        wait_for(lambda: Cgroup.of_pod(parent).cpu_weight() == shares_to_weight(512),
                 "the BE pod's own cgroup limits", 30, tolerate=(OSError, ValueError))
        logs = koordlet.logs(tail=2000)
        assert "ERROR" not in logs
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs()}")
    assert rc == 0
