"""Memory QoS (CgroupReconcile) end to end: real containerd pods under a private kube dir,
their specs from a kubelet ``/pods`` stand-in, the QoS manager writing the real memcg files.

Hierarchy-neutral: where the kernel has memory.min/low/high (cgroup v2, or v1 on Anolis)
the LS pod gets its class's values, the BE pod its class's from batch-memory, the kube-QoS
dirs the sums, and disabling the classes puts the kernel defaults back; elsewhere (plain
cgroup v1) koordlet says once that memory QoS is unsupported and writes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from koord.koordlet.qosmanager import QOSConfig
from koord_testing.cgroups import Cgroup
from koord_testing.wait import scaled, wait_for

from .qos_rig import QOSRig, qos_rig  # noqa: F401 (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]

MIB = 1 << 20
PAGE = 4096
ON = {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 80}


def memory_config_files(cg: Cgroup) -> dict[Path, str]:
    """Every readable and writable memory file of ``cg`` (what a write would change)."""
    out = {}
    base = cg.dir("memory")
    for f in sorted(base.iterdir()):
        if not f.is_file() or f.name in ("tasks", "cgroup.procs", "cgroup.threads"):
            continue
        mode = f.stat().st_mode
        if not mode & 0o200 or not mode & 0o400:
            continue
        try:
            out[f] = f.read_text()
        except OSError:  # write-only despite its mode (memory.force_empty)
            continue
    return out


def test_memory_qos_follows_the_classes(qos_rig: QOSRig, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    rig = qos_rig
    ls_sandbox, ls_cid = rig.run_pod(
        "ls-pod", "burstable", "LS", [], requests={"memory": "128Mi"}, limits={"memory": "256Mi"},
        resources={"memory_limit_in_bytes": 256 * MIB})
    be_sandbox, be_cid = rig.run_pod(
        "be-pod", "besteffort", "BE", [], requests={"kubernetes.io/batch-memory": "64Mi"})
    ls_parent = rig.kubelet.pod_cgroup_parent(ls_sandbox)
    be_parent = rig.kubelet.pod_cgroup_parent(be_sandbox)
    dirs = {
        "kubepods": Cgroup(rig.kube), "burstable": Cgroup(f"{rig.kube}/burstable"),
        "besteffort": Cgroup(f"{rig.kube}/besteffort"),
        "ls pod": Cgroup.of_pod(ls_parent), "ls container": Cgroup.of_container(ls_parent, ls_cid),
        "be pod": Cgroup.of_pod(be_parent), "be container": Cgroup.of_container(be_parent, be_cid),
    }
    supported = dirs["kubepods"].memory_qos() is not None
    before = {} if supported else {k: memory_config_files(cg) for k, cg in dirs.items()}
    rig.slo({"resourceQOSStrategy": {"lsClass": {"memoryQOS": ON}, "beClass": {"memoryQOS": ON}}})
    with caplog.at_level(logging.INFO):
        rig.start(QOSConfig(reconcile_interval=1.0, gates={"CgroupReconcile": True}))
        assert rig.informer is not None
        pods = wait_for(lambda: [p for p in rig.informer.get_all_pods() if p.containers[0].requests]
                        if len(rig.informer.get_all_pods()) == 2 else None,
                        "both pods listed with their requests by the kubelet source", 20)
        assert {p.containers[0].requests.get("memory") for p in pods} == {128 * MIB, None}
        if not supported:
            line = wait_for(lambda: [r.getMessage() for r in caplog.records
                                     if "memory QoS is unsupported" in r.getMessage()] or None,
                            "the one 'unsupported' line", 20)
            time.sleep(3)  # three more ticks
            lines = [r.getMessage() for r in caplog.records if "unsupported" in r.getMessage()]
            print(f"cgroup v{dirs['kubepods'].version}: {line[0]}")
            assert len(lines) == 1, lines
            after = {k: memory_config_files(cg) for k, cg in dirs.items()}
            assert after == before, "memory QoS wrote a file on a kernel without memory QoS"
            return

    # Node allocatable 4Gi; LS: request 128Mi, limit 256Mi; BE: batch request 64Mi, no limit.
    ls_high = (128 * MIB + (256 * MIB - 128 * MIB) * 80 // 100) // PAGE * PAGE
    be_high = (64 * MIB + (4096 * MIB - 64 * MIB) * 80 // 100) // PAGE * PAGE
    want = {
        "ls container": {"min": 64 * MIB, "low": 128 * MIB * 80 // 100 // PAGE * PAGE, "high": ls_high},
        "ls pod": {"min": 64 * MIB, "low": 128 * MIB * 80 // 100 // PAGE * PAGE, "high": -1},
        "be container": {"min": 32 * MIB, "low": 64 * MIB * 80 // 100 // PAGE * PAGE, "high": be_high},
        "be pod": {"min": 32 * MIB, "low": 64 * MIB * 80 // 100 // PAGE * PAGE, "high": -1},
        "burstable": {"min": 64 * MIB, "low": 128 * MIB * 80 // 100 // PAGE * PAGE},
        "besteffort": {"min": 32 * MIB, "low": 64 * MIB * 80 // 100 // PAGE * PAGE},
        "kubepods": {"min": 96 * MIB, "low": (128 * MIB * 80 // 100 + 64 * MIB * 80 // 100) // PAGE * PAGE},
    }

    def current() -> dict[str, dict[str, int]]:
        got = {}
        for key, cg in dirs.items():
            values = cg.memory_qos() or {}
            got[key] = {k: v for k, v in values.items() if k in want[key]}
        return got

    def settle(expected: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        deadline = time.monotonic() + scaled(30)
        while (got := current()) != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got == expected
        return got

    got = settle(want)
    print(f"cgroup v{dirs['kubepods'].version}, enabled: {got}")

    rig.slo({"resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": False}},
                                     "beClass": {"memoryQOS": {"enable": False}}}})
    defaults = {key: {k: (-1 if k == "high" else 0) for k in w} for key, w in want.items()}
    got = settle(defaults)
    print(f"disabled: {got}")
    assert os.path.isdir(dirs["ls container"].dir("memory"))
