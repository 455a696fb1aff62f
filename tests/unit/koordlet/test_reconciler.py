"""Standalone reconciler against a fake CRI server (containerd's verbose status shape) and a
fake cgroup v1 tree."""

import logging
import shutil
import threading
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri

from koord.hookapi import FailurePolicy, HookPoint, parse_cpuset
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metrics import KoordletMetrics
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KoordQoS, KubeQoS, Resources
from koord.koordlet.runtimehooks.hooks import Hooks, RuntimePlugin
from koord.koordlet.runtimehooks.protocol import ContainerContext, PodContext
from koord.koordlet.runtimehooks.reconciler import Reconciler
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.scrape import samples

QOS = "koordinator.sh/qosClass"


def read(root: Path, subsystem: str, rel: str, name: str) -> str:
    return (root / subsystem / rel / name).read_text().strip()


class BeQoSPlugin(RuntimePlugin):
    """BE pods: bvt -1 and shares from the container's env; kube-QoS besteffort bvt -1."""

    name = "Fake"

    def __init__(self):
        self.seen = []
        self.stopped = []

    def register(self, hooks):
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "", self.pod)
        hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, self.name, "", self.container)
        hooks.register_pod(HookPoint.POST_STOP_POD_SANDBOX, self.name, "",
                       lambda ctx: self.stopped.append(ctx.request.meta.name))

    def pod(self, ctx):
        self.seen.append(ctx)
        if ctx.request.labels.get(QOS) == "BE":
            ctx.response.resources.cpu_bvt_warp_ns = -1

    def container(self, ctx):
        self.seen.append(ctx)
        if ctx.request.pod_labels.get(QOS) == "BE":
            ctx.response.resources.cpu_shares = int(ctx.request.envs.get("SHARES", "2"))
            ctx.response.resources.cpuset_cpus = "1"

    def kube_qos_resources(self, qos):
        return Resources(cpu_bvt_warp_ns=-1) if qos is KubeQoS.BESTEFFORT else None


def make(fake_cri, root, policy=FailurePolicy.IGNORE, plugin=None, current_pods=None):
    plugin = plugin or BeQoSPlugin()
    hooks = Hooks(policy)
    plugin.register(hooks)
    return Reconciler(hooks, CgroupExecutor(CgroupLayout(root, version=1)), [plugin], fake_cri.endpoint,
                      interval=3600, current_pods=current_pods), plugin


BE = "kubepods/besteffort/podp1"


def be_containers(fake_cri, root: Path, ids) -> None:
    """BE pod p1 in the runtime with the containers ``ids``, each with its cgroup."""
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    for cid in ids:
        make_fake_v1_cgroup(root, f"{BE}/{cid}")
        fake_cri.add_container(cid, "p1", cid, resources={"cpu_shares": 2})


def be_pod_listed(ids, c0_cpu_limit: int):
    """Pod p1 as the pods source lists it: its containers ``ids``, c0 with the given CPU limit."""
    from koord.koordlet.statesinformer.meta import ContainerMeta, PodMeta

    containers = tuple(ContainerMeta(name=cid, id=cid, cgroup_dir=f"{BE}/{cid}", running=True,
                                     requests={"cpu": 100}, limits={"cpu": c0_cpu_limit if cid == "c0" else 500})
                       for cid in ids)
    return [PodMeta(namespace="ns", name="batch", uid="uid-p1", labels={QOS: "BE"}, annotations={},
                    kube_qos="BestEffort", koord_qos=KoordQoS.BE, priority=None, cgroup_dir=BE,
                    sandbox_id="p1", running=True, containers=containers)]


