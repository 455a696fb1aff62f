"""Class-level resctrl (RdtResctrl) and the resctrl collector on kernel-shaped fake trees:
upstream's mask and MBA tables, whole ticks, and what the kernel would refuse."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from koord.apis.extension import ANNOTATION_RESCTRL
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.metriccache import kinds as k
from koord.koordlet.metricsadvisor.collectors.resctrl import ResctrlCollector, ResctrlPrometheus
from koord.koordlet.metricsadvisor.config import AdvisorConfig
from koord.koordlet.metricsadvisor.framework import Env
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.qosmanager.resctrl import ResctrlReconcile
from koord.koordlet.resctrlfs import ResctrlError, l3_mask, mb_value, parse_schemata
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord_testing.pods import FakeStatesInformer
from koord_testing.resctrltree import RDT_FLAGS, add_group_files, make_cpuinfo, make_resctrl_tree

from .qos_fakes import pod


@pytest.mark.parametrize("cbm, start, end, want", [
    (0x101, 0, 100, None), (4, 0, 100, None), (0xff, -10, 100, None), (0xff, 30, 30, None),
    (0xff, 0, 100, "ff"), (0x3ff, 10, 80, "fe"), (0x7ff, 10, 50, "3c"), (0x3ff, 0, 30, "7"),
    (0x3ff, 10, 85, "1fe"), (0x7ff, 0, 30, "f"), (0xfff, 0, 30, "f"), (0xfff, 30, 100, "ff0"),
])
def test_l3_mask_upstream_table(cbm: int, start: int, end: int, want: str | None) -> None:
    if want is None:
        with pytest.raises(ResctrlError):
            l3_mask(cbm, start, end)
    else:
        assert l3_mask(cbm, start, end) == want


@pytest.mark.parametrize("percent, amd, want", [
    (85, False, 90), (80, False, 80), (100, False, 100), (1, False, 10),
    (80, True, int(0.8 * 25 * 8 * 0.8)), (100, True, 2048),
    (0, False, None), (101, False, None),
])
def test_mba_upstream_table(percent: int, amd: bool, want: int | None) -> None:
    if want is None:
        with pytest.raises(ResctrlError):
            mb_value(percent, amd)
    else:
        assert mb_value(percent, amd) == want


@given(st.text(max_size=300))
def test_schemata_parser_is_total(text: str) -> None:
    try:
        parsed = parse_schemata(text)
    except ResctrlError:
        return
    assert all(isinstance(i, int) for values in parsed.values() for i in values)


def slo(**classes: dict) -> dict:
    return {"spec": {"resourceQOSStrategy": {k_: {"resctrlQOS": v} for k_, v in classes.items()}}}


def rig(tmp_path: Path, informer: FakeStatesInformer, rdt: bool = True,
        **tree: object) -> tuple[ResctrlReconcile, Path]:
    sys_fs, proc, cgroup = tmp_path / "sys/fs", tmp_path / "proc", tmp_path / "cgroup"
    root = make_resctrl_tree(sys_fs, **tree)  # type: ignore[arg-type]
    if rdt:
        make_cpuinfo(proc)
    cgroup.mkdir()
    executor = ResourceExecutor(CgroupLayout(cgroup, driver="cgroupfs", version=1))
    qos = QOSManager(QOSConfig(gates={"RdtResctrl": True}, sys_fs_root=sys_fs, proc_root=proc),
                     informer, MetricCache(None), executor)
    strategy = next(s for s in qos.strategies if isinstance(s, ResctrlReconcile))
    assert strategy.enabled()
    return strategy, root


def cgroup_tasks(tmp_path: Path, cgroup_dir: str, tids: list[int]) -> None:
    d = tmp_path / "cgroup" / "cpu" / cgroup_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / "tasks").write_text("".join(f"{t}\n" for t in tids))


def test_upstream_policy_case_cbm_7ff_two_caches(tmp_path: Path) -> None:
    """Upstream reconcileRDTResctrlPolicy: cbm 7ff, two L3 caches; BE [0, 50) -> 3f, LS MBA 90."""
    informer = FakeStatesInformer([], slo(beClass={"enable": True, "catRangeEndPercent": 50},
                                          lsClass={"enable": True, "mbaPercent": 90}))
    strategy, root = rig(tmp_path, informer, cbm="7ff")
    strategy.run_once()
    assert parse_schemata((root / "BE" / "schemata").read_text())["L3"] == {0: "3f", 1: "3f"}
    assert (root / "LS" / "schemata").read_text() == "L3:0=7ff;1=7ff;\nMB:0=90;1=90;\n"
    assert (root / "LSR" / "schemata").read_text() == "L3:0=7ff;1=7ff;\nMB:0=100;1=100;\n"


def test_tick_moves_tasks_of_enabled_classes_and_disable_restores(tmp_path: Path) -> None:
    be = pod("be", "BE", "besteffort", containers=1)
    ls = pod("ls", "LS", containers=1)
    hooked = pod("hooked", "BE", "besteffort", containers=1,
                 annotations={ANNOTATION_RESCTRL: '{"llc":{"schemata":{"range":[0,50]}}}'})
    informer = FakeStatesInformer([be, ls, hooked], slo(beClass={"enable": True, "mbaPercent": 35}))
    strategy, root = rig(tmp_path, informer)
    cgroup_tasks(tmp_path, be.containers[0].cgroup_dir, [101, 102])
    cgroup_tasks(tmp_path, f"{be.cgroup_dir}/{be.sandbox_id}", [100])
    cgroup_tasks(tmp_path, ls.containers[0].cgroup_dir, [201])
    cgroup_tasks(tmp_path, hooked.containers[0].cgroup_dir, [301])
    strategy.run_once()
    assert (root / "BE" / "schemata").read_text() == "L3:0=f;1=f;\nMB:0=40;1=40;\n"
    assert sorted(int(t) for t in (root / "BE" / "tasks").read_text().split()) == [100, 101, 102]
    assert not (root / "LS" / "tasks").exists() or (root / "LS" / "tasks").read_text() == ""
    strategy.run_once()  # nothing new: no duplicate writes
    assert sorted(int(t) for t in (root / "BE" / "tasks").read_text().split()) == [100, 101, 102]

    informer.node_slo = slo(beClass={"enable": False})
    strategy.run_once()
    assert (root / "BE" / "schemata").read_text() == "L3:0=fff;1=fff;\nMB:0=100;1=100;\n"


@pytest.mark.parametrize("tree, section, error", [
    ({"min_cbm_bits": 4}, {"enable": True, "catRangeEndPercent": 20}, "fewer than min_cbm_bits 4"),
    ({"num_closids": 3}, {"enable": True}, "no CLOSID left"),
    ({"min_bandwidth": 20}, {"enable": True, "mbaPercent": 10}, "below min_bandwidth 20"),
    ({}, {"enable": True, "catRangeStartPercent": 50, "catRangeEndPercent": 40}, "not below"),
])
def test_refused_like_the_kernel_with_no_partial_state(tmp_path: Path, caplog, tree: dict, section: dict,
                                                       error: str) -> None:
    informer = FakeStatesInformer([], slo(beClass=section))
    strategy, root = rig(tmp_path, informer, **tree)
    with caplog.at_level(logging.ERROR):
        strategy.run_once()
    assert error in caplog.text
    assert not any((root / g).exists() for g in ("LSR", "LS", "BE")), "a group was created"


def test_cpu_without_mba_does_nothing(tmp_path: Path, caplog) -> None:
    make_cpuinfo(tmp_path / "proc", flags=("cat_l3",))
    strategy, root = rig(tmp_path, FakeStatesInformer([], slo(beClass={"enable": True})), rdt=False)
    with caplog.at_level(logging.INFO):
        strategy.run_once()
        strategy.run_once()
    assert caplog.text.count("lack mba") == 1
    assert not (root / "BE").exists()


def test_collector_reads_mon_data_into_cache_and_prometheus(tmp_path: Path) -> None:
    sys_fs, proc = tmp_path / "sys/fs", tmp_path / "proc"
    root = make_resctrl_tree(sys_fs)
    make_cpuinfo(proc)
    add_group_files(root / "BE", (0, 1), llc=3 << 20, mbm=1000)
    add_group_files(root / "LS", (0, 1), llc=5 << 20, mbm=7000)
    cache = MetricCache(None)
    config = AdvisorConfig(proc_root=proc, sys_fs_root=sys_fs, resctrl_collector=True)
    collector = ResctrlCollector(Env(config, FakeStatesInformer(), cache, CgroupExecutor(CgroupLayout(tmp_path))))
    assert collector.enabled()
    samples = collector.collect(1000.0)
    got = {(s.kind, tuple(sorted(s.labels.items()))): s.value for s in samples}
    assert got[(k.RESCTRL_LLC, (("cache_id", "1"), ("qos", "BE")))] == 3 << 20
    assert got[(k.RESCTRL_MB, (("cache_id", "0"), ("qos", "LS"), ("resctrl_mb_type", "mbm_total_bytes")))] == 14000
    assert len(samples) == 2 * 2 * 3  # two groups with mon_data, two caches, three files
    import time
    now = time.time()
    cache.append([s.__class__(s.kind, s.labels, now, s.value) for s in samples])
    registry = CollectorRegistry()
    registry.register(ResctrlPrometheus(cache, "node-a"))
    assert registry.get_sample_value("koordlet_resctrl_llc_occupancy",
                                     {"node": "node-a", "cache_id": "0", "qos": "LS"}) == 5 << 20
    assert registry.get_sample_value("koordlet_resctrl_memory_bandwidth",
                                     {"node": "node-a", "cache_id": "1", "qos": "BE",
                                      "mb_type": "mbm_local_bytes"}) == 1000


def test_collector_off_without_monitoring_flags(tmp_path: Path) -> None:
    make_resctrl_tree(tmp_path / "sys/fs")
    make_cpuinfo(tmp_path / "proc", flags=("cat_l3", "mba"))
    config = AdvisorConfig(proc_root=tmp_path / "proc", sys_fs_root=tmp_path / "sys/fs", resctrl_collector=True)
    env = Env(config, FakeStatesInformer(), MetricCache(None), CgroupExecutor(CgroupLayout(tmp_path)))
    assert list(ResctrlCollector(env).collect(1.0)) == []


@given(st.dictionaries(st.sampled_from(["enable", "catRangeStartPercent", "catRangeEndPercent", "mbaPercent", "x"]),
                       st.one_of(st.integers(-500, 500), st.booleans(), st.none(), st.text(max_size=4)),
                       max_size=5))
def test_resctrl_qos_parser_is_total(section: dict) -> None:
    from koord.koordlet.qosmanager.resourceqos import resctrl_qos
    from koord.koordlet.slo import SLOError

    try:
        q = resctrl_qos(slo(beClass=section), "BE")
    except SLOError:
        return
    assert 0 <= q.values["catRangeStartPercent"] < q.values["catRangeEndPercent"] <= 100
    assert 1 <= q.values["mbaPercent"] <= 100


@given(st.binary(max_size=400))
def test_cpuinfo_parser_is_total(tmp_path_factory, data: bytes) -> None:
    from koord.koordlet.resctrlfs import cpu_info

    proc = tmp_path_factory.mktemp("proc")
    (proc / "cpuinfo").write_bytes(data)
    info = cpu_info(proc)
    assert isinstance(info.flags, frozenset)


@pytest.mark.parametrize("name, sandbox_id, children, container_ids, want", [
    ("CRI source: by the sandbox id", "sb1", ["sb1"], True, [100, 101]),
    ("kubelet source: the child no container owns", "", ["sandbox-x"], True, [100, 101]),
    ("kubelet source: no other child", "", [], True, [101]),
    ("kubelet source: a container without id yet", "", ["sandbox-x"], False, []),
])
def test_pod_tasks_include_the_sandbox(tmp_path: Path, name: str, sandbox_id: str, children: list[str],
                                       container_ids: bool, want: list[int]) -> None:
    be = pod("be", "BE", "besteffort", containers=1)
    container = be.containers[0] if container_ids else dataclasses.replace(be.containers[0], id="", cgroup_dir="")
    be = dataclasses.replace(be, sandbox_id=sandbox_id, containers=(container,))
    informer = FakeStatesInformer([be], slo(beClass={"enable": True}))
    strategy, root = rig(tmp_path, informer)
    cgroup_tasks(tmp_path, f"{be.cgroup_dir}/be-c0", [101])
    for child in children:
        cgroup_tasks(tmp_path, f"{be.cgroup_dir}/{child}", [100])
    strategy.run_once()
    assert sorted(strategy.fs.tasks("BE")) == want


def fake_mount(tmp_path: Path, works: bool = True):
    def mount(target: Path) -> None:
        if not works:
            raise ResctrlError(f"mount -t resctrl resctrl {target}: No such device")
        make_resctrl_tree(target.parent)
    return mount


@pytest.mark.parametrize("name, cpu_flags, root_dir, works, want_groups, says", [
    ("not mounted: mounted, then used", RDT_FLAGS, True, True, True, "mounted resctrl at"),
    ("mount refused", RDT_FLAGS, True, False, False, "No such device; nothing is done"),
    ("no resctrl dir", RDT_FLAGS, False, True, False, "does not exist (a kernel without resctrl?)"),
    ("CPU without RDT", ("sse2",), True, True, False, "lack cat_l3 and mba"),
])
def test_mounts_resctrl_as_upstream(tmp_path: Path, caplog, name: str, cpu_flags: tuple, root_dir: bool,
                                    works: bool, want_groups: bool, says: str) -> None:
    strategy, root = rig(tmp_path, FakeStatesInformer([], slo(beClass={"enable": True})), rdt=False)
    shutil.rmtree(root)
    if root_dir:
        root.mkdir()
    make_cpuinfo(tmp_path / "proc", flags=cpu_flags)
    strategy.mount = fake_mount(tmp_path, works)
    with caplog.at_level(logging.INFO):
        strategy.run_once()
        strategy.run_once()
    assert (root / "BE").is_dir() == want_groups
    assert caplog.text.count(says) == 1
