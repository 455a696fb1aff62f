"""The reconciler reuses a pod's or container's last answer while its request and the plugins'
rules are unchanged (when every plugin answers from those alone), applies it again every
refresh round, and runs the hooks again for each at its turn: a fake CRI server and cgroup v1
tree."""

from __future__ import annotations

from pathlib import Path

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, RuntimePlugin
from koord.koordlet.runtimehooks.reconciler import REFRESH_ROUNDS, Reconciler
from koord.koordlet.statesinformer.meta import PodMeta
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.pods import pod_meta

POD = "kubepods/burstable/podp1"


class Shares(RuntimePlugin):
    """Answers from the request and its rules only: the container's cpu.shares is the pod's
    ``shares`` label times the rules (an int here); the pod's bvt is 2."""

    name = "Shares"
    answers_from_request_and_rules = True

    def __init__(self) -> None:
        self.rules = None
        self.calls: list[str] = []
        self.fail_pod = False

    def register(self, hooks: Hooks) -> None:
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "", self.pod)
        hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, self.name, "", self.container)

    def pod(self, ctx) -> None:
        self.calls.append("pod")
        if self.fail_pod:
            raise RuntimeError("pod hook bug")
        ctx.response.resources.cpu_bvt_warp_ns = 2

    def container(self, ctx) -> None:
        self.calls.append("container")
        ctx.response.resources.cpu_shares = int(ctx.request.pod_labels.get("shares", "2")) * (self.rules or 1)


class Impure(Shares):
    name = "Impure"
    answers_from_request_and_rules = False


def rig(fake_cri, root: Path, plugins: list[RuntimePlugin], listed: list[PodMeta],
        policy: FailurePolicy = FailurePolicy.IGNORE) -> Reconciler:
    make_fake_v1_cgroup(root, POD + "/c1")
    fake_cri.add_pod("p1", "web", {"shares": "100"}, "/" + POD)
    fake_cri.add_container("c1", "p1", "main")
    hooks = Hooks(policy)
    for plugin in plugins:
        plugin.register(hooks)
    return Reconciler(hooks, CgroupExecutor(CgroupLayout(root, version=1)), plugins, fake_cri.endpoint, interval=3600,
                      current_pods=lambda: listed)


def shares(root: Path) -> str:
    return (root / "cpu" / POD / "c1/cpu.shares").read_text().strip()


def test_an_unchanged_pod_reuses_its_answer_still_applied_and_refreshed_once_per_cycle(fake_cri, tmp_path):
    plugin = Shares()
    reconciler = rig(fake_cri, tmp_path, [plugin], [])
    try:
        assert reconciler.reconcile_once().errors == []
        assert plugin.calls == ["pod", "container"] and shares(tmp_path) == "100"
        plugin.calls.clear()
        (tmp_path / "cpu" / POD / "c1/cpu.shares").write_text("7\n")  # someone else's write
        report = reconciler.reconcile_once()
        assert shares(tmp_path) == "100", "the reused answer is applied again"
        assert (report.pods, report.containers) == (1, 1)
        for _ in range(REFRESH_ROUNDS - 1):
            reconciler.reconcile_once()
    finally:
        reconciler.stop()
    assert sorted(plugin.calls) == ["container", "pod"], "each ran again once, at its refresh round"


def test_between_refresh_rounds_only_new_answers_are_written(fake_cri, tmp_path):
    """A round a pods change asks for writes the answers it made, not the reused ones (the
    next refresh round puts back what someone else changed)."""
    plugin = Shares()
    listed: list[PodMeta] = []
    reconciler = rig(fake_cri, tmp_path, [plugin], listed)
    try:
        reconciler.reconcile_once()
        (tmp_path / "cpu" / POD / "c1/cpu.shares").write_text("7\n")  # someone else's write
        assert reconciler.reconcile_once(refresh=False).written == []
        assert shares(tmp_path) == "7"
        listed[:] = [pod_meta("ns", "web", "uid-p1", POD, labels={"shares": "300"})]  # a new answer
        assert reconciler.reconcile_once(refresh=False).written == [f"{POD}/c1:cpu_shares"]
        assert shares(tmp_path) == "300"
        (tmp_path / "cpu" / POD / "c1/cpu.shares").write_text("7\n")
        reconciler.reconcile_once(refresh=False)
        assert shares(tmp_path) == "7"
        reconciler.reconcile_once()
        assert shares(tmp_path) == "300", "the refresh round writes the reused answer again"
    finally:
        reconciler.stop()


