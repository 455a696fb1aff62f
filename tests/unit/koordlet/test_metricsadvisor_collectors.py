"""Collectors on generated /proc, /sys and cgroup v1/v2 trees, with upstream's table cases."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from koord.koordlet import metriccache as mc
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.metrics import KoordletMetrics
from koord.koordlet.metricsadvisor import AdvisorConfig
from koord.koordlet.metricsadvisor.advisor import MetricsAdvisor
from koord.koordlet.metricsadvisor.collectors import (
    BEResourceCollector,
    HostApplicationCollector,
    NodeInfoCollector,
    NodeResourceCollector,
    PodResourceCollector,
    PodThrottledCollector,
    PSICollector,
    SystemResourceCollector,
)
from koord.koordlet.metricsadvisor.framework import CgroupTarget, Env, Point, Rates, collector_problems
from koord.koordlet.metricsadvisor.gauges import HostAppGauges, PSIGauges
from koord.koordlet.metricsadvisor.parsers import FileProblem
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.slo import parse_host_apps
from koord.koordlet.statesinformer.meta import PodMeta
from koord_testing.cgroupfs import memory_stat_text, write_usage
from koord_testing.pods import FakeStatesInformer, container_meta, pod_meta
from koord_testing.scrape import labelled, samples, scrape

MiB = 1024 * 1024
HZ = os.sysconf("SC_CLK_TCK")


def by_kind(samples):
    out: dict[str, list] = {}
    for s in samples:
        out.setdefault(s.kind, []).append(s)
    return out


@pytest.fixture
def make_env(tmp_path):
    def make(version: int = 1, pods=None, node_slo=None, kube_dir: str = "kubepods",
             driver: str = "cgroupfs", **config) -> Env:
        root = tmp_path / f"cgroup-v{version}"
        root.mkdir(exist_ok=True)
        if version == 2:
            (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        for d in ("proc", "sys"):
            (tmp_path / d).mkdir(exist_ok=True)
        cfg = AdvisorConfig(proc_root=tmp_path / "proc", sys_root=tmp_path / "sys", **config)
        return Env(cfg, FakeStatesInformer(pods or [], node_slo=node_slo), MetricCache(None),
                   CgroupExecutor(CgroupLayout(root, kube_dir, driver)))
    return make


# ---- node --------------------------------------------------------------------------------

def write_proc(env: Env, busy_ticks: int, mem_total=1048576, mem_avail=524288, mem_free=262144) -> None:
    (env.proc / "stat").write_text(f"cpu  {busy_ticks} 0 0 5000 7 0 0 9 0 0\ncpu0 {busy_ticks} 0 0 5000 7 0 0 9 0 0\n")
    (env.proc / "meminfo").write_text(f"MemTotal: {mem_total} kB\nMemFree: {mem_free} kB\n"
                                      f"MemAvailable: {mem_avail} kB\n")


def test_node_resource_as_upstream(make_env):
    # Test_nodeResourceCollector_collectNodeResUsed
    env = make_env()
    c = NodeResourceCollector(env)
    write_proc(env, 1000)
    first = by_kind(c.collect(100.0))
    assert mc.NODE_CPU_USAGE not in first  # the first sample only primes
    assert first[mc.NODE_MEMORY_USAGE][0].value == 536870912
    assert first[mc.NODE_MEMORY_USAGE_WITH_PAGE_CACHE][0].value == 805306368
    assert env.shared.node is None
    write_proc(env, 1000 + HZ)  # one core's worth of ticks in one second
    second = by_kind(c.collect(101.0))
    assert second[mc.NODE_CPU_USAGE][0].value == pytest.approx(1.0)
    assert env.shared.node == Point(pytest.approx(1.0), 536870912, 101.0)


def test_node_resource_numa(make_env):
    env = make_env()
    node0 = env.sys / "devices/system/node/node0"
    node0.mkdir(parents=True)
    (node0 / "cpulist").write_text("0\n")
    (node0 / "meminfo").write_text("Node 0 MemTotal: 1000 kB\nNode 0 MemFree: 100 kB\nNode 0 Active(file): 0 kB\n"
                                   "Node 0 Inactive(file): 0 kB\nNode 0 SReclaimable: 0 kB\n")
    c = NodeResourceCollector(env)
    write_proc(env, 0)
    c.collect(10.0)
    write_proc(env, HZ // 2)
    got = by_kind(c.collect(11.0))
    assert got[mc.NODE_NUMA_CPU_USAGE][0].value == pytest.approx(0.5)
    assert got[mc.NODE_NUMA_CPU_USAGE][0].labels == {mc.NUMA_NODE_ID: "0"}
    assert got[mc.NODE_NUMA_MEMORY_USAGE][0].value == 900 * 1024


def test_node_counter_going_backwards_gives_no_cpu_sample(make_env):
    env = make_env()
    c = NodeResourceCollector(env)
    write_proc(env, 5000)
    c.collect(1.0)
    write_proc(env, 10)
    assert mc.NODE_CPU_USAGE not in by_kind(c.collect(2.0))
    write_proc(env, 10 + HZ)
    assert by_kind(c.collect(3.0))[mc.NODE_CPU_USAGE][0].value == pytest.approx(1.0)


# ---- system ------------------------------------------------------------------------------

@pytest.mark.parametrize("node, pods, apps, want", [
    # Test_systemResourceCollector_collectSysResUsed
    ((1, 1024), {"PodResource": (0.5, 512)}, (0, 0), (0.5, 512)),
    ((2, 2048), {"PodResource": (0.5, 512), "Other": (1, 512)}, (0, 0), (0.5, 1024)),
    ((1, 1024), {"PodResource": (0.5, 512)}, (0.1, 128), (0.4, 384)),
    ((1, 1024), {"PodResource": (2, 2048)}, (0, 0), (0, 0)),  # never negative
])
def test_system_resource_as_upstream(make_env, node, pods, apps, want):
    env = make_env()
    env.shared.set_node(Point(*node, 100.0))
    for name, (cpu, mem) in pods.items():
        env.shared.set_pods(name, Point(cpu, mem, 100.0))
    env.shared.set_host_apps(Point(*apps, 100.0))
    got = by_kind(SystemResourceCollector(env).collect(101.0))
    assert got[mc.SYS_CPU_USAGE][0].value == pytest.approx(want[0])
    assert got[mc.SYS_MEMORY_USAGE][0].value == want[1]


@pytest.mark.parametrize("missing", ["node", "pods", "apps", "stale-node", "stale-pods"])
def test_system_resource_needs_fresh_inputs(make_env, missing):
    env = make_env()
    if missing != "node":
        env.shared.set_node(Point(1, 1024, 80.0 if missing == "stale-node" else 100.0))
    if missing != "pods":
        env.shared.set_pods("PodResource", Point(0.5, 512, 80.0 if missing == "stale-pods" else 100.0))
    if missing != "apps":
        env.shared.set_host_apps(Point(0, 0, 100.0))
    assert list(SystemResourceCollector(env).collect(101.0)) == []


# ---- BE ----------------------------------------------------------------------------------

def write_be(env: Env, version: int, cpuset: str, quota: int, cpu_ns: int = 0, container_cpuset: str | None = None):
    root = env.cgroups.root
    be = "kubepods/besteffort"
    write_usage(root, be, version, cpu_ns=cpu_ns, memory_stat=memory_stat_text(version, 0))
    if version == 1:
        for d in (root / "cpuset" / be, root / "cpu" / be):
            d.mkdir(parents=True, exist_ok=True)
        (root / "cpuset" / be / "cpuset.cpus").write_text(cpuset + "\n")
        (root / "cpu" / be / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (root / "cpu" / be / "cpu.cfs_period_us").write_text("100000\n")
        if container_cpuset:
            (root / "cpuset" / be / "podx" / "c1").mkdir(parents=True)
            (root / "cpuset" / be / "podx" / "cpuset.cpus").write_text(cpuset + "\n")
            (root / "cpuset" / be / "podx" / "c1" / "cpuset.cpus").write_text(container_cpuset + "\n")
    else:
        (root / be / "cpuset.cpus.effective").write_text(cpuset + "\n")
        (root / be / "cpu.max").write_text(f"{'max' if quota == -1 else quota} 100000\n")
        if container_cpuset:
            (root / be / "podx" / "c1").mkdir(parents=True)
            (root / be / "podx" / "c1" / "cpuset.cpus.effective").write_text(container_cpuset + "\n")


def be_value(samples, allocation):
    return [s.value for s in samples if s.kind == mc.NODE_BE and s.labels[mc.BE_ALLOCATION] == allocation]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("cpuset, quota, container_cpuset, want", [
    # Test_getBECPURealMilliLimit
    ("1-2", -1, None, 2000), ("1-15", 800000, None, 8000),
    ("0-15", -1, "3", 1000),  # a container pinned narrower than its parents
])
def test_be_real_limit_as_upstream(make_env, version, cpuset, quota, container_cpuset, want):
    env = make_env(version)
    write_be(env, version, cpuset, quota, container_cpuset=container_cpuset)
    assert be_value(BEResourceCollector(env).collect(1.0), mc.BE_ALLOCATION_REAL_LIMIT) == [want]


@pytest.mark.parametrize("version", [1, 2])
def test_be_usage_as_upstream(make_env, version):
    # Test_getBECPUUsageMilliCores: 12000e9 -> 12004e9 ns in one second = 4000 milli-cores.
    env = make_env(version)
    write_be(env, version, "0-7", -1, cpu_ns=12000 * 10**9)
    c = BEResourceCollector(env)
    assert be_value(c.collect(10.0), mc.BE_ALLOCATION_USAGE) == []
    write_be(env, version, "0-7", -1, cpu_ns=12004 * 10**9)
    assert be_value(c.collect(11.0), mc.BE_ALLOCATION_USAGE) == [pytest.approx(4000)]


def test_be_request_sums_batch_cpu_of_be_pods(make_env):
    be = pod_meta("ns", "be", "u1", "kubepods/besteffort/podu1", kube_qos="besteffort", koord_qos="BE",
                 containers=[container_meta("a", "c1", "x", requests={"kubernetes.io/batch-cpu": 500}),
                             container_meta("b", "c2", "y", requests={"kubernetes.io/batch-cpu": 1500})])
    ls = pod_meta("ns", "ls", "u2", "kubepods/podu2", koord_qos="LS",
                 containers=[container_meta("a", "c3", "z", requests={"kubernetes.io/batch-cpu": 999})])
    from_cri = pod_meta("ns", "be2", "u3", "kubepods/besteffort/podu3", kube_qos="besteffort", koord_qos="BE",
                        containers=[container_meta("main", "c4", "w")],
                        annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(
                            {"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "250"}}}})})
    broken = pod_meta("ns", "be3", "u4", "kubepods/besteffort/podu4", kube_qos="besteffort", koord_qos="BE",
                      containers=[container_meta("main", "c5", "v")],
                      annotations={"node.koordinator.sh/extended-resource-spec": "{not json"})
    env = make_env(pods=[be, ls, from_cri, broken])
    write_be(env, 1, "0-1", -1)
    assert be_value(BEResourceCollector(env).collect(1.0), mc.BE_ALLOCATION_REQUEST) == [2250]


# ---- pods --------------------------------------------------------------------------------

def pod_with_container(uid="u1") -> PodMeta:
    return pod_meta("default", f"pod-{uid}", uid, f"kubepods/burstable/pod{uid}",
                   containers=[container_meta("main", f"cid-{uid}", f"kubepods/burstable/pod{uid}/cid-{uid}")])


@pytest.mark.parametrize("version", [1, 2])
def test_pod_resource_as_upstream(make_env, version):
    # Test_collector_collectPodResUsed: 1e9 ns in 1 s = 1 core; inactive_anon 104857600 = 100 MiB.
    pod = pod_with_container()
    env = make_env(version, pods=[pod])
    root = env.cgroups.root
    for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
        write_usage(root, rel, version, cpu_ns=0, memory_stat=memory_stat_text(version, 104857600, file=5 * MiB))
    c = PodResourceCollector(env)
    first = by_kind(c.collect(50.0))
    assert mc.POD_CPU_USAGE not in first and mc.CONTAINER_CPU_USAGE not in first
    assert first[mc.POD_MEMORY_USAGE][0].value == 100 * MiB
    for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
        write_usage(root, rel, version, cpu_ns=10**9, memory_stat=memory_stat_text(version, 104857600, file=5 * MiB))
    got = by_kind(c.collect(51.0))
    assert got[mc.POD_CPU_USAGE][0].value == pytest.approx(1.0)
    assert got[mc.POD_CPU_USAGE][0].labels == {mc.POD_UID: "u1"}
    assert got[mc.CONTAINER_CPU_USAGE][0].value == pytest.approx(1.0)
    assert got[mc.CONTAINER_CPU_USAGE][0].labels == {mc.CONTAINER_ID: "cid-u1"}
    assert got[mc.CONTAINER_MEMORY_USAGE][0].value == 100 * MiB
    assert mc.POD_MEMORY_USAGE_WITH_PAGE_CACHE not in got
    assert env.shared.pods["PodResource"] == Point(pytest.approx(1.0), 100 * MiB, 51.0)


def test_pod_counter_going_backwards_logged_once_no_sample(make_env, caplog):
    pod = pod_with_container()
    env = make_env(pods=[pod])
    c = PodResourceCollector(env)

    def write(ns):
        for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
            write_usage(env.cgroups.root, rel, 1, cpu_ns=ns, memory_stat=memory_stat_text(1, MiB))

    for t, ns in enumerate((5 * 10**9, 10**9, 5 * 10**8, 10**9)):
        write(ns)
        got = by_kind(c.collect(float(t)))
        if t in (1, 2):
            assert mc.POD_CPU_USAGE not in got and mc.CONTAINER_CPU_USAGE not in got
    assert got[mc.POD_CPU_USAGE][0].value == pytest.approx(0.5)  # counting anew from 5e8
    lines = [r.getMessage() for r in caplog.records if "went backwards" in r.getMessage()]
    assert len(lines) == 2  # pod and container, once each over two backward steps
    assert lines[0].startswith("pod default/pod-u1: CPU time went backwards")
    assert lines[1].startswith("pod default/pod-u1 container main: CPU time went backwards")


def test_pod_resource_page_cache_when_enabled(make_env):
    pod = pod_with_container()
    env = make_env(pods=[pod], enable_pagecache_collector=True)
    for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
        write_usage(env.cgroups.root, rel, 1, cpu_ns=0, memory_stat=memory_stat_text(1, MiB, file=2 * MiB))
    got = by_kind(PodResourceCollector(env).collect(1.0))
    assert got[mc.POD_MEMORY_USAGE_WITH_PAGE_CACHE][0].value == 3 * MiB
    assert got[mc.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE][0].value == 3 * MiB


def test_pod_resource_waits_for_sync(make_env):
    env = make_env(pods=[pod_with_container()])
    env.pods.synced = False
    assert list(PodResourceCollector(env).collect(1.0)) == []


def test_hostile_pod_files_logged_once_per_cause(make_env, caplog):
    good, garbage, vanished = pod_with_container("good"), pod_with_container("bad"), pod_with_container("gone")
    env = make_env(pods=[good, garbage, vanished])
    root = env.cgroups.root
    for pod in (good, garbage):
        for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
            write_usage(root, rel, 1, cpu_ns=0, memory_stat=memory_stat_text(1, MiB))
    (root / "cpuacct" / garbage.cgroup_dir / "cpuacct.usage").write_text("garbage\n")
    (root / "memory" / garbage.containers[0].cgroup_dir / "memory.stat").write_text("\x00" * 100)
    c = PodResourceCollector(env)
    caplog.set_level(logging.DEBUG)
    for t in range(5):
        got = c.collect(float(t))
    uids = {s.labels.get(mc.POD_UID) for s in got if s.kind == mc.POD_MEMORY_USAGE}
    assert uids == {"good"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per cause over five ticks: the pod's file, its container's
    assert "pod default/pod-bad:" in warnings[0] and "cpuacct.usage" in warnings[0]
    assert "pod default/pod-bad container main:" in warnings[1] and "memory.stat" in warnings[1]
    missing = [r for r in caplog.records if "pod-gone" in r.getMessage()]
    # A stopping pod is normal: debug level, once for the pod and once for its container.
    assert len(missing) == 2 and {r.levelno for r in missing} == {logging.DEBUG}


def test_container_garbage_logged_with_container_name(make_env, caplog):
    pod = pod_with_container()
    env = make_env(pods=[pod])
    root = env.cgroups.root
    for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
        write_usage(root, rel, 1, cpu_ns=0, memory_stat=memory_stat_text(1, MiB))
    (root / "memory" / pod.containers[0].cgroup_dir / "memory.stat").write_text("total_rss x\n")
    got = by_kind(PodResourceCollector(env).collect(1.0))
    assert mc.CONTAINER_MEMORY_USAGE not in got and mc.POD_MEMORY_USAGE in got
    assert "pod default/pod-u1 container main" in caplog.text and "memory.stat" in caplog.text


def test_pod_cgroup_escaping_the_root_is_refused(make_env, caplog):
    pod = pod_meta("ns", "evil", "u9", "../../etc")
    env = make_env(pods=[pod])
    assert list(PodResourceCollector(env).collect(1.0)) == []
    assert "leaves the cgroup root" in caplog.text


def test_pod_targets_follow_the_informer_and_are_reused_while_it_stands(make_env):
    a, b = pod_with_container("a"), pod_with_container("b")
    stopped = pod_meta("default", "pod-s", "s", "kubepods/pods", running=False)
    env = make_env(pods=[a, stopped, b])
    targets = env.pod_targets()
    assert [(t.id, t.who) for t in targets] == [
        ("a", "pod default/pod-a"), (a.containers[0].id, "pod default/pod-a container main"),
        ("b", "pod default/pod-b"), (b.containers[0].id, "pod default/pod-b container main")]
    assert env.pod_targets() is targets  # the same pods: the same list
    env.pods.pods = [b]
    assert [t.id for t in env.pod_targets()] == ["b", b.containers[0].id]
    env.pods.pods = [a, b]  # as many pods as before, other objects
    assert [t.id for t in env.pod_targets()][::2] == ["a", "b"]


# ---- throttling --------------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_pod_throttled_ratio(make_env, version):
    pod = pod_with_container()
    env = make_env(version, pods=[pod])
    root = env.cgroups.root

    def write(periods, throttled):
        for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
            write_usage(root, rel, version, cpu_ns=0, memory_stat=memory_stat_text(version, 0),
                        nr_periods=periods, nr_throttled=throttled)

    c = PodThrottledCollector(env)
    write(10, 2)
    assert list(c.collect(1.0)) == []
    write(20, 7)
    got = by_kind(c.collect(2.0))
    assert got[mc.POD_CPU_THROTTLED][0].value == 0.5
    assert got[mc.CONTAINER_CPU_THROTTLED][0].value == 0.5
    got = by_kind(c.collect(3.0))  # no period passed
    assert got[mc.POD_CPU_THROTTLED][0].value == 0.0


@pytest.mark.parametrize("version, files_per_target", [(1, 3), (2, 2)])
def test_a_tick_reads_each_cgroup_file_once(make_env, version, files_per_target):
    """The pod collectors of one advisor tick share what they read: on cgroup v2 CPU time and
    throttling both come from cpu.stat, read once; outside a tick nothing is kept."""
    pod = pod_with_container()
    env = make_env(version, pods=[pod])
    advisor = MetricsAdvisor(env.config, env.pods, env.cache, env.cgroups)
    advisor.env = env
    env.clock = lambda: 100.0 + len(done)
    done: list[int] = []
    collectors = [PodResourceCollector(env), PodThrottledCollector(env)]
    read: list[str] = []
    real = env.files.read_all
    env.files.read_all = lambda paths, limit: read.extend(paths) or real(paths, limit)  # type: ignore[method-assign]
    for t, (ns, periods, throttled) in enumerate([(0, 10, 2), (10**9, 20, 7)]):
        for rel in (pod.cgroup_dir, pod.containers[0].cgroup_dir):
            write_usage(env.cgroups.root, rel, version, cpu_ns=ns, memory_stat=memory_stat_text(version, MiB),
                        nr_periods=periods, nr_throttled=throttled)
        read.clear()
        if t == 0:
            for c in collectors:
                c.collect(env.clock())  # no tick: each reads for itself
            assert len(read) == 2 * 3
        else:
            advisor.tick(collectors)
        done.append(t)
    assert len(read) == 2 * files_per_target and len(set(read)) == len(read)
    now = 10**10
    assert env.cache.last_by(mc.CONTAINER_CPU_THROTTLED, mc.CONTAINER_ID, ["cid-u1"], 0, now) == {"cid-u1": 0.5}
    assert env.cache.last_by(mc.CONTAINER_CPU_USAGE, mc.CONTAINER_ID, ["cid-u1"], 0, now) == {"cid-u1": 1.0}


# ---- PSI ---------------------------------------------------------------------------------

def test_psi_gate_off_by_default_and_samples_when_on(make_env):
    assert not PSICollector(make_env()).enabled()
    pod = pod_meta("ns", "p", "u1", "kubepods/podu1")
    env = make_env(2, pods=[pod], psi_collector=True)
    d = env.cgroups.root / pod.cgroup_dir
    d.mkdir(parents=True)
    (d / "cpu.pressure").write_text("some avg10=1.50 avg60=0 avg300=0 total=1\n"
                                    "full avg10=0.5 avg60=0 avg300=0 total=1\n")
    (d / "memory.pressure").write_text("some avg10=2.00 avg60=0 avg300=0 total=1\n")
    (d / "io.pressure").write_text("some avg10=0.00 avg60=0 avg300=0 total=1\n")
    got = {(s.labels[mc.PSI_RESOURCE], s.labels[mc.PSI_DEGREE]): s.value for s in PSICollector(env).collect(1.0)}
    assert got == {("cpu", "some"): 1.5, ("cpu", "full"): 0.5, ("mem", "some"): 2.0, ("io", "some"): 0.0}


def write_pressure(d: Path) -> None:
    """cpu with a full line, memory and io without (the some line only)."""
    d.mkdir(parents=True)
    (d / "cpu.pressure").write_text("some avg10=1.50 avg60=1.25 avg300=1.00 total=1\n"
                                    "full avg10=0.50 avg60=0.25 avg300=0.125 total=1\n")
    (d / "memory.pressure").write_text("some avg10=2.00 avg60=3.00 avg300=4.00 total=1\n")
    (d / "io.pressure").write_text("some avg10=0.00 avg60=0.75 avg300=0.5 total=1\n")


def test_psi_tick_is_served_as_upstreams_pod_and_container_gauges_and_a_pod_that_left_is_not(make_env):
    pod = pod_meta("ns", "web", "u1", "kubepods/podu1",
                   containers=[container_meta("app", "cid1", "kubepods/podu1/cid1")])
    env = make_env(2, pods=[pod], psi_collector=True)
    write_pressure(env.cgroups.root / "kubepods/podu1")
    write_pressure(env.cgroups.root / "kubepods/podu1/cid1")
    metrics = KoordletMetrics("n1")
    metrics.external.register(PSIGauges(env.shared, "n1"))
    collector = PSICollector(env)
    collector.collect(1.0)
    pod_labels = {"node": "n1", "pod_uid": "u1", "pod_name": "web", "pod_namespace": "ns"}
    want = {("cpu", "some", "avg10", "true"): 1.5, ("cpu", "some", "avg60", "true"): 1.25,
            ("cpu", "some", "avg300", "true"): 1.0, ("cpu", "full", "avg10", "true"): 0.5,
            ("cpu", "full", "avg60", "true"): 0.25, ("cpu", "full", "avg300", "true"): 0.125,
            ("mem", "some", "avg10", "false"): 2.0, ("mem", "some", "avg60", "false"): 3.0,
            ("mem", "some", "avg300", "false"): 4.0, ("io", "some", "avg10", "false"): 0.0,
            ("io", "some", "avg60", "false"): 0.75, ("io", "some", "avg300", "false"): 0.5}
    for name, labels in (("koordlet_pod_psi", pod_labels),
                         ("koordlet_container_psi", {**pod_labels, "container_id": "cid1", "container_name": "app"})):
        got = samples(metrics, "/external-metrics", name)
        assert got == {labelled(**labels, psi_resource_type=r, psi_degree=d, psi_precision=p, cpu_full_supported=f): v
                       for (r, d, p, f), v in want.items()}, name
    assert "koordlet_pod_psi" not in scrape(metrics, "/internal-metrics")
    env.pods.pods = []
    collector.collect(2.0)
    assert "psi" not in scrape(metrics, "/external-metrics")


# ---- node info ---------------------------------------------------------------------------

def test_node_info_topology(make_env):
    env = make_env()
    # 2 sockets x 2 cores x 2 threads; NUMA node per socket; cpu 7 offline.
    layout = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)}
    (env.proc / "cpuinfo").write_text("".join(f"processor : {c}\n\n" for c in range(7)))
    base = env.sys / "devices/system/cpu"
    for cpu, (socket, core) in layout.items():
        topo = base / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (topo / "core_id").write_text(f"{core}\n")
    (base / "online").write_text("0-6\n")
    for node, cpus in ((0, "0-1,4-5"), (1, "2-3,6-7")):
        d = env.sys / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {node} MemTotal: 1024 kB\n")
    NodeInfoCollector(env).collect(1.0)
    info = env.cache.get_kv(mc.NODE_CPU_INFO)
    assert info["total_cpus"] == 8
    procs = {p["cpu"]: p for p in info["processors"]}
    assert procs[4] == {"cpu": 4, "core": 0, "socket": 0, "node": 0, "online": True}
    assert procs[2]["core"] != procs[0]["core"]  # socket 1's core 0 is another core
    assert procs[2]["core"] == procs[6]["core"] and procs[2]["node"] == 1
    assert procs[7]["online"] is False
    numa = env.cache.get_kv(mc.NODE_NUMA_INFO)
    assert numa == {"nodes": [{"id": 0, "cpus": [0, 1, 4, 5], "memory_total_bytes": 1048576},
                              {"id": 1, "cpus": [2, 3, 6, 7], "memory_total_bytes": 1048576}]}


def test_node_info_from_cpuinfo_alone(make_env):
    env = make_env()
    (env.proc / "cpuinfo").write_text("processor : 0\nphysical id : 0\ncore id : 0\n\n"
                                      "processor : 1\nphysical id : 0\ncore id : 1\n")
    NodeInfoCollector(env).collect(1.0)
    info = env.cache.get_kv(mc.NODE_CPU_INFO)
    assert info == {"total_cpus": 2, "processors": [
        {"cpu": 0, "core": 0, "socket": 0, "node": 0, "online": True},
        {"cpu": 1, "core": 1, "socket": 0, "node": 0, "online": True}]}


@pytest.mark.parametrize("cpuinfo,want", [
    ("processor : 0\n", {("node_cpu_info", "succeeded"): 2, ("node_numa_info", "succeeded"): 2}),
    ("", {("node_cpu_info", "failed"): 2}),  # no processors: nothing stored, no NUMA info either
])
def test_node_info_outcomes_are_counted_for_upstreams_status_counters(make_env, cpuinfo, want):
    env = make_env()
    (env.proc / "cpuinfo").write_text(cpuinfo)
    for _ in range(2):
        try:
            NodeInfoCollector(env).collect(1.0)
        except FileProblem:
            pass
    assert env.shared.outcomes == want


# ---- host applications -------------------------------------------------------------------

@pytest.mark.parametrize("app, want", [
    ({"name": "nginx", "qos": "LS"}, "host-latency-sensitive/nginx"),
    ({"name": "batch", "qos": "BE"}, "host-best-effort/batch"),
    ({"name": "agent"}, "agent"),
    ({"name": "x", "cgroupPath": {"base": "KubepodsBesteffort", "parentDir": "host/", "relativePath": "x"}},
     "kubepods/besteffort/host/x"),
    ({"name": "y", "cgroupPath": {"relativePath": "system.slice/y"}}, "system.slice/y"),
])
def test_host_application_dirs(make_env, app, want):
    (parsed,) = parse_host_apps({"hostApplications": [app]})
    assert HostApplicationCollector(make_env()).app_dir(parsed) == want


def test_host_application_samples_and_totals(make_env):
    slo = {"spec": {"hostApplications": [{"name": "nginx", "qos": "LS"}]}}
    env = make_env(node_slo=slo)
    write_usage(env.cgroups.root, "host-latency-sensitive/nginx", 1, cpu_ns=0,
                memory_stat=memory_stat_text(1, 128 * MiB, file=MiB))
    c = HostApplicationCollector(env)
    c.collect(1.0)
    write_usage(env.cgroups.root, "host-latency-sensitive/nginx", 1, cpu_ns=10**8,
                memory_stat=memory_stat_text(1, 128 * MiB, file=MiB))
    got = by_kind(c.collect(2.0))
    assert got[mc.HOST_APPLICATION_CPU_USAGE][0].value == pytest.approx(0.1)
    assert got[mc.HOST_APPLICATION_MEMORY_USAGE][0].labels == {mc.HOST_APP_NAME: "nginx"}
    assert got[mc.HOST_APPLICATION_MEMORY_USAGE_WITH_PAGE_CACHE][0].value == 129 * MiB
    assert env.shared.host_apps == Point(pytest.approx(0.1), 128 * MiB, 2.0)


def test_host_application_tick_is_served_as_upstreams_usage_gauge_and_an_app_no_longer_named_is_not(make_env):
    slo = {"spec": {"hostApplications": [{"name": "nginx", "priority": "koord-prod", "qos": "LS"},
                                         {"name": "agent", "qos": "LSR"}]}}
    env = make_env(node_slo=slo)
    metrics = KoordletMetrics("n1")
    metrics.registry.register(HostAppGauges(env.shared, "n1"))
    for name in ("nginx", "agent"):
        write_usage(env.cgroups.root, f"host-latency-sensitive/{name}", 1, cpu_ns=0,
                    memory_stat=memory_stat_text(1, 64 * MiB, file=MiB))
    c = HostApplicationCollector(env)
    c.collect(1.0)
    assert "koordlet_host_application_resource_usage" not in scrape(metrics, "/metrics")  # no CPU rate yet
    write_usage(env.cgroups.root, "host-latency-sensitive/nginx", 1, cpu_ns=2 * 10**8,
                memory_stat=memory_stat_text(1, 128 * MiB, file=MiB))
    c.collect(2.0)
    got = samples(metrics, "/internal-metrics", "koordlet_host_application_resource_usage")
    nginx = {"node": "n1", "host_application_name": "nginx", "priority_class": "koord-prod", "qos": "LS"}
    agent = {"node": "n1", "host_application_name": "agent", "priority_class": "", "qos": "LSR"}
    assert got == {labelled(**nginx, resource="cpu"): pytest.approx(0.2),
                   labelled(**nginx, resource="memory"): 128 * MiB,
                   labelled(**agent, resource="cpu"): 0, labelled(**agent, resource="memory"): 64 * MiB}
    env.pods.node_slo = {"spec": {"hostApplications": [{"name": "agent", "qos": "LSR"}]}}
    c.collect(3.0)
    got = samples(metrics, "/internal-metrics", "koordlet_host_application_resource_usage")
    assert set(got) == {labelled(**agent, resource="cpu"), labelled(**agent, resource="memory")}


def test_host_application_without_node_slo_still_reports_zero(make_env):
    env = make_env(node_slo=None)
    assert list(HostApplicationCollector(env).collect(5.0)) == []
    assert env.shared.host_apps == Point(0.0, 0.0, 5.0)


# ---- framework ---------------------------------------------------------------------------

def test_rates_prime_backwards_and_ttl():
    r = Rates(ttl=20)
    assert r.rate("a", 100, 0) is None
    assert r.rate("a", 200, 1) == 100
    assert r.rate("a", 50, 2) is None  # went backwards: re-primed
    assert r.rate("a", 150, 3) == 100
    assert r.rate("a", 300, 30) is None  # too old to difference
    assert r.rate("a", 300, 30) is None  # dt == 0


def _target(tid: str) -> CgroupTarget:
    pod = pod_meta("ns", tid, "u-" + tid, "kubepods/x")
    return CgroupTarget(pod, None, "kubepods/x", tid, f"pod ns/{tid}")


@pytest.mark.parametrize("name, ticks, want", [
    ("first value primes", [(0, 100)], [None]),
    ("per second", [(0, 100), (2, 300)], [None, 100.0]),
    ("backwards re-primes", [(0, 100), (1, 50), (2, 150)], [None, None, 100.0]),
    ("too old to difference", [(0, 100), (30, 300)], [None, None]),
    ("no time passed", [(0, 100), (0, 300)], [None, None]),
])
def test_rates_in_one_call_as_rate(name, ticks, want):
    """``Rates.rates`` (a tick's counters in one call) gives what ``rate`` gives one by one."""
    batch, single = Rates(ttl=20), Rates(ttl=20)
    got = [batch.rates(["a", "b"], [value, 2 * value], now, ["pod a", "pod b"]) for now, value in ticks]
    assert [a for a, _ in got] == want == [single.rate("a", value, now) for now, value in ticks]
    assert [b for _, b in got] == [None if a is None else 2 * a for a in want]  # keys kept apart


@pytest.mark.parametrize("name, ticks, want", [
    ("first pair primes", [(0, (10, 1))], [None]),
    ("differences", [(0, (10, 1)), (1, (20, 4))], [None, (10, 3)]),
    ("either counter backwards re-primes", [(0, (10, 1)), (1, (20, 0)), (2, (30, 2))], [None, None, (10, 2)]),
    ("too old to difference", [(0, (10, 1)), (25, (20, 4))], [None, None]),
])
def test_deltas_of_counter_pairs(name, ticks, want, caplog):
    r = Rates(ttl=20, problems=collector_problems(logging.getLogger("t")), counter="cpu.stat")
    assert [r.deltas(["a"], [pair], now, ["pod ns/a"])[0] for now, pair in ticks] == want
    assert ("backwards" in name) == any("pod ns/a: cpu.stat went backwards" in m for m in caplog.messages)


def test_readable_drops_and_logs_targets_with_a_problem(make_env, caplog):
    env = make_env()
    collector = PodResourceCollector(env)
    targets = [_target(t) for t in "abc"]
    problem = FileProblem(Path("/x/memory.stat"), "not UTF-8 text")
    same = collector.readable(targets, [1, 2, 3], [4, 5, 6])
    assert same[0] is targets and same[1:] == ([1, 2, 3], [4, 5, 6])
    assert collector.readable(targets, [1, problem, 3], [4, 5, 6]) == (
        [targets[0], targets[2]], [1, 3], [4, 6])
    assert any("pod ns/b: /x/memory.stat: not UTF-8 text" in m for m in caplog.messages)


@pytest.mark.parametrize("driver, kube_dir, qos, want", [
    ("cgroupfs", "kubepods/", "besteffort", "kubepods/besteffort"),
    ("cgroupfs", "kubepods/", "guaranteed", "kubepods"),
    ("cgroupfs", "test/kubepods", "burstable", "test/kubepods/burstable"),
    ("systemd", "kubepods/", "besteffort", "kubepods.slice/kubepods-besteffort.slice"),
    ("systemd", "kubepods.slice", "guaranteed", "kubepods.slice"),
])
def test_kube_qos_dirs_follow_the_pod_layout(make_env, driver, kube_dir, qos, want):
    env = make_env(kube_dir=kube_dir, driver=driver)
    assert env.kube_qos_dir(qos) == want
