"""The reconciler takes a running pod's labels and annotations from the pods source (the
states informer's list) when it knows the pod, CRI's otherwise: a fake CRI server, a fake
cgroup v1 tree and a fake /proc."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.apis.extension import ANNOTATION_OOM_SCORE_ADJ as ADJ
from koord.hookapi import FailurePolicy, HookPoint, PodHookRequest
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KoordQoS
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv, RuntimePlugin
from koord.koordlet.runtimehooks.plugins.oomscoreadj import OOMScoreAdj
from koord.koordlet.runtimehooks.reconciler import Reconciler, with_current_metadata
from koord.koordlet.statesinformer.meta import PodMeta
from koord_testing.cgroupfs import make_fake_v1_cgroup

QOS = "koordinator.sh/qosClass"
BURSTABLE = "kubepods/burstable/podp1"
KUBELET_LABELS = {"io.kubernetes.pod.name": "web", "io.kubernetes.pod.uid": "uid-p1"}


def pod_meta(uid: str, labels: dict[str, str], annotations: dict[str, str]) -> PodMeta:
    return PodMeta(namespace="ns", name="web", uid=uid, labels=labels, annotations=annotations,
                   kube_qos="Burstable", koord_qos=KoordQoS.LS, priority=None, cgroup_dir=BURSTABLE,
                   sandbox_id="p1", running=True)


def cri_record(labels: dict[str, str], annotations: dict[str, str]) -> PodHookRequest:
    record = PodHookRequest(labels=labels, annotations=annotations, cgroup_parent="/" + BURSTABLE)
    record.pod_meta.uid = "uid-p1"
    return record


CRI_LABELS = {QOS: "LS", "group": "a", **KUBELET_LABELS}
CRI_ANNOTATIONS = {ADJ: "100", "kubernetes.io/config.seen": "then"}


@pytest.mark.parametrize("name, current, want_labels, want_annotations", [
    ("unknown to the pods source: CRI's as they are", None, CRI_LABELS, CRI_ANNOTATIONS),
    ("edited annotation: the current value",
     pod_meta("uid-p1", {QOS: "LS", "group": "a"}, {ADJ: "300", "kubernetes.io/config.seen": "then"}),
     CRI_LABELS, {ADJ: "300", "kubernetes.io/config.seen": "then"}),
    ("removed annotation and label are gone, kubelet's sandbox labels stay",
     pod_meta("uid-p1", {QOS: "BE"}, {}), {QOS: "BE", **KUBELET_LABELS}, {}),
    ("added label", pod_meta("uid-p1", {QOS: "LS", "group": "b", "new": "1"}, CRI_ANNOTATIONS),
     {**CRI_LABELS, "group": "b", "new": "1"}, CRI_ANNOTATIONS),
])
def test_with_current_metadata(name, current, want_labels, want_annotations) -> None:
    record = cri_record(CRI_LABELS, CRI_ANNOTATIONS)
    out = PodHookRequest.FromString(with_current_metadata(record.SerializeToString(), current))
    assert (dict(out.labels), dict(out.annotations)) == (want_labels, want_annotations)
    assert out.cgroup_parent == "/" + BURSTABLE and out.pod_meta.uid == "uid-p1"
    assert (dict(record.labels), dict(record.annotations)) == (CRI_LABELS, CRI_ANNOTATIONS), "CRI's record kept"


_keys = st.text(min_size=1, max_size=12)


@given(st.dictionaries(_keys, st.text(max_size=8), max_size=4), st.dictionaries(_keys, st.text(max_size=8), max_size=4),
       st.dictionaries(_keys, st.text(max_size=8), max_size=4))
def test_current_metadata_is_the_pods_plus_kubelets_sandbox_labels(cri_labels, labels, annotations) -> None:
    out = PodHookRequest.FromString(with_current_metadata(cri_record(cri_labels, {"old": "1"}).SerializeToString(),
                                                          pod_meta("uid-p1", labels, annotations)))
    kubelet_own = {k: v for k, v in cri_labels.items() if k.startswith("io.kubernetes.")}
    assert dict(out.labels) == {**kubelet_own, **labels}
    assert dict(out.annotations) == annotations


class Recorder(RuntimePlugin):
    """Records what the pod and container hooks saw."""

    name = "Recorder"

    def __init__(self) -> None:
        self.pods: list[tuple[dict, dict]] = []
        self.containers: list[tuple[dict, dict]] = []
        self.stopped: list[dict] = []

    def register(self, hooks: Hooks) -> None:
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "",
                           lambda ctx: self.pods.append((ctx.request.labels, ctx.request.annotations)))
        hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, self.name, "", lambda ctx: self.containers.append(
            (ctx.request.pod_labels, ctx.request.pod_annotations)))
        hooks.register_pod(HookPoint.POST_STOP_POD_SANDBOX, self.name, "",
                           lambda ctx: self.stopped.append(ctx.request.annotations))


def reconciler_with(fake_cri, root: Path, plugins: list[RuntimePlugin], current) -> Reconciler:
    hooks = Hooks(FailurePolicy.IGNORE)
    for plugin in plugins:
        plugin.register(hooks)
    return Reconciler(hooks, CgroupExecutor(CgroupLayout(root, version=1)), plugins, fake_cri.endpoint, interval=3600,
                      current_pods=current)


def add_pod(fake_cri, annotations: dict[str, str]) -> None:
    fake_cri.add_pod("p1", "web", {QOS: "LS"}, "/" + BURSTABLE, annotations=annotations)
    fake_cri.add_container("c1", "p1", "main")


def test_pod_and_container_hooks_see_the_current_metadata_without_more_cri_calls(fake_cri, tmp_path) -> None:
    make_fake_v1_cgroup(tmp_path, BURSTABLE + "/c1")
    add_pod(fake_cri, {ADJ: "100"})
    listed: list[PodMeta] = []
    recorder = Recorder()
    reconciler = reconciler_with(fake_cri, tmp_path, [recorder], lambda: listed)
    try:
        assert reconciler.reconcile_once().errors == []
        listed.append(pod_meta("uid-p1", {QOS: "LS", "edited": "yes"}, {ADJ: "300"}))
        assert reconciler.reconcile_once().errors == []
        listed.clear()  # the source forgot the pod (e.g. its list is stale): CRI's again
        assert reconciler.reconcile_once().errors == []
        del fake_cri.pods["p1"]
        reconciler.reconcile_once()
    finally:
        reconciler.stop()
    cri_view = ({QOS: "LS"}, {ADJ: "100"})
    current_view = ({QOS: "LS", "edited": "yes"}, {ADJ: "300"})
    assert recorder.pods == [cri_view, current_view, cri_view]
    assert recorder.containers == [cri_view, current_view, cri_view]
    assert recorder.stopped == [{ADJ: "100"}], "PostStop gets the last round's request"
    assert len(fake_cri.requests("PodSandboxStatus")) == 1, "the sandbox's status is still asked once"


def test_a_failing_pods_source_falls_back_to_cri_and_is_reported(fake_cri, tmp_path) -> None:
    make_fake_v1_cgroup(tmp_path, BURSTABLE + "/c1")
    add_pod(fake_cri, {ADJ: "100"})
    recorder = Recorder()

    def broken() -> list[PodMeta]:
        raise RuntimeError("source bug")

    reconciler = reconciler_with(fake_cri, tmp_path, [recorder], broken)
    try:
        report = reconciler.reconcile_once()
    finally:
        reconciler.stop()
    assert report.errors == ["pods source: source bug"]
    assert recorder.containers == [({QOS: "LS"}, {ADJ: "100"})]


def test_oom_score_adj_follows_an_edited_annotation(fake_cri, tmp_path) -> None:
    """The OOMScoreAdj plugin through the reconciler: the annotation edited on the running pod
    reaches the container's processes at the next round."""
    make_fake_v1_cgroup(tmp_path / "cgroup", BURSTABLE + "/c1")
    (tmp_path / "cgroup/cpu" / BURSTABLE / "c1/cgroup.procs").write_text("10\n11\n")
    proc = tmp_path / "proc"
    for pid in (10, 11):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "oom_score_adj").write_text("0\n")
    add_pod(fake_cri, {ADJ: "100"})
    listed: list[PodMeta] = []
    plugin = OOMScoreAdj(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup", version=1)), tmp_path, proc))
    reconciler = reconciler_with(fake_cri, tmp_path / "cgroup", [plugin], lambda: listed)

    def values() -> list[int]:
        return [int((proc / str(pid) / "oom_score_adj").read_text()) for pid in (10, 11)]

    try:
        reconciler.reconcile_once()
        assert values() == [100, 100]
        listed.append(pod_meta("uid-p1", {QOS: "LS"}, {ADJ: "300"}))
        reconciler.reconcile_once()
        assert values() == [300, 300]
    finally:
        reconciler.stop()