def test_writes_pod_container_and_kube_qos_levels(fake_cri, tmp_path):
    make_fake_v1_cgroup(tmp_path, BE + "/c1")
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE, annotations={"x": "y"})
    fake_cri.add_container("c1", "p1", "main", envs={"SHARES": "512"},
                           resources={"cpu_shares": 2, "memory_limit_in_bytes": 1024})
    reconciler, plugin = make(fake_cri, tmp_path)
    report = reconciler.reconcile_once()
    assert report.errors == []
    assert (report.pods, report.containers) == (1, 1)
    assert read(tmp_path, "cpu", "kubepods/besteffort", "cpu.bvt_warp_ns") == "-1"
    assert read(tmp_path, "cpu", BE, "cpu.bvt_warp_ns") == "-1"
    assert read(tmp_path, "cpu", BE + "/c1", "cpu.shares") == "512"
    assert read(tmp_path, "cpuset", BE + "/c1", "cpuset.cpus") == "1"
    assert sorted(report.written) == sorted([
        "kubepods/besteffort:cpu_bvt_warp_ns", BE + ":cpu_bvt_warp_ns",
        BE + "/c1:cpu_shares", BE + "/c1:cpuset_cpus"])
    pod_ctx, container_ctx = plugin.seen
    assert (pod_ctx.request.meta.namespace, pod_ctx.request.meta.name) == ("ns", "batch")
    assert pod_ctx.request.annotations == {"x": "y"}
    assert pod_ctx.request.cgroup_parent == "/" + BE
    r = container_ctx.request
    assert (r.container_name, r.container_id, r.pod_cgroup_parent) == ("main", "c1", "/" + BE)
    assert r.pod_labels == {QOS: "BE"} and r.envs == {"SHARES": "512"}
    assert (r.resources.cpu_shares, r.resources.memory_limit) == (2, 1024)


def test_second_round_writes_nothing(fake_cri, tmp_path):
    make_fake_v1_cgroup(tmp_path, BE + "/c1")
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    fake_cri.add_container("c1", "p1", "main")
    reconciler, _ = make(fake_cri, tmp_path)
    assert reconciler.reconcile_once().written
    assert reconciler.reconcile_once().written == []
    assert len(fake_cri.requests("PodSandboxStatus")) == 1  # a sandbox's config is asked once


def test_only_ready_pods_and_created_or_running_containers(fake_cri, tmp_path):
    for cid in ("c1", "c2", "c3", "c4"):
        make_fake_v1_cgroup(tmp_path, BE + "/" + cid)
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    fake_cri.add_pod("p2", "gone", {QOS: "BE"}, "/kubepods/besteffort/podp2",
                     state=cri.SANDBOX_NOTREADY)
    fake_cri.add_container("c1", "p1", "exited", state=cri.CONTAINER_EXITED)
    fake_cri.add_container("c2", "p1", "created", state=cri.CONTAINER_CREATED)
    fake_cri.add_container("c3", "p1", "running", state=cri.CONTAINER_RUNNING)
    fake_cri.add_container("c4", "p1", "unknown", state=cri.CONTAINER_UNKNOWN)
    reconciler, plugin = make(fake_cri, tmp_path)
    report = reconciler.reconcile_once()
    assert (report.pods, report.containers) == (1, 2)
    assert [c.request.meta.name for c in plugin.seen if isinstance(c, PodContext)] == ["batch"]
    assert sorted(c.request.container_name for c in plugin.seen if isinstance(c, ContainerContext)) == \
        ["created", "running"]


def test_one_broken_pod_does_not_stop_the_round(fake_cri, tmp_path):
    make_fake_v1_cgroup(tmp_path, BE)
    fake_cri.add_pod("p0", "noparent", {QOS: "BE"}, None)
    fake_cri.add_pod("p9", "elsewhere", {QOS: "BE"}, "/notkubepods/besteffort/podp9")
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    reconciler, _ = make(fake_cri, tmp_path)
    report = reconciler.reconcile_once()
    assert read(tmp_path, "cpu", BE, "cpu.bvt_warp_ns") == "-1"
    assert len(report.errors) == 2
    assert any("ns/noparent" in e and "cgroup parent" in e for e in report.errors)
    assert any("ns/elsewhere" in e and "missing" in e for e in report.errors)


