"""CgroupReconcile (memory QoS): upstream's calculateResources table, the NodeSLO and
annotation merge, and whole ticks on cgroup v2- and v1-shaped fake trees."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.apis.extension import ANNOTATION_POD_MEMORY_QOS
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.qosmanager.memoryqos import CgroupReconcile, calculate, memory_qos_classes
from koord.koordlet.qosmanager.resourceqos import NONE_MEMORY_QOS, memory_qos, pod_memory_qos_config
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord.koordlet.runtimehooks.protocol import KubeQoS
from koord.koordlet.slo import SLOError
from koord_testing.pods import FakeStatesInformer, with_resources

from .qos_fakes import GI, pod

MAX = (1 << 63) - 1
QOS_DIRS = {KubeQoS.GUARANTEED: "kubepods", KubeQoS.BURSTABLE: "kubepods/burstable",
            KubeQoS.BESTEFFORT: "kubepods/besteffort"}


def slo(**classes: dict) -> dict:
    return {"spec": {"resourceQOSStrategy": {k: {"memoryQOS": v} for k, v in classes.items()}}}


def upstream_pod(kube_qos: str, koord_qos: str, annotation: dict | None = None):
    """upstream's MockTestPodWithQOS: container "test" with nothing, "main" with 1Gi
    request = limit (batch-memory for BE)."""
    key = "kubernetes.io/batch-memory" if koord_qos == "BE" else "memory"
    p = pod("test_pod", koord_qos, kube_qos, containers=2,
            annotations=None if annotation is None else {ANNOTATION_POD_MEMORY_QOS: json.dumps(annotation)})
    return with_resources(p, 1, requests={key: GI}, limits={key: GI})


def values(updates) -> dict[tuple[str, str], int | str]:
    return {(u.cgroup_dir, u.resource): u.value for u in updates}


def test_single_pod_with_node_level_defaults() -> None:
    """Upstream "single pod using node-level config": everything 0, high max, wmarks static."""
    p = upstream_pod("burstable", "LS")
    levels = calculate(memory_qos_classes(slo(lsClass={"enable": True})), [p], GI, QOS_DIRS)
    got = values(levels.qos)
    for d in QOS_DIRS.values():
        assert got[(d, "memory_min")] == 0 and got[(d, "memory_low")] == 0
        assert got[(d, "memory_priority")] == 0 and got[(d, "memory_oom_group")] == 0
    pods = values(levels.pods)
    assert pods[(p.cgroup_dir, "memory_min")] == 0
    assert pods[(p.cgroup_dir, "memory_wmark_ratio")] == 95
    assert pods[(p.cgroup_dir, "memory_wmark_scale_factor")] == 20
    assert (p.cgroup_dir, "memory_high") not in pods, "pods get no memory.high"
    containers = values(levels.containers)
    for c in p.containers:
        assert containers[(c.cgroup_dir, "memory_high")] == MAX
        assert containers[(c.cgroup_dir, "memory_min")] == 0


def test_single_be_pod_with_pod_level_auto_config() -> None:
    """Upstream "single pod using pod-level config": policy auto, min 100%, throttling 80%,
    node allocatable 1Gi."""
    p = upstream_pod("besteffort", "BE", {"policy": "auto", "minLimitPercent": 100, "lowLimitPercent": 0,
                                          "throttlingPercent": 80, "wmarkRatio": 95,
                                          "wmarkScalePermill": 20, "wmarkMinAdj": 50})
    levels = calculate(memory_qos_classes(slo()), [p], GI, QOS_DIRS)
    qos = values(levels.qos)
    assert qos[("kubepods", "memory_min")] == GI
    assert qos[("kubepods", "memory_low")] == 0
    assert qos[("kubepods/besteffort", "memory_min")] == GI
    assert qos[("kubepods/burstable", "memory_min")] == 0
    pods = values(levels.pods)
    assert pods[(p.cgroup_dir, "memory_min")] == GI
    assert pods[(p.cgroup_dir, "memory_wmark_min_adj")] == 50
    c0, c1 = p.containers
    containers = values(levels.containers)
    assert containers[(c0.cgroup_dir, "memory_min")] == 0
    assert containers[(c0.cgroup_dir, "memory_high")] == (GI * 80 // 100) // 4096 * 4096
    assert containers[(c1.cgroup_dir, "memory_min")] == GI
    assert containers[(c1.cgroup_dir, "memory_high")] == GI


def test_multiple_pods_with_ls_disabled() -> None:
    """Upstream "multiple pods": the LS class disabled, a BE pod on auto: only the BE pod's
    request counts at the QoS levels."""
    ls = replace(upstream_pod("burstable", "LS"), uid="ls", cgroup_dir="kubepods/burstable/podls")
    be = upstream_pod("besteffort", "BE", {"policy": "auto", "minLimitPercent": 100,
                                           "throttlingPercent": 80})
    classes = memory_qos_classes(slo(lsClass={"enable": False, "minLimitPercent": 50}))
    levels = calculate(classes, [ls, be], GI, QOS_DIRS)
    qos = values(levels.qos)
    assert qos[("kubepods", "memory_min")] == GI
    assert qos[("kubepods/burstable", "memory_min")] == 0
    assert qos[("kubepods/besteffort", "memory_min")] == GI
    pods = values(levels.pods)
    assert pods[(ls.cgroup_dir, "memory_min")] == 0
    assert pods[(ls.cgroup_dir, "memory_wmark_ratio")] == NONE_MEMORY_QOS["wmarkRatio"]


@pytest.mark.parametrize("request_, limit, pct, allocatable, want_high", [
    (GI, 2 * GI, 80, 8 * GI, (GI + GI * 80 // 100) // 4096 * 4096),  # with a limit
    (GI, -1, 50, 4 * GI, (GI + 3 * GI // 2) // 4096 * 4096),          # no limit: node allocatable
    (GI, 2 * GI, 0, 8 * GI, MAX),                                       # 0: max
    (100 * 1024 * 1024 + 4097, 200 * 1024 * 1024, 50, GI, 157286400),  # 157288448 floored to a page
])
def test_memory_high_formula(request_: int, limit: int, pct: int, allocatable: int, want_high: int) -> None:
    p = with_resources(pod("p", "LS", containers=1), requests={"memory": request_},
                       limits={"memory": limit} if limit > 0 else None)
    classes = memory_qos_classes(slo(lsClass={"enable": True, "throttlingPercent": pct}))
    levels = calculate(classes, [p], allocatable, QOS_DIRS)
    assert values(levels.containers)[(p.containers[0].cgroup_dir, "memory_high")] == want_high


def test_low_and_high_at_least_min() -> None:
    p = with_resources(pod("p", "LS", containers=1), requests={"memory": GI}, limits={"memory": GI})
    levels = calculate(memory_qos_classes(slo(lsClass={"enable": True, "minLimitPercent": 80, "lowLimitPercent": 50,
                                    "throttlingPercent": 10})), [p], 4 * GI, QOS_DIRS)
    c = values(levels.containers)
    d = p.containers[0].cgroup_dir
    assert c[(d, "memory_min")] == GI * 80 // 100
    assert c[(d, "memory_low")] == GI * 80 // 100
    assert c[(d, "memory_high")] == GI  # request + 0 x 10%, page aligned, >= min


def test_policy_none_opts_out_and_stopped_pods_do_not_count() -> None:
    on = {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 100}
    a = with_resources(pod("a", "LS", containers=1), requests={"memory": GI})
    b = with_resources(pod("b", "LS", containers=1, annotations={ANNOTATION_POD_MEMORY_QOS: '{"policy":"none"}'}),
                       requests={"memory": GI})
    c = with_resources(pod("c", "LS", containers=1, running=False), requests={"memory": GI})
    levels = calculate(memory_qos_classes(slo(lsClass=on)), [a, b, c], 4 * GI, QOS_DIRS)
    assert values(levels.qos)[("kubepods/burstable", "memory_min")] == GI
    assert values(levels.pods)[(b.cgroup_dir, "memory_min")] == 0
    assert not [u for u in levels.pods if u.cgroup_dir == c.cgroup_dir]


@pytest.mark.parametrize("section, error", [
    ({"enable": True, "wmarkRatio": 101}, "wmarkRatio=101"),
    ({"enable": True, "wmarkMinAdj": -51}, "wmarkMinAdj=-51"),
    ({"enable": "yes"}, "enable='yes'"),
    ({"enable": True, "minLimitPercent": True}, "minLimitPercent=True"),
])
def test_out_of_range_nodeslo_is_refused_naming_the_field(section: dict, error: str) -> None:
    """Upstream's "mixed config" values (101, -51, 53): refused with the field named."""
    with pytest.raises(SLOError, match=error):
        memory_qos(slo(lsrClass=section), "LSR")