def test_an_answer_whose_write_failed_is_written_at_the_next_round(fake_cri, tmp_path):
    """A container whose cgroup was not there yet when its answer was made: the next round,
    refresh or not, makes the answer again and writes it."""
    plugin = Shares()
    reconciler = rig(fake_cri, tmp_path, [plugin], [])
    moved = tmp_path / "aside"
    (tmp_path / "cpu" / POD / "c1").rename(moved)
    try:
        assert reconciler.reconcile_once().written == [f"{POD}:cpu_bvt_warp_ns"]  # c1: its cgroup is not there
        moved.rename(tmp_path / "cpu" / POD / "c1")
        plugin.calls.clear()
        report = reconciler.reconcile_once(refresh=False)
        assert (report.errors, plugin.calls, shares(tmp_path)) == ([], ["container"], "100")
    finally:
        reconciler.stop()


def test_a_created_containers_answer_is_written_every_round_until_it_runs(fake_cri, tmp_path):
    """runc writes the spec's resources into the cgroup it just made, maybe after a round
    PLEG asked for wrote ours: until a round lists the container running, every round
    writes its answer again; from then on it is reused as any other."""
    from cri_api.v1 import api_pb2 as cri

    plugin = Shares()
    reconciler = rig(fake_cri, tmp_path, [plugin], [])
    fake_cri.containers["c1"].state = cri.CONTAINER_CREATED
    file = tmp_path / "cpu" / POD / "c1/cpu.shares"
    try:
        for refresh, state, written in [
                (True, cri.CONTAINER_CREATED, True),
                (False, cri.CONTAINER_CREATED, True),  # the runtime wrote over it: again
                (False, cri.CONTAINER_CREATED, True),
                (False, cri.CONTAINER_RUNNING, True),  # the first round that sees it running
                (False, cri.CONTAINER_RUNNING, False)]:  # then reused, not written
            fake_cri.containers["c1"].state = state
            file.write_text("2\n")  # what the runtime writes from the spec
            report = reconciler.reconcile_once(refresh=refresh)
            assert (f"{POD}/c1:cpu_shares" in report.written, shares(tmp_path)) == \
                (written, "100" if written else "2"), (refresh, state)
    finally:
        reconciler.stop()


def test_a_changed_label_or_rule_runs_the_hooks_again(fake_cri, tmp_path):
    plugin = Shares()
    listed: list[PodMeta] = []

    def labelled(value: str) -> PodMeta:
        return pod_meta("ns", "web", "uid-p1", POD, labels={"shares": value})

    reconciler = rig(fake_cri, tmp_path, [plugin], listed)
    try:
        reconciler.reconcile_once()
        for value in ("300", "400"):  # the pods source learns the pod, then its label is edited
            listed[:] = [labelled(value)]
            plugin.calls.clear()
            reconciler.reconcile_once()
            assert sorted(plugin.calls) == ["container", "pod"] and shares(tmp_path) == value
        plugin.calls.clear()
        for _ in range(REFRESH_ROUNDS):
            listed[:] = [labelled("400")]  # a new list of equal pods (an unrelated pod changed)
            reconciler.reconcile_once()
        assert sorted(plugin.calls) == ["container", "pod"], "equal labels: only the refresh rounds"
        plugin.rules = 2
        plugin.calls.clear()
        reconciler.reconcile_once()
        assert sorted(plugin.calls) == ["container", "pod"] and shares(tmp_path) == "800"
    finally:
        reconciler.stop()


def test_a_failed_answer_is_not_reused(fake_cri, tmp_path):
    plugin = Shares()
    plugin.fail_pod = True
    reconciler = rig(fake_cri, tmp_path, [plugin], [])
    try:
        errors = [reconciler.reconcile_once().errors for _ in range(3)]
    finally:
        reconciler.stop()
    assert plugin.calls.count("pod") == 3
    assert all(len(e) == 1 and "pod hook bug" in e[0] for e in errors)


def test_one_plugin_with_effects_of_its_own_runs_the_hooks_every_round(fake_cri, tmp_path):
    pure, impure = Shares(), Impure()
    reconciler = rig(fake_cri, tmp_path, [pure, impure], [])
    try:
        for _ in range(3):
            reconciler.reconcile_once()
    finally:
        reconciler.stop()
    assert pure.calls.count("container") == impure.calls.count("container") == 3