@pytest.mark.parametrize("case, error", [
    # 1: the pod's cgroup went between the list and the write (its QoS dir is there)
    ("pod-cgroup-gone", None),
    # 2: the runtime no longer knows the container it listed
    ("container-not-found", None),
    # 3: the runtime failed otherwise: an error, said in one line
    ("container-status-unavailable", "pod ns/batch container main: CRI: UNAVAILABLE: try later"),
])
def test_a_pod_or_container_gone_since_the_list_is_no_error(fake_cri, tmp_path, caplog, case, error):
    make_fake_v1_cgroup(tmp_path, BE + "/c1")
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    fake_cri.add_container("c1", "p1", "main")
    if case == "pod-cgroup-gone":
        for subsystem in ("cpu", "cpuset", "cpuacct", "memory"):
            shutil.rmtree(tmp_path / subsystem / BE, ignore_errors=True)
    elif case == "container-not-found":
        fake_cri.fail["ContainerStatus"] = (grpc.StatusCode.NOT_FOUND, "c1 not found")
    else:
        fake_cri.fail["ContainerStatus"] = (grpc.StatusCode.UNAVAILABLE, "try later")
    reconciler, _ = make(fake_cri, tmp_path)
    with caplog.at_level(logging.DEBUG, logger="koord.koordlet.runtimehooks.reconciler"):
        report = reconciler.reconcile_once()
    assert report.errors == ([] if error is None else [error])
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == ([] if error is None else [f"reconciler: {error}"])
    if error is None:
        assert any("gone since the list" in r.getMessage() for r in caplog.records)


def test_fail_policy_error_is_reported_per_pod(fake_cri, tmp_path):
    class Broken(BeQoSPlugin):
        def pod(self, ctx):
            if ctx.request.meta.name == "bad":
                raise RuntimeError("boom")
            super().pod(ctx)

    make_fake_v1_cgroup(tmp_path, BE)
    fake_cri.add_pod("p0", "bad", {QOS: "BE"}, "/kubepods/besteffort/podp0")
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    reconciler, _ = make(fake_cri, tmp_path, FailurePolicy.FAIL, Broken())
    report = reconciler.reconcile_once()
    assert report.pods == 1
    assert len(report.errors) == 1 and "ns/bad" in report.errors[0] and "boom" in report.errors[0]
    assert read(tmp_path, "cpu", BE, "cpu.bvt_warp_ns") == "-1"


def test_pod_that_went_away_gets_post_stop(fake_cri, tmp_path):
    make_fake_v1_cgroup(tmp_path, BE)
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    reconciler, plugin = make(fake_cri, tmp_path)
    reconciler.reconcile_once()
    del fake_cri.pods["p1"]
    report = reconciler.reconcile_once()
    assert plugin.stopped == ["batch"] and report.stopped_pods == 1
    assert reconciler.reconcile_once().stopped_pods == 0


def test_unreachable_cri_is_an_error_not_an_exception(tmp_path):
    hooks = Hooks()
    reconciler = Reconciler(hooks, CgroupExecutor(CgroupLayout(tmp_path, version=1)), [],
                            f"unix://{tmp_path}/nothing.sock", interval=3600)
    try:
        report = reconciler.reconcile_once()
    finally:
        reconciler.stop()
    assert len(report.errors) == 1 and "nothing.sock" in report.errors[0]


def test_reconcile_now_wakes_the_loop(fake_cri, tmp_path):
    make_fake_v1_cgroup(tmp_path, BE)
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    rounds = threading.Semaphore(0)

    class Counting(BeQoSPlugin):
        def pod(self, ctx):
            super().pod(ctx)
            rounds.release()

    reconciler, _ = make(fake_cri, tmp_path, plugin=Counting())
    reconciler.start()
    try:
        assert rounds.acquire(timeout=10)  # the first round runs at start
        reconciler.reconcile_now()
        assert rounds.acquire(timeout=10)  # interval is an hour: only reconcile_now explains it
    finally:
        reconciler.stop()


