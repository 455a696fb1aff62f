"""CoreSched's cookie cache warm-up and metrics against a stubbed prctl: upstream's
Test_getCookie and TestPlugin_loadAllCookies tables (their names and pids), a restarted
koordlet reusing a group's cookie, and upstream's core-sched metric names and labels."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from koord.apis.extension import LABEL_CORE_SCHED_GROUP_ID as GROUP_ID
from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet import cli, flags
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KoordQoS
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.cookies import CookieError, CookieManager
from koord.koordlet.runtimehooks.plugins.coresched import CoreSched
from koord.koordlet.runtimehooks.plugins.coreschedrule import CORE_SCHED
from koord.koordlet.runtimehooks.protocol import ContainerContext, ContainerRequest, HookPodMeta, PodContext, PodRequest
from koord.koordlet.statesinformer.meta import ContainerMeta, PodMeta

from .test_plugin_coresched import FakeCookies, slo

QOS = "koordinator.sh/qosClass"
# upstream's testGetEnabledRule: every class enabled, LSR and LS expellers
ENABLED = parse_rules(slo("coreSched", lsrClass={"enable": True}, lsClass={"enable": True},
                          beClass={"enable": True}), None)


def fake_kernel(cookies: dict[int, int], failing: frozenset[int] | set[int] = frozenset()) -> FakeCookies:
    """Upstream's NewFakeCoreSchedExtended: pids with a cookie (0: the default one); a pid
    missing there or in ``failing`` cannot be asked (ESRCH)."""
    ops = FakeCookies(set(cookies) - set(failing))
    ops.cookies = {pid: c for pid, c in cookies.items() if c}
    return ops


# upstream's Test_getCookie: (cookie, the pids holding it)
@pytest.mark.parametrize("name, cookies, failing, pids, want", [
    ("no pid to sync", {1: 0}, set(), [], (0, [])),
    ("sync default cookie", {1: 0, 1000: 0, 1001: 0, 1002: 0}, {1004}, [1000, 1001, 1002, 1003, 1004], (0, [])),
    ("sync for multiple cookies and use the first new cookie", {1: 0, 1000: 100000, 1001: 100000, 1002: 200000},
     {1004}, [1000, 1001, 1002, 1003, 1004], (100000, [1000, 1001])),
    ("all pids get failed", {1: 0}, {1000, 1001, 1002, 1004}, [1000, 1001, 1002], (0, [])),
    ("sync cookie correctly", {1: 0, 1000: 100000, 1001: 100000, 1002: 100000}, {1004},
     [1000, 1001, 1002, 1003, 1004], (100000, [1000, 1001, 1002])),
    ("sync cookie correctly 1", {1: 0, 1000: 100000, 1001: 100000, 1002: 100000, 1010: 100000, 2000: 200000},
     {1001, 1004}, [1000, 1001, 1002, 1003, 1004, 1010], (100000, [1000, 1002, 1010])),
])
def test_current_cookie(name, cookies, failing, pids, want) -> None:
    assert CookieManager(fake_kernel(cookies, failing)).current_cookie(pids) == want


def pod(uid: str, qos: str, group: str, parent: str, sandbox: str, containers: dict[str, str],
        running: bool = True) -> PodMeta:
    """A pod as the states informer lists it; ``containers`` name -> id, all running."""
    return PodMeta(namespace="default", name=f"test-pod-{uid}", uid=uid, labels={QOS: qos, GROUP_ID: group},
                   annotations={}, kube_qos="", koord_qos=KoordQoS(qos), priority=None, cgroup_dir=parent,
                   sandbox_id=sandbox, running=running,
                   containers=[ContainerMeta(name=name, id=cid, cgroup_dir=f"{parent}/{cid}", running=True)
                               for name, cid in containers.items()])


def write_procs(root: Path, procs: dict[str, list[int]]) -> None:
    for rel, pids in procs.items():
        path = root / "cpu" / rel / "cgroup.procs"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{p}\n" for p in pids))


XXX = "kubepods/podxxxxxx"
NNN_FAILED = pod("nnnnnn", "LSR", "group-nnn", "kubepods/podnnnnnn", "", {"test-container": "mmmmmm"}, running=False)
XXX_LS = pod("xxxxxx", "LS", "group-xxx", XXX, "aaaaaa", {"test-container": "yyyyyy"})
XXX_PROCS = {f"{XXX}/aaaaaa": [12340], f"{XXX}/yyyyyy": [12344, 12345, 12346]}
XXX_COOKIES = {1: 0, 10: 0, 12340: 1000000, 12344: 1000000, 12345: 1000000, 12346: 1000000}
CCC = "kubepods/burstable/podcccccc"


# upstream's TestPlugin_loadAllCookies: (warmed, {group: (cookie, pids)})
@pytest.mark.parametrize("name, procs, cookies, failing, pods, warmed, groups", [
    ("sync pods failed for no pod PID available", {f"{XXX}/aaaaaa": [], f"{XXX}/yyyyyy": []}, XXX_COOKIES,
     {12346}, [XXX_LS, NNN_FAILED], False, {}),
    ("sync pods partially correct", XXX_PROCS, XXX_COOKIES, {12345}, [XXX_LS, NNN_FAILED], True,
     {"group-xxx-expeller": (1000000, {12340, 12344, 12346})}),
    ("sync pods correctly for single pod", XXX_PROCS, XXX_COOKIES, {12346}, [XXX_LS, NNN_FAILED], True,
     {"group-xxx-expeller": (1000000, {12340, 12344, 12345})}),
    ("sync pods correctly for multiple pods",
     {**XXX_PROCS, f"{CCC}/dddddd": [32760], f"{CCC}/zzzzzz": [32768, 32770, 32771]},
     {**XXX_COOKIES, 32760: 1000000, 32768: 1000000, 32770: 1000000, 32772: 1000000}, {12346, 32771},
     [pod("xxxxxx", "LSR", "group-xxx", XXX, "aaaaaa", {"test-container": "yyyyyy"}), NNN_FAILED,
      pod("cccccc", "LS", "group-xxx", CCC, "dddddd", {"test-container": "zzzzzz"})], True,
     {"group-xxx-expeller": (1000000, {12340, 12344, 12345, 32760, 32768, 32770})}),
    ("sync pods correctly for multiple containers with inconsistent cookies",
     {**XXX_PROCS, f"{XXX}/zzzzzz": [12350]}, {**XXX_COOKIES, 12350: 1100000}, {12346},
     [pod("xxxxxx", "LS", "group-xxx", XXX, "aaaaaa", {"test-container": "yyyyyy", "test-container-1": "zzzzzz"}),
      NNN_FAILED], True,
     {"group-xxx-expeller": (1000000, {12340, 12344, 12345})}),
])
def test_warm_up(tmp_path: Path, name, procs, cookies, failing, pods, warmed, groups) -> None:
    write_procs(tmp_path, procs)
    ops = fake_kernel(cookies, failing)
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1)), tmp_path, tmp_path,
                                 current_pods=lambda: pods), ops)
    plugin.update_rules(ENABLED)
    rule = ENABLED[CORE_SCHED]
    assert rule is not None
    assert plugin._warm_up(rule) is warmed
    assert {g: (e.cookie, e.pids) for g, e in plugin.cookies.groups.items()} == groups
    assert not any(op in ops.log for op in ("create", "share", "clear")), "warm-up only reads"


def run_container(plugin: CoreSched, hooks: Hooks, meta: PodMeta, container: str) -> None:
    hooks.run(HookPoint.POST_START_CONTAINER, ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name=meta.name, namespace=meta.namespace, uid=meta.uid), container_name=container,
        container_id=next(c.id for c in meta.containers if c.name == container), pod_labels=meta.labels,
        pod_cgroup_parent="/" + meta.cgroup_dir)))


def sample(registry: CollectorRegistry, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for metric in registry.collect() for s in metric.samples
            if s.name == name}


def started(tmp_path: Path, ops: FakeCookies, pods: list[PodMeta],
            registry: CollectorRegistry) -> tuple[CoreSched, Hooks]:
    plugin = CoreSched(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path, version=1)), tmp_path, tmp_path,
                                 current_pods=lambda: pods, registry=registry, node="node-1"), ops)
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    plugin.update_rules(ENABLED)
    return plugin, hooks


def test_a_restarted_koordlet_reuses_the_groups_cookie(tmp_path: Path) -> None:
    """Two BE pods of group g: the first koordlet gives them one cookie; a second koordlet
    (a restart: empty caches, same kernel) learns it and gives it to a new pod of the
    group instead of creating another one."""
    be = {f"kubepods/besteffort/pod{u}/{u}-c": [p] for u, p in (("u1", 101), ("u2", 102), ("u3", 103))}
    write_procs(tmp_path, be)
    ops = fake_kernel({101: 0, 102: 0, 103: 0})
    first_pods = [pod(u, "BE", "g", f"kubepods/besteffort/pod{u}", "", {"main": f"{u}-c"}) for u in ("u1", "u2")]
    first, hooks = started(tmp_path, ops, first_pods, CollectorRegistry())
    for meta in first_pods:
        run_container(first, hooks, meta, "main")
    cookie = ops.cookies[101]
    assert cookie and ops.cookies[102] == cookie and ops.log.count("create") == 1

    all_pods = first_pods + [pod("u3", "BE", "g", "kubepods/besteffort/podu3", "", {"main": "u3-c"})]
    registry = CollectorRegistry()
    second, hooks = started(tmp_path, ops, all_pods, registry)
    run_container(second, hooks, all_pods[2], "main")
    assert ops.cookies[103] == cookie, "the group's cookie, not a new one"
    assert ops.log.count("create") == 1
    cookies = sample(registry, "koordlet_container_core_sched_cookie")
    assert {dict(k)["container_id"]: dict(k)["core_sched_cookie"] for k in cookies} == {
        "u1-c": str(cookie), "u2-c": str(cookie), "u3-c": str(cookie)}, "warm-up's adopted containers too"


def test_without_processes_to_ask_no_cookie_is_given_yet(tmp_path: Path) -> None:
    """Upstream aborts until the cache is initialised: the first container waits for a round
    in which the pods source lists it."""
    write_procs(tmp_path, {"kubepods/besteffort/podu1/c1": [101]})
    ops = fake_kernel({101: 0})
    listed: list[PodMeta] = []
    plugin, hooks = started(tmp_path, ops, listed, CollectorRegistry())
    meta = pod("u1", "BE", "", "kubepods/besteffort/podu1", "", {"main": "c1"})
    run_container(plugin, hooks, meta, "main")
    assert ops.cookies == {} and not plugin.cookies.warmed
    listed.append(meta)
    run_container(plugin, hooks, meta, "main")
    assert ops.cookies[101] and plugin.cookies.warmed


LABELS = ["container_id", "container_name", "core_sched_cookie", "core_sched_group", "node", "pod_name",
          "pod_namespace", "pod_uid"]


def test_metrics_follow_the_containers_cookie(tmp_path: Path) -> None:
    """Upstream's names and labels: the gauge per container while it holds a cookie (gone when
    cleared, replaced when the group changes, gone with the pod); the status counter per group."""
    write_procs(tmp_path, {"kubepods/besteffort/podu1/c1": [101]})
    ops = fake_kernel({101: 0})
    meta = pod("u1", "BE", "g", "kubepods/besteffort/podu1", "", {"main": "c1"})
    registry = CollectorRegistry()
    plugin, hooks = started(tmp_path, ops, [meta], registry)
    run_container(plugin, hooks, meta, "main")
    gauge = sample(registry, "koordlet_container_core_sched_cookie")
    assert list(gauge.values()) == [1.0]
    (labels,) = gauge
    assert dict(labels) == {"node": "node-1", "pod_name": "test-pod-u1", "pod_namespace": "default", "pod_uid": "u1",
                            "container_name": "main", "container_id": "c1", "core_sched_group": "g",
                            "core_sched_cookie": str(ops.cookies[101])}
    assert sorted(dict(labels)) == LABELS
    status = sample(registry, "koordlet_core_sched_cookie_manage_status_total")
    assert status == {(("core_sched_group", "g"), ("node", "node-1"), ("status", "succeeded")): 1.0}

    meta = replace(meta, labels={**meta.labels, GROUP_ID: "h"})  # the label edited on the running pod
    run_container(plugin, hooks, meta, "main")
    assert [dict(k)["core_sched_group"] for k in sample(registry, "koordlet_container_core_sched_cookie")] == ["h"]

    plugin.update_rules(parse_rules(slo("coreSched", lsClass={"enable": True}), None))  # BE off: cleared
    run_container(plugin, hooks, meta, "main")
    assert 101 not in ops.cookies and sample(registry, "koordlet_container_core_sched_cookie") == {}

    plugin.update_rules(ENABLED)
    run_container(plugin, hooks, meta, "main")
    assert len(sample(registry, "koordlet_container_core_sched_cookie")) == 1
    hooks.run(HookPoint.POST_STOP_POD_SANDBOX, PodContext(PodRequest(meta=HookPodMeta(uid="u1"))))
    assert sample(registry, "koordlet_container_core_sched_cookie") == {}


def test_a_failed_cookie_operation_is_counted(tmp_path: Path) -> None:
    write_procs(tmp_path, {"kubepods/besteffort/podu1/c1": [101]})
    ops = fake_kernel({101: 0})
    meta = pod("u1", "BE", "g", "kubepods/besteffort/podu1", "", {"main": "c1"})
    registry = CollectorRegistry()
    plugin, hooks = started(tmp_path, ops, [meta], registry)

    def refuse(pid: int) -> int:
        raise CookieError(errno.EPERM, "Operation not permitted")

    ops.create = refuse  # type: ignore[method-assign]
    with pytest.raises(HookError, match="core scheduling cookie for group 'g'"):
        run_container(plugin, hooks, meta, "main")
    assert sample(registry, "koordlet_core_sched_cookie_manage_status_total") == {
        (("core_sched_group", "g"), ("node", "node-1"), ("status", "failed")): 1.0}


@given(st.lists(st.tuples(st.integers(1, 50), st.sampled_from([0, 7, 9]), st.booleans()), max_size=12))
def test_current_cookie_is_the_first_cookie_and_its_holders(procs: list[tuple[int, int, bool]]) -> None:
    cookies: dict[int, int] = {}
    failing: set[int] = set()
    for pid, cookie, fails in procs:
        cookies.setdefault(pid, cookie)
        if fails:
            failing.add(pid)
    pids = [pid for pid, _, _ in procs]
    cookie, holders = CookieManager(fake_kernel(cookies, failing)).current_cookie(pids)
    readable = [p for p in pids if p not in failing and cookies[p]]
    assert cookie == (cookies[readable[0]] if readable else 0)
    assert holders == [p for p in readable if cookies[p] == cookie]


def test_a_restarted_container_replaces_its_series(tmp_path: Path) -> None:
    write_procs(tmp_path, {"kubepods/besteffort/podu1/c1": [101], "kubepods/besteffort/podu1/c2": [102]})
    ops = fake_kernel({101: 0, 102: 0})
    meta = pod("u1", "BE", "g", "kubepods/besteffort/podu1", "", {"main": "c1"})
    registry = CollectorRegistry()
    plugin, hooks = started(tmp_path, ops, [meta], registry)
    run_container(plugin, hooks, meta, "main")
    meta = replace(meta, containers=(replace(meta.containers[0], id="c2"),))  # kubelet restarted the container
    run_container(plugin, hooks, meta, "main")
    assert [dict(k)["container_id"] for k in sample(registry, "koordlet_container_core_sched_cookie")] == ["c2"]


def test_koordlet_serves_the_metrics_and_warms_up_from_its_informer() -> None:
    koordlet = cli.Koordlet(flags.parse_args(["--feature-gates", "CoreSched=true",
                                              "--runtime-hooks-reconcile-interval", "0"]))
    (plugin,) = [p for p in koordlet.hooks.plugins if isinstance(p, CoreSched)]
    assert plugin.metrics.registry is koordlet.metrics.registry
    assert plugin.metrics.node == koordlet.metrics.node
    assert plugin.env.current_pods is not None and plugin.env.current_pods() == koordlet.informer.get_all_pods()
