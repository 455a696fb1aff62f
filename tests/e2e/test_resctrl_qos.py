"""Class-level resctrl (RdtResctrl) and the per-pod Resctrl hook in Standalone mode end to end:
real pods on containerd, their real thread ids, and a resctrl tree shaped like the kernel's
under a temporary sys-fs root (no machine here has RDT); the ResctrlCollector reading the
groups' monitoring files.

The tree stands in for the kernel only where no kernel is available: the groups' schemata,
the LSR/LS/BE group dirs and their ``tasks`` are what koordlet wrote.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from koord.apis.extension import ANNOTATION_RESCTRL
from koord.hookapi import FailurePolicy
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import Aggregation
from koord.koordlet.metriccache import kinds as k
from koord.koordlet.metricsadvisor.collectors.resctrl import ResctrlCollector
from koord.koordlet.metricsadvisor.config import AdvisorConfig
from koord.koordlet.metricsadvisor.framework import Env
from koord.koordlet.qosmanager import QOSConfig
from koord.koordlet.qosmanager.resctrl import ResctrlReconcile
from koord.koordlet.resctrlfs import parse_schemata
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.resctrl import Resctrl
from koord.koordlet.runtimehooks.reconciler import Reconciler
from koord_testing.cgroups import CGROUP_ROOT, Cgroup
from koord_testing.containerd import Containerd
from koord_testing.resctrltree import add_group_files, make_cpuinfo, make_resctrl_tree
from koord_testing.wait import wait_for

from .qos_rig import QOSRig, qos_rig  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def threads(cg: Cgroup) -> set[int]:
    return {int(t) for t in cg.read("cpu", "tasks", "cgroup.threads").split()}


def in_group(root: Path, group: str, *cgroups: Cgroup) -> set[int]:
    """The cgroups' threads as they are now, when all are in ``group`` (else empty). Read at
    each poll: right after StartContainer a container may still hold runc's init threads,
    which exit at its exec and are never moved."""
    now: set[int] = set().union(*(threads(cg) for cg in cgroups))
    return now if now and group_tasks(root, group) >= now else set()


def group_tasks(root: Path, group: str) -> set[int]:
    f = root / group / "tasks"
    return {int(t) for t in f.read_text().split()} if f.exists() else set()


def test_class_groups_get_masks_and_their_pods_tasks(qos_rig: QOSRig, containerd: Containerd,  # noqa: F811
                                                     tmp_path: Path) -> None:
    rig = qos_rig
    sys_fs, proc = tmp_path / "sys-fs", tmp_path / "proc"
    root = make_resctrl_tree(sys_fs, cbm="fff", cache_ids=(0, 1))
    make_cpuinfo(proc)
    be_sandbox, be_cid = rig.run_pod("be-pod", "besteffort", "BE", [])
    ls_sandbox, ls_cid = rig.run_pod("ls-pod", "burstable", "LS", [])
    hooked_sandbox, hooked_cid = rig.run_pod(
        "be-hooked", "besteffort", "BE", [], annotations={ANNOTATION_RESCTRL: '{"llc":{"schemata":{"range":[0,50]}}}'})
    rig.slo({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30,
                                                                "mbaPercent": 35}},
                                     "lsClass": {"resctrlQOS": {"enable": False}}}})
    qos = rig.start(QOSConfig(reconcile_interval=1.0, gates={"RdtResctrl": True}, sys_fs_root=sys_fs,
                              proc_root=proc), cri_endpoint=containerd.endpoint)
    be = Cgroup.of_container(rig.kubelet.pod_cgroup_parent(be_sandbox), be_cid)
    be_sandbox_cg = Cgroup.of_container(rig.kubelet.pod_cgroup_parent(be_sandbox), be_sandbox)
    ls = Cgroup.of_container(rig.kubelet.pod_cgroup_parent(ls_sandbox), ls_cid)
    hooked = Cgroup.of_container(rig.kubelet.pod_cgroup_parent(hooked_sandbox), hooked_cid)
    want_be = wait_for(lambda: in_group(root, "BE", be, be_sandbox_cg), "the BE pod's threads in the BE group", 30)
    print(f"BE group tasks {sorted(group_tasks(root, 'BE'))}; BE pod threads {sorted(want_be)}")
    assert (root / "BE" / "schemata").read_text() == "L3:0=f;1=f;\nMB:0=40;1=40;\n"
    assert parse_schemata((root / "LS" / "schemata").read_text()) == {"L3": {0: "fff", 1: "fff"},
                                                                      "MB": {0: "100", 1: "100"}}
    assert not (threads(ls) & group_tasks(root, "LS")), "a disabled class's pod was moved"
    assert not (threads(hooked) & group_tasks(root, "BE")), "a pod of the per-pod hook was moved"
    strategy = next(s for s in qos.strategies if isinstance(s, ResctrlReconcile))
    assert strategy.last is not None and [p.name for p in strategy.last] == ["LSR", "LS", "BE"]

    # A new BE pod's threads join on a later tick.
    new_sandbox, new_cid = rig.run_pod("be-late", "besteffort", "BE", [])
    late = Cgroup.of_container(rig.kubelet.pod_cgroup_parent(new_sandbox), new_cid)
    wait_for(lambda: in_group(root, "BE", late), "the late BE pod's threads in the BE group", 30)

    # The class switched off: full cache and bandwidth back.
    rig.slo({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": False}}}})
    wait_for(lambda: (root / "BE" / "schemata").read_text() == "L3:0=fff;1=fff;\nMB:0=100;1=100;\n",
             "BE group back to the full mask and 100", 30)

    # The collector reads what the kernel would report per group (the kernel makes
    # mon_data on mkdir; the fake tree gets it here).
    for group, llc in (("LSR", 1 << 20), ("LS", 2 << 20), ("BE", 3 << 20)):
        add_group_files(root / group, (0, 1), llc=llc, mbm=llc // 2)
    assert rig.cache is not None and rig.informer is not None and rig.executor is not None
    collector = ResctrlCollector(Env(AdvisorConfig(proc_root=proc, sys_fs_root=sys_fs, resctrl_collector=True),
                                     rig.informer, rig.cache, rig.executor))
    now = time.time()
    rig.cache.append(collector.collect(now))
    assert rig.cache.aggregate(k.RESCTRL_LLC, now - 1, now + 1, Aggregation.LAST,
                               {k.QOS: "BE", k.CACHE_ID: "1"}) == 3 << 20


@pytest.mark.cgroup
def test_class_groups_take_the_sandbox_of_pods_from_kubelet(qos_rig: QOSRig, containerd: Containerd,  # noqa: F811
                                                           tmp_path: Path) -> None:
    """Pods from kubelet's /pods carry no sandbox id: the sandbox's threads join all the same."""
    rig = qos_rig
    sys_fs, proc = tmp_path / "sys-fs", tmp_path / "proc"
    root = make_resctrl_tree(sys_fs, cbm="fff", cache_ids=(0, 1))
    make_cpuinfo(proc)
    sandbox, cid = rig.run_pod("be-pod", "besteffort", "BE", [])
    rig.slo({"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30}}}})
    rig.start(QOSConfig(reconcile_interval=1.0, gates={"RdtResctrl": True}, sys_fs_root=sys_fs, proc_root=proc))
    parent = rig.kubelet.pod_cgroup_parent(sandbox)
    container, sandbox_cg = Cgroup.of_container(parent, cid), Cgroup.of_container(parent, sandbox)
    wait_for(lambda: in_group(root, "BE", container), "the BE container's threads in the BE group", 30)
    wait_for(lambda: in_group(root, "BE", sandbox_cg), "the BE sandbox's threads in the BE group", 30)


@pytest.mark.cgroup
def test_pod_groups_in_standalone_mode(qos_rig: QOSRig, containerd: Containerd, tmp_path: Path) -> None:  # noqa: F811
    """The Resctrl hook without the proxy: reconciler rounds make an annotated pod's group, move
    its container's and sandbox's threads in, remove a group left by a pod gone before
    koordlet started, and the pod's own group once it stops."""
    rig = qos_rig
    sys_fs, proc = tmp_path / "sys-fs", tmp_path / "proc"
    root = make_resctrl_tree(sys_fs, cbm="fff", cache_ids=(0, 1))
    make_cpuinfo(proc)
    (root / "koordlet-gone-before-start").mkdir()
    hooked_sandbox, hooked_cid = rig.run_pod(
        "hooked", "besteffort", "BE", [], annotations={ANNOTATION_RESCTRL: '{"mb":{"schemata":{"percent":40}}}'})
    plain_sandbox, plain_cid = rig.run_pod("plain", "besteffort", "BE", [])
    executor = ResourceExecutor(CgroupLayout(CGROUP_ROOT, driver="cgroupfs", kube_dir=rig.kube))
    plugin = Resctrl(PluginEnv(executor, sys_fs, proc))
    plugin.update_rules(parse_rules(None, None))
    hooks = Hooks(FailurePolicy.IGNORE)
    plugin.register(hooks)
    reconciler = Reconciler(hooks, executor, [plugin], containerd.endpoint, interval=3600)
    uid = rig.kubelet.sandbox_configs[hooked_sandbox].metadata.uid
    group = f"koordlet-{uid}"
    parent = rig.kubelet.pod_cgroup_parent(hooked_sandbox)
    hooked = (Cgroup.of_container(parent, hooked_cid), Cgroup.of_container(parent, hooked_sandbox))
    try:
        def round_moved() -> set[int]:
            report = reconciler.reconcile_once()
            assert not report.errors, report.errors
            return in_group(root, group, *hooked)
        moved = wait_for(round_moved, "the hooked pod's container and sandbox threads in its group", 30)
        print(f"group {group} tasks {sorted(group_tasks(root, group))}; pod threads {sorted(moved)}")
        assert (root / group / "schemata").read_text() == "MB:0=40;1=40\n"
        assert not (root / "koordlet-gone-before-start").exists()
        plain_parent = rig.kubelet.pod_cgroup_parent(plain_sandbox)
        plain = threads(Cgroup.of_container(plain_parent, plain_cid))
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("koordlet-")) == [group]
        assert not plain & group_tasks(root, group)

        rig.kubelet.stop_pod(hooked_sandbox)
        reconciler.reconcile_once()
        assert not (root / group).exists()
    finally:
        reconciler.stop()