@pytest.mark.parametrize("state, age, starting", [
    (cri.CONTAINER_CREATED, 0.0, 1),
    (cri.CONTAINER_CREATED, 59.0, 1),
    (cri.CONTAINER_CREATED, 61.0, 0),  # failed to start: kubelet removes it, no quick rounds
    (cri.CONTAINER_RUNNING, 0.0, 0),
])
def test_a_young_container_not_running_yet_is_counted_as_starting(fake_cri, tmp_path, state, age, starting):
    import time

    be_containers(fake_cri, tmp_path, ["c1"])
    fake_cri.containers["c1"].state = state
    fake_cri.containers["c1"].created_at = time.time_ns() - int(age * 1e9)
    reconciler, _ = make(fake_cri, tmp_path)
    report = reconciler.reconcile_once()
    assert (report.containers, report.starting) == (1, starting)


def test_a_starting_container_brings_the_next_round_within_a_second(fake_cri, tmp_path, monkeypatch):
    """Nothing may ask for a round once a created container starts: the loop asks for one
    itself (STARTING_RETRY, shortened here) while the interval is an hour, and stops once
    a round lists the container running."""
    import time

    from koord.koordlet.runtimehooks import reconciler as module
    from koord_testing.wait import wait_for

    monkeypatch.setattr(module, "STARTING_RETRY", 0.05)
    be_containers(fake_cri, tmp_path, ["c1"])
    fake_cri.containers["c1"].state = cri.CONTAINER_CREATED
    reconciler, _ = make(fake_cri, tmp_path)

    def rounds() -> int:
        return len(fake_cri.requests("ListContainers"))
    reconciler.start()
    try:
        wait_for(lambda: rounds() >= 3, "rounds nobody asked for", 10)
        fake_cri.containers["c1"].state = cri.CONTAINER_RUNNING
        time.sleep(0.5)  # the round under way, then one that lists it running
        settled = rounds()
        time.sleep(0.5)
        assert rounds() == settled, "running: the next round is an interval away"
    finally:
        reconciler.stop()


def test_a_round_that_raises_does_not_end_the_loop(fake_cri, tmp_path, caplog):
    """A plugin bug outside the per-pod guards (here in the kube-QoS pass) is logged; the
    thread lives on and the next round runs."""
    rounds = threading.Semaphore(0)

    class Broken(BeQoSPlugin):
        def kube_qos_resources(self, qos):
            rounds.release()
            raise RuntimeError("plugin bug")

    reconciler, _ = make(fake_cri, tmp_path, plugin=Broken())
    reconciler.start()
    try:
        assert rounds.acquire(timeout=10)
        reconciler.reconcile_now()
        assert rounds.acquire(timeout=10)
        assert reconciler._thread is not None and reconciler._thread.is_alive()
    finally:
        reconciler.stop()
    assert any("reconcile round failed" in r.getMessage() and "plugin bug" in r.getMessage()
               for r in caplog.records)


def test_container_status_asked_once_then_every_refresh_rounds(fake_cri, tmp_path):
    """Each running container's verbose status: when first seen, then once every
    REFRESH_ROUNDS rounds (spread over the rounds by id), and again at once for a
    container that stopped running and came back; a resize reaches the hooks at its refresh."""
    from koord.koordlet.runtimehooks.reconciler import REFRESH_ROUNDS

    ids = [f"c{i}" for i in range(12)]
    be_containers(fake_cri, tmp_path, ids)
    reconciler, plugin = make(fake_cri, tmp_path)

    def status_calls() -> int:
        return len(fake_cri.requests("ContainerStatus"))

    reconciler.reconcile_once()
    assert status_calls() == len(ids)  # round 1: all new
    fake_cri.containers["c0"].resources.cpu_shares = 4  # kubelet resized c0
    per_round = []
    for _ in range(REFRESH_ROUNDS):
        before = status_calls()
        plugin.seen.clear()
        reconciler.reconcile_once()
        per_round.append(status_calls() - before)
        assert len(plugin.seen) == 1 + len(ids)  # the hooks still run for every container
    assert sum(per_round) == len(ids)  # each refreshed exactly once over the cycle
    assert max(per_round) < len(ids)  # ... not all in one round
    plugin.seen.clear()
    reconciler.reconcile_once()
    c0 = next(ctx for ctx in plugin.seen if getattr(ctx.request, "container_id", "") == "c0")
    assert c0.request.resources.cpu_shares == 4
    # c1 stops: dropped from the cache; running again, it is asked at once.
    fake_cri.containers["c1"].state = cri.CONTAINER_EXITED
    reconciler.reconcile_once()
    fake_cri.containers["c1"].state = cri.CONTAINER_RUNNING
    before = [raw for raw in fake_cri.requests("ContainerStatus")]
    reconciler.reconcile_once()
    asked = [cri.ContainerStatusRequest.FromString(raw).container_id
             for raw in fake_cri.requests("ContainerStatus")[len(before):]]
    assert "c1" in asked


