"""OOMScoreAdj: upstream's helper_test tables (annotation parsing, per-pid writes) and the
plugin over a fake cgroup tree and a fake /proc."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from koord.apis.extension import ANNOTATION_OOM_SCORE_ADJ as ADJ
from koord.apis.extension import ANNOTATION_OOM_SCORE_ADJ_SPEC as ADJ_SPEC
from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, InvalidInput, PluginEnv
from koord.koordlet.runtimehooks.plugins.oomscoreadj import (
    OOMScoreAdj,
    OOMScoreAdjGauge,
    oom_score_adj_for,
    set_oom_score_adj,
)
from koord.koordlet.runtimehooks.protocol import ContainerContext, ContainerRequest, HookPodMeta

PARENT = "kubepods/burstable/pod1"


@pytest.mark.parametrize("name, annotations, container, want", [
    ("nil annotations", {}, "c1", None),
    ("no oom score adj annotations", {"other": "1"}, "c1", None),
    ("pod-level default applied", {ADJ: "500"}, "c1", 500),
    ("container spec overrides pod-level default", {ADJ: "500", ADJ_SPEC: '{"c1": -100}'},
     "c1", -100),
    ("container not in spec falls back to pod-level default",
     {ADJ: "500", ADJ_SPEC: '{"c2": -100}'}, "c1", 500),
    ("container not in spec and no pod-level default", {ADJ_SPEC: '{"c2": -100}'}, "c1", None),
])
def test_oom_score_adj_for(name, annotations, container, want) -> None:
    assert oom_score_adj_for(annotations, container) == want


@pytest.mark.parametrize("name, annotations, field", [
    ("invalid spec JSON", {ADJ_SPEC: "{bad"}, ADJ_SPEC),
    ("invalid pod-level default value", {ADJ: "abc"}, ADJ),
    ("pod default out of range", {ADJ: "1001"}, ADJ),
    ("spec value out of range", {ADJ_SPEC: '{"c1": -1001}'}, ADJ_SPEC),
    ("spec value not an integer", {ADJ_SPEC: '{"c1": "5"}'}, ADJ_SPEC),
    ("spec not an object", {ADJ_SPEC: "[1]"}, ADJ_SPEC),
])
def test_bad_annotations_name_the_annotation(name, annotations, field) -> None:
    with pytest.raises(InvalidInput, match=field):
        oom_score_adj_for(annotations, "c1")


@given(st.text(max_size=20), st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5) |
                                             st.booleans(), max_size=3))
def test_any_annotation_is_a_value_in_range_or_a_named_error(default: str, spec: dict) -> None:
    try:
        value = oom_score_adj_for({ADJ: default, ADJ_SPEC: json.dumps(spec)}, "c")
    except InvalidInput as exc:
        assert "oom-score-adj" in str(exc)
        return
    assert value is None or -1000 <= value <= 1000


def fake_proc(root: Path, values: dict[int, str]) -> Path:
    for pid, value in values.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "oom_score_adj").write_text(value + "\n")
    return root


def adj(root: Path, pid: int) -> int:
    return int((root / str(pid) / "oom_score_adj").read_text())


# upstream's Test_setOOMScoreAdjForPIDs: (updated, skipped)
@pytest.mark.parametrize("name, values, pids, want_updated, want_refused", [
    ("no pid", {}, [], 0, 0),
    ("all pids updated", {1: "0", 2: "0"}, [1, 2], 2, 0),
    ("diff-aware skips matched pid", {1: "300", 2: "0"}, [1, 2], 1, 0),
    ("error pid skipped without blocking others", {1: "x", 2: "0"}, [1, 2], 1, 1),
    ("exited pid skipped silently", {2: "0"}, [1, 2], 1, 0),
])
def test_set_oom_score_adj(tmp_path: Path, name, values, pids, want_updated, want_refused) -> None:
    root = fake_proc(tmp_path / "proc", values)
    updated, refused = set_oom_score_adj(root, pids, 300)
    assert (updated, len(refused)) == (want_updated, want_refused)
    assert all(adj(root, p) == 300 for p in pids if p in values and values[p] != "x")


def run(tmp_path: Path, annotations: dict, pids: list[int], stage: HookPoint, container_id: str = "cid",
        name: str = "c1") -> Path:
    procs = tmp_path / "cgroup" / "cpu" / PARENT / "cid" / "cgroup.procs"
    procs.parent.mkdir(parents=True, exist_ok=True)
    procs.write_text("".join(f"{p}\n" for p in pids))
    proc = tmp_path / "proc"
    h = Hooks(FailurePolicy.FAIL)
    OOMScoreAdj(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup", version=1)), tmp_path, proc)).register(h)
    h.run(stage, ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name=name, container_id=container_id,
        pod_annotations=annotations, pod_cgroup_parent="/" + PARENT)))
    return proc


@pytest.mark.parametrize("stage", [HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER])
def test_every_process_of_the_container_gets_the_value(tmp_path: Path, stage: HookPoint) -> None:
    fake_proc(tmp_path / "proc", {10: "0", 11: "0", 12: "0"})
    proc = run(tmp_path, {ADJ: "200", ADJ_SPEC: '{"c1": 700}'}, [10, 11], stage)
    assert (adj(proc, 10), adj(proc, 11), adj(proc, 12)) == (700, 700, 0)


def test_a_container_being_created_has_no_process_yet(tmp_path: Path) -> None:
    fake_proc(tmp_path / "proc", {10: "0"})
    proc = run(tmp_path, {ADJ: "200"}, [10], HookPoint.PRE_CREATE_CONTAINER, container_id="")
    assert adj(proc, 10) == 0


def test_refusal_is_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    fake_proc(tmp_path / "proc", {10: "0"})

    def refuse(self: Path, text: str) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse, raising=True)
    procs = tmp_path / "cgroup" / "cpu" / PARENT / "cid" / "cgroup.procs"
    procs.parent.mkdir(parents=True)
    procs.parent.joinpath("cgroup.procs").open("w").write("10\n")
    h = Hooks(FailurePolicy.FAIL)
    OOMScoreAdj(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup", version=1)), tmp_path,
                          tmp_path / "proc")).register(h)
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            h.run(HookPoint.POST_START_CONTAINER, ContainerContext(ContainerRequest(
                pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name="c1", container_id="cid",
                pod_annotations={ADJ: "-500"}, pod_cgroup_parent="/" + PARENT)))
    refusals = [r for r in caplog.records if "refused oom_score_adj -500" in r.message]
    assert len(refusals) == 1 and "CAP_SYS_RESOURCE" in refusals[0].message


CONTAINER = {"node": "n1", "pod_namespace": "ns", "pod_name": "p", "pod_uid": "1", "container_name": "c1"}


@pytest.mark.parametrize("refuse, want", [(False, 700.0), (True, None)])
def test_the_value_a_containers_processes_hold_is_exported_as_upstreams_gauge(
        tmp_path: Path, monkeypatch, refuse: bool, want: float | None) -> None:
    fake_proc(tmp_path / "proc", {10: "0"})
    if refuse:
        def refused(self: Path, text: str) -> int:
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(Path, "write_text", refused, raising=True)
    procs = tmp_path / "cgroup" / "cpu" / PARENT / "cid" / "cgroup.procs"
    procs.parent.mkdir(parents=True, exist_ok=True)
    with procs.open("w") as f:
        f.write("10\n")
    registry = CollectorRegistry()
    h = Hooks(FailurePolicy.FAIL)
    env = PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup", version=1)), tmp_path, tmp_path / "proc",
                    registry=registry, node="n1")
    OOMScoreAdj(env).register(h)
    h.run(HookPoint.POST_START_CONTAINER, ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="1"), container_name="c1", container_id="cid",
        pod_annotations={ADJ: "700"}, pod_cgroup_parent="/" + PARENT)))
    assert registry.get_sample_value("koordlet_container_oom_score_adj", CONTAINER) == want


@pytest.mark.parametrize("set_at, scraped_at, want", [
    ((0.0,), 299.0, 5.0),
    ((0.0,), 300.0, None),  # not refreshed for five minutes: gone, as upstream's expiring gauge
    ((0.0, 200.0), 450.0, 5.0),  # each set refreshes it
])
def test_a_series_not_refreshed_expires(set_at: tuple[float, ...], scraped_at: float, want: float | None) -> None:
    now = [0.0]
    gauge, registry = OOMScoreAdjGauge("n1", clock=lambda: now[0]), CollectorRegistry()
    registry.register(gauge)
    for t in set_at:
        now[0] = t
        gauge.set("ns", "p", "1", "c1", 5)
    now[0] = scraped_at
    assert registry.get_sample_value("koordlet_container_oom_score_adj", CONTAINER) == want