@pytest.mark.parametrize("text, error", [
    ('{"policy":"sometimes"}', "policy="),
    ('{"minLimitPercent":200}', "minLimitPercent=200"),
    ('[1]', "want a JSON object"),
    ('{', "bad JSON"),
])
def test_bad_annotation_names_the_pod(text: str, error: str) -> None:
    p = pod("p", "LS", annotations={ANNOTATION_POD_MEMORY_QOS: text})
    with pytest.raises(SLOError, match=error) as info:
        pod_memory_qos_config(p)
    assert "pod default/p" in str(info.value)


@given(st.text(max_size=200))
def test_annotation_parser_never_crashes(text: str) -> None:
    p = pod("p", "LS", annotations={ANNOTATION_POD_MEMORY_QOS: text})
    try:
        pod_memory_qos_config(p)
    except SLOError:
        pass


@given(st.dictionaries(st.sampled_from(["enable", "minLimitPercent", "throttlingPercent", "priority",
                                        "wmarkScalePermill", "other"]),
                       st.one_of(st.integers(-2000, 2000), st.booleans(), st.none(), st.text(max_size=5)),
                       max_size=6))
def test_nodeslo_parser_is_total(section: dict) -> None:
    try:
        q = memory_qos(slo(lsClass=section), "LS")
    except SLOError:
        return
    assert set(q.values) == set(NONE_MEMORY_QOS)