def test_rounds_between_refresh_rounds_ask_only_for_new_containers(fake_cri, tmp_path):
    """The rounds a pods or rule change asks for between refresh rounds refresh nothing: a
    known container's status is not asked however many of them run, a new one's is, and
    the next refresh round takes up the cycle where the last one left it."""
    from koord.koordlet.runtimehooks.reconciler import REFRESH_ROUNDS

    ids = [f"c{i}" for i in range(12)]
    be_containers(fake_cri, tmp_path, ids)
    reconciler, plugin = make(fake_cri, tmp_path)

    def asked(refresh: bool) -> list[str]:
        before = len(fake_cri.requests("ContainerStatus"))
        plugin.seen.clear()
        reconciler.reconcile_once(refresh=refresh)
        assert len(plugin.seen) == 1 + len(fake_cri.containers)  # the hooks run in every round
        return [cri.ContainerStatusRequest.FromString(raw).container_id
                for raw in fake_cri.requests("ContainerStatus")[before:]]

    assert sorted(asked(True)) == sorted(ids)  # all new
    for _ in range(2 * REFRESH_ROUNDS):
        assert asked(False) == []
    make_fake_v1_cgroup(tmp_path, f"{BE}/new")
    fake_cri.add_container("new", "p1", "new", resources={"cpu_shares": 2})
    assert asked(False) == ["new"]
    refreshed = [cid for _ in range(REFRESH_ROUNDS) for cid in asked(True)]
    assert sorted(refreshed) == sorted([*ids, "new"])  # one cycle of refresh rounds: each once


def test_a_container_the_pods_source_lists_after_its_status_is_not_asked_again(fake_cri, tmp_path):
    """kubelet lists a pod after the runtime made it: the size the pods source shows then is
    the one the container was made with, not a resize, so its status is not asked again
    (until its refresh); a resize after that is asked at the next round."""
    pods = []
    be_containers(fake_cri, tmp_path, ["c0"])
    reconciler, _ = make(fake_cri, tmp_path, current_pods=lambda: pods)

    def asked(refresh: bool = False) -> int:
        before = len(fake_cri.requests("ContainerStatus"))
        reconciler.reconcile_once(refresh=refresh)
        return len(fake_cri.requests("ContainerStatus")) - before

    assert asked(refresh=True) == 1  # first seen, not yet in the pods source
    pods = be_pod_listed(["c0"], 500)
    assert [asked() for _ in range(5)] == [0] * 5
    pods = be_pod_listed(["c0"], 1000)  # a resize
    assert asked() == 1


@pytest.mark.parametrize(("interval", "times", "due"), [
    (10.0, [0.0, 1.0, 9.9, 10.0, 15.0, 19.9, 20.5, 40.0], [True, False, False, True, False, False, True, True]),
    (10.0, [100.0, 100.0, 110.0], [True, False, True]),  # the first round refreshes, whenever it is
    (0.5, [0.0, 0.4, 0.5, 0.6, 1.0], [True, False, True, False, True]),
])
def test_a_round_refreshes_when_an_interval_passed_since_the_last_refresh_round(
        fake_cri, tmp_path, interval, times, due):
    clock = iter(times)
    reconciler = Reconciler(Hooks(FailurePolicy.IGNORE), CgroupExecutor(CgroupLayout(tmp_path, version=1)), [],
                            fake_cri.endpoint, interval=interval, clock=lambda: next(clock))
    assert [reconciler.refresh_due() for _ in times] == due


