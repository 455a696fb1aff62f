"""PLEG end to end: a BE pod created on containerd directly (no proxy, so no hook ran) gets
its batch limits from Standalone koordlet at once, not at the next poll, and still does
after a hundred pods came and went.

Both polls are set to an hour, so only PLEG can explain the limits being written while the
test runs; the latency from StartContainer to the limits is printed, not asserted (the
deadline only bounds a hung test)."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

import pytest

from koord.koordlet.pleg import BURST, RATE_PER_SECOND
from koord_testing import klogparse
from koord_testing.cgroups import Cgroup, hierarchies, pod_dir, remove_tree, shares_to_weight
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient, pod_cgroup_parent
from koord_testing.wait import wait_for

from .test_koordlet import BATCH_SPEC, EXTENDED_SPEC, QOS, TWO_GI, run_be_pod

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
        assert not klogparse.error_lines(logs)
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs()}")
    assert rc == 0


def test_a_container_a_round_saw_before_it_started_gets_its_limits_once_it_runs(
        containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> None:
    """kubelet creates a container, then starts it; a round PLEG asks for in between (here
    another pod's sandbox) lists it created, with no cgroup yet. When it starts, runc makes
    the cgroup (PLEG asks for a round at once) and then writes the spec's resources into
    it, maybe after that round wrote ours: the limits must be there once it runs."""
    koordlet = KoordletProcess(tmp_path / "koordlet", [
        "--runtime-hooks-reconcile-interval", "1h", "--kubelet-sync-interval", "1h",
        "--containerd-endpoint", "unix://" + containerd.endpoint]).start()
    try:
        wait_for(lambda: "PLEG: watching" in koordlet.logs(tail=400), "PLEG to watch the pod cgroups", 30)
        sandbox = kubelet.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                                  annotations={EXTENDED_SPEC: BATCH_SPEC}, qos="besteffort")
        container = kubelet.create_container(sandbox, "main", containerd.image, resources={"cpu_shares": 2})
        kubelet.run_pod(f"other-{uuid.uuid4().hex[:6]}", qos="besteffort")
        wait_for(lambda: re.search(r"reconciler round: \d+ pods, 1 containers", koordlet.logs(tail=400)),
                 "a round that lists the created container", 30)
        kubelet.start_container(container)
        be = Cgroup.of_container(kubelet.pod_cgroup_parent(sandbox), container)

        def limited() -> bool:
            return be.cpu_weight() == shares_to_weight(512) and be.cpu_max() == (50000, 100000)
        wait_for(limited, "the BE container's batch limits once it runs", 30,
                 interval=0.01, tolerate=(OSError, ValueError))
        assert be.memory_limit() == TWO_GI
        assert not klogparse.error_lines(koordlet.logs(tail=2000))
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs()}")
    assert rc == 0


def _inotify_watches(pid: int) -> int:
    """The watches the kernel holds for the process's inotify descriptors (PLEG's and the
    file watcher's), from ``/proc/<pid>/fdinfo``: one ``inotify wd:`` line each."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                count += sum(line.startswith("inotify wd:") for line in info)
        except OSError:  # closed meanwhile
            continue
    return count


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_churn_of_100_pods_leaves_no_watches_and_the_next_pod_is_still_limited_at_once(
        containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> None:
    """100 BE pods with a container each appear and go within a few seconds in the real
    cgroup hierarchies, as a crash-looping job makes them: koordlet's watches of them are
    all gone afterwards (counted by the kernel), its PLEG-triggered reconcile rounds stay
    within the rate limit (no backlog of rounds), its memory does not grow with the churn,
    and a BE pod made after the churn is still limited without waiting for a poll."""
    for hierarchy in hierarchies():  # kubelet makes its QoS dirs before any pod
        (hierarchy / "kubepods/besteffort").mkdir(parents=True, exist_ok=True)
    koordlet = KoordletProcess(tmp_path / "koordlet", [
        "--runtime-hooks-reconcile-interval", "1h", "--kubelet-sync-interval", "1h",
        "--containerd-endpoint", "unix://" + containerd.endpoint]).start()
    rels = [pod_dir(pod_cgroup_parent("besteffort", str(uuid.uuid4()))) for _ in range(100)]
    try:
        wait_for(lambda: "PLEG: watching" in koordlet.logs(tail=400), "PLEG to watch the pod cgroups", 30)
        wait_for(lambda: "reconciler round" in koordlet.logs(tail=400), "the start-up reconcile round", 30)
        watches, rss = _inotify_watches(koordlet.pid), _rss_kib(koordlet.pid)
        rounds = koordlet.logs(tail=100000).count("reconciler round")
        started = time.monotonic()
        for rel in rels:
            for hierarchy in hierarchies():
                (hierarchy / rel / "c0ffee").mkdir(parents=True)
            time.sleep(0.02)
        for rel in rels:
            assert not remove_tree(rel), f"{rel} stayed"
        churned = time.monotonic() - started
        print(f"100 pods made and removed in {churned:.2f} s; koordlet held {watches} watches "
              f"and {rss} KiB before")
        wait_for(lambda: _inotify_watches(koordlet.pid) == watches,
                 f"koordlet's inotify watches back at {watches}", 30, interval=0.2)
        time.sleep(1.5)  # the rate limiter's last round and its follow-up
        settled = time.monotonic() - started
        churn_rounds = koordlet.logs(tail=100000).count("reconciler round") - rounds
        print(f"watches back after {settled:.2f} s; {churn_rounds} reconcile rounds; "
              f"RSS {rss} -> {_rss_kib(koordlet.pid)} KiB")
        assert 1 <= churn_rounds <= BURST + RATE_PER_SECOND * settled + 1
        assert _rss_kib(koordlet.pid) - rss < 8 * 1024, "koordlet's memory grew with the churn"

        sandbox, container = run_be_pod(kubelet, containerd.image)
        running = time.monotonic()
        be = Cgroup.of_container(kubelet.pod_cgroup_parent(sandbox), container)
        wait_for(lambda: be.cpu_max() == (50000, 100000), "the BE container's batch limits after the churn",
                 30, interval=0.01, tolerate=(OSError, ValueError))
        print(f"BE pod after the churn limited {time.monotonic() - running:.3f} s after StartContainer returned")
        logs = koordlet.logs(tail=100000)
        assert not klogparse.error_lines(logs) and "Traceback" not in logs
    finally:
        for rel in rels:
            remove_tree(rel)
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs(tail=40)}")
    assert rc == 0