# ---- whole ticks on fake trees -----------------------------------------------------------

V2_FILES = {"memory.min": "0", "memory.low": "0", "memory.high": "max", "memory.oom.group": "0",
            "memory.max": "max"}


def make_tree(root: Path, dirs: list[str], version: int, files: dict[str, str]) -> None:
    if version == 2:
        (root / "cgroup.controllers").write_text("cpu memory\n")
    for d in dirs:
        base = root / d if version == 2 else root / "memory" / d
        base.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (base / name).write_text(value + "\n")


def manager(tmp_path: Path, informer: FakeStatesInformer, version: int) -> tuple[QOSManager, CgroupReconcile]:
    executor = ResourceExecutor(CgroupLayout(tmp_path, driver="cgroupfs", version=version))
    qos = QOSManager(QOSConfig(gates={"CgroupReconcile": True}), informer, MetricCache(None), executor)
    strategy = next(s for s in qos.strategies if isinstance(s, CgroupReconcile))
    assert strategy.enabled()
    return qos, strategy


NODE = {"status": {"allocatable": {"memory": "4Gi"}, "capacity": {"memory": "4Gi"}}}


def test_v2_tree_gets_min_low_high_and_restores_on_disable(tmp_path: Path) -> None:
    ls = with_resources(pod("ls", "LS", containers=1), requests={"memory": 256 << 20}, limits={"memory": 512 << 20})
    be = with_resources(pod("be", "BE", "besteffort", containers=1),
                        requests={"kubernetes.io/batch-memory": 128 << 20})
    dirs = list(QOS_DIRS.values()) + [ls.cgroup_dir, ls.containers[0].cgroup_dir,
                                      be.cgroup_dir, be.containers[0].cgroup_dir]
    make_tree(tmp_path, dirs, 2, V2_FILES)
    on = {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 80}
    informer = FakeStatesInformer([ls, be], slo(lsClass=on, beClass=on), NODE)
    _, strategy = manager(tmp_path, informer, 2)
    strategy.run_once()

    def read(d: str, f: str) -> str:
        return (tmp_path / d / f).read_text().strip()

    lc = ls.containers[0].cgroup_dir
    assert read(lc, "memory.min") == str(128 << 20)
    assert read(lc, "memory.low") == str((256 << 20) * 80 // 100)
    assert read(lc, "memory.high") == str(((256 << 20) + (256 << 20) * 80 // 100) // 4096 * 4096)
    assert read(ls.cgroup_dir, "memory.min") == str(128 << 20)
    assert read(ls.cgroup_dir, "memory.high") == "max"
    bc = be.containers[0].cgroup_dir
    assert read(bc, "memory.min") == str(64 << 20)
    # no batch-memory limit: node allocatable (4Gi)
    assert read(bc, "memory.high") == str(((128 << 20) + ((4 << 30) - (128 << 20)) * 80 // 100) // 4096 * 4096)
    assert read("kubepods/burstable", "memory.min") == str(128 << 20)
    assert read("kubepods/besteffort", "memory.min") == str(64 << 20)
    assert read("kubepods", "memory.min") == str(192 << 20)

    informer.node_slo = slo(lsClass={"enable": False}, beClass={"enable": False})
    strategy.ctx.executor._cache.clear()
    strategy.run_once()
    for d in dirs:
        assert read(d, "memory.min") == "0", d
        assert read(d, "memory.low") == "0", d
        assert read(d, "memory.high") == "max", d


def test_v1_without_anolis_files_logs_once_and_writes_nothing(tmp_path: Path, caplog) -> None:
    p = with_resources(pod("p", "LS", containers=1), requests={"memory": GI})
    dirs = list(QOS_DIRS.values()) + [p.cgroup_dir, p.containers[0].cgroup_dir]
    make_tree(tmp_path, dirs, 1, {"memory.limit_in_bytes": "9223372036854771712"})
    before = {f: f.read_text() for f in tmp_path.rglob("*") if f.is_file()}
    informer = FakeStatesInformer([p], slo(lsClass={"enable": True, "minLimitPercent": 100}), NODE)
    _, strategy = manager(tmp_path, informer, 1)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            strategy.run_once()
    lines = [r.getMessage() for r in caplog.records if "unsupported" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "memory QoS is unsupported" in lines[0] and "cgroup v1 without an Anolis kernel" in lines[0]
    assert {f: f.read_text() for f in tmp_path.rglob("*") if f.is_file()} == before


def test_v1_anolis_tree_gets_every_file(tmp_path: Path) -> None:
    anolis = {"memory.min": "0", "memory.low": "0", "memory.high": "9223372036854771712",
              "memory.wmark_ratio": "0", "memory.wmark_scale_factor": "50", "memory.wmark_min_adj": "0",
              "memory.priority": "0", "memory.use_priority_oom": "0", "memory.oom.group": "0"}
    p = with_resources(pod("p", "LSR", "guaranteed", containers=1), requests={"memory": GI}, limits={"memory": GI})
    dirs = list(QOS_DIRS.values()) + [p.cgroup_dir, p.containers[0].cgroup_dir]
    make_tree(tmp_path, dirs, 1, anolis)
    informer = FakeStatesInformer([p], slo(lsrClass={"enable": True, "minLimitPercent": 100,
                                                      "priorityEnable": 1, "priority": 6}), NODE)
    _, strategy = manager(tmp_path, informer, 1)
    strategy.run_once()
    c = tmp_path / "memory" / p.containers[0].cgroup_dir
    assert (c / "memory.min").read_text().strip() == str(GI)
    assert (c / "memory.wmark_ratio").read_text().strip() == "95"
    assert (c / "memory.wmark_min_adj").read_text().strip() == "-25"
    assert (c / "memory.priority").read_text().strip() == "6"
    assert (tmp_path / "memory/kubepods/memory.use_priority_oom").read_text().strip() == "1"