def test_a_refreshed_status_with_the_same_bytes_is_not_parsed_again(fake_cri, tmp_path, monkeypatch):
    from koord.hookapi import fromcri
    from koord.koordlet.runtimehooks.reconciler import REFRESH_ROUNDS

    parsed: list[str] = []
    real = fromcri.container_record_from_status

    def counting(status, container_id):
        parsed.append(container_id)
        return real(status, container_id)
    monkeypatch.setattr(fromcri, "container_record_from_status", counting)
    be_containers(fake_cri, tmp_path, ("c0", "c1", "c2"))
    reconciler, _ = make(fake_cri, tmp_path)
    reconciler.reconcile_once()
    assert sorted(parsed) == ["c0", "c1", "c2"]
    parsed.clear()
    fake_cri.containers["c0"].resources.cpu_shares = 4  # kubelet resized c0
    asked = len(fake_cri.requests("ContainerStatus"))
    for _ in range(REFRESH_ROUNDS):
        reconciler.reconcile_once()
    assert len(fake_cri.requests("ContainerStatus")) - asked == 3  # each still asked at its refresh
    assert parsed == ["c0"]


def test_a_resize_the_pods_source_shows_is_asked_at_the_next_round(fake_cri, tmp_path):
    """A container whose requests or limits in the pods source (kubelet's /pods) changed
    has its verbose status asked at the next round, not at its refresh round; an unchanged
    pods source asks for nothing new."""
    from koord.koordlet.runtimehooks.reconciler import REFRESH_ROUNDS

    pods = be_pod_listed(["c0", "c1"], 500)
    be_containers(fake_cri, tmp_path, ["c0", "c1"])
    reconciler, plugin = make(fake_cri, tmp_path, current_pods=lambda: pods)

    def asked_in_a_round() -> list[str]:
        before = len(fake_cri.requests("ContainerStatus"))
        reconciler.reconcile_once()
        return sorted(cri.ContainerStatusRequest.FromString(raw).container_id
                      for raw in fake_cri.requests("ContainerStatus")[before:])

    assert asked_in_a_round() == ["c0", "c1"]  # first seen
    # Rounds until neither is due for its refresh (ids spread over REFRESH_ROUNDS rounds).
    for _ in range(REFRESH_ROUNDS):
        if not asked_in_a_round():
            break
    else:
        pytest.fail("every round asked for a status")
    pods = be_pod_listed(["c0", "c1"], 1000)  # kubelet resized c0: its pod in /pods shows the new limit first ...
    assert "c0" in asked_in_a_round()
    assert "c0" in asked_in_a_round()  # ... the runtime does not hold it yet: asked again
    fake_cri.containers["c0"].resources.cpu_shares = 4  # ... then kubelet updates the runtime
    plugin.seen.clear()
    assert "c0" in asked_in_a_round()
    c0 = next(ctx for ctx in plugin.seen if getattr(ctx.request, "container_id", "") == "c0")
    assert c0.request.resources.cpu_shares == 4
    for _ in range(REFRESH_ROUNDS):  # the runtime shows the resize: c0 is asked at its refresh alone
        if "c0" not in asked_in_a_round():
            break
    else:
        pytest.fail("c0 asked every round after its resize reached the runtime")


NUMA_POOLS = {"node.koordinator.sh/cpu-shared-pools":
              '[{"socket":0,"node":0,"cpuset":"0"},{"socket":0,"node":1,"cpuset":"1"}]'}
LS_POD = "kubepods/burstable/podp1"


@pytest.mark.parametrize("annotations, want", [
    # the sandbox (pause) container gets the cpuset the pod's containers get
    ({}, "0,1"),
    ({"scheduling.koordinator.sh/resource-status": '{"numaNodeResources":[{"node":1,"resources":{"cpu":"1"}}]}'},
     "1"),
    ({"scheduling.koordinator.sh/resource-status": '{"cpuset":"0"}'}, "0"),
])
def test_sandbox_container_gets_the_pods_cpuset(fake_cri, tmp_path, annotations, want):
    from koord.koordlet.runtimehooks.hooks import PluginEnv
    from koord.koordlet.runtimehooks.plugins import parse_rules
    from koord.koordlet.runtimehooks.plugins.cpuset import CPUSetAllocator

    for rel in (f"{LS_POD}/p1", f"{LS_POD}/c1"):
        make_fake_v1_cgroup(tmp_path, rel)
        (tmp_path / "cpuset" / rel / "cpuset.cpus").write_text("0-3\n")
    fake_cri.add_pod("p1", "web", {QOS: "LS"}, "/" + LS_POD, annotations=annotations)
    fake_cri.add_container("c1", "p1", "main")
    executor = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    plugin = CPUSetAllocator(PluginEnv(executor, tmp_path, tmp_path))
    plugin.update_rules(parse_rules(None, {"metadata": {"annotations": NUMA_POOLS}}))
    reconciler, _ = make(fake_cri, tmp_path, plugin=plugin)
    report = reconciler.reconcile_once()
    assert report.errors == []
    for rel in (f"{LS_POD}/p1", f"{LS_POD}/c1"):
        assert parse_cpuset(read(tmp_path, "cpuset", rel, "cpuset.cpus")) == parse_cpuset(want)
    assert f"{LS_POD}/p1:cpuset_cpus" in report.written


def reconciler_calls(metrics) -> dict[tuple[str, str, str], float]:
    """koordlet_runtime_hook_reconciler_invoked_duration_milliseconds' count by (level, resource_type, status)."""
    out = {}
    for labels, value in samples(metrics, "/internal-metrics",
                                 "koordlet_runtime_hook_reconciler_invoked_duration_milliseconds_count").items():
        d = dict(labels)
        assert d["node"] == "n1"
        out[(d["level"], d["resource_type"], d["status"])] = value
    return out


class SandboxCpusetPlugin(BeQoSPlugin):
    def reconcile_sandbox(self, ctx):
        ctx.response.resources.cpuset_cpus = "0"


def test_each_invocation_is_timed_per_level_and_resource_type_as_upstreams_histogram(fake_cri, tmp_path):
    make_fake_v1_cgroup(tmp_path, BE + "/c1")
    make_fake_v1_cgroup(tmp_path, BE + "/p1")  # the sandbox container's
    make_fake_v1_cgroup(tmp_path, BE + "/c2")
    shares = tmp_path / "cpu" / BE / "c2" / "cpu.shares"
    shares.unlink()
    shares.mkdir()  # c2's cpu.shares cannot be read: its write fails
    fake_cri.add_pod("p1", "batch", {QOS: "BE"}, "/" + BE)
    fake_cri.add_container("c1", "p1", "main", envs={"SHARES": "512"})
    fake_cri.add_container("c2", "p1", "side", envs={"SHARES": "256"})
    metrics = KoordletMetrics("n1")
    hooks, plugin = Hooks(FailurePolicy.IGNORE), SandboxCpusetPlugin()
    plugin.register(hooks)
    executor = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    reconciler = Reconciler(hooks, executor, [plugin], fake_cri.endpoint, interval=3600,
                            observe=metrics.record_reconciler_call)
    assert reconciler_calls(metrics) == {}
    reconciler.reconcile_once()
    assert reconciler_calls(metrics) == {
        ("kubeqos", "cpu.bvt_warp_ns", "succeeded"): 1, ("pod", "cpu.bvt_warp_ns", "succeeded"): 1,
        ("sandbox", "cpuset.cpus", "succeeded"): 1,
        ("container", "cpu.shares", "succeeded"): 1, ("container", "cpuset.cpus", "succeeded"): 1,
        ("container", "cpu.shares", "failed"): 1, ("container", "cpuset.cpus", "failed"): 1}
    reconciler.reconcile_once()
    assert reconciler_calls(metrics)[("container", "cpu.shares", "succeeded")] == 2
