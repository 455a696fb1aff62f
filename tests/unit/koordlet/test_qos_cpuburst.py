"""CPUBurst: upstream's cpu_burst_test tables (node state, config merge, static burst,
cfs quota burst, limiter) over the pure calculator and, for what is written, a fake cgroup
tree through the real strategy and executor."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.apis.extension import ANNOTATION_POD_CPU_BURST
from koord.koordlet.qosmanager.burstcalc import (
    BurstConfig,
    BurstError,
    BurstLimiter,
    BurstStrategy,
    NodeState,
    Policy,
    burst_strategy,
    pod_burst_config,
    share_pool_state,
)
from koord.koordlet.qosmanager.cpuburst import REREAD_ROUNDS, CPUBurst
from koord.koordlet.statesinformer import NODE_SLO, PodMeta
from koord_testing.pods import with_resources

from .qos_fakes import pod
from .test_qos_strategies import Rig

BASE = 100000
AUTO = BurstConfig(Policy.AUTO, 1000, 300, -1)


# ---- TestCPUBurst_getNodeStateForBurst (16 cpus, threshold 50%) -----------------------------
@pytest.mark.parametrize("name, node_used, cpus, lsr_request, excluded_used, state", [
    ("get-unknown-status-because-of-nil-node-metric", None, 16, 0, 0.0, NodeState.UNKNOWN),
    ("get-unknown-status-because-of-lack-node-info", 6.0, None, 0, 0.0, NodeState.UNKNOWN),
    # pool = 16 - 8 (LSR request) = 8 cpus; used = node 10 - LSR's
    ("get-idle-status-with-lsr-pod", 10.0, 16, 8000, 7.0, NodeState.IDLE),        # 3/8
    ("get-overload-status-with-lsr-pod", 10.0, 16, 8000, 5.0, NodeState.OVERLOAD),  # 5/8
    ("get-cooling-status-with-lsr-pod", 10.0, 16, 8000, 6.25, NodeState.COOLING),   # 3.75/8
])
def test_share_pool_state(name, node_used, cpus, lsr_request, excluded_used, state) -> None:
    assert share_pool_state(node_used, cpus, lsr_request, excluded_used, 50)[0] is state


# ---- Test_genPodBurstConfig -------------------------------------------------------------------
NODE_CFG = BurstConfig(Policy.AUTO, 1000, 300, 600)


@pytest.mark.parametrize("name, annotation, want", [
    ("use-node-config", None, NODE_CFG),
    ("use-pod-config", {"policy": "auto", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                        "cfsQuotaBurstPeriodSeconds": 600}, NODE_CFG),
    ("merge-pod-config", {"policy": "cpuBurstOnly", "cpuBurstPercent": 500},
     BurstConfig(Policy.CPU_BURST_ONLY, 500, 300, 600)),
    ("pod-opts-out", {"policy": "none"}, BurstConfig(Policy.NONE, 1000, 300, 600)),
])
def test_pod_burst_config(name, annotation, want) -> None:
    annotations = {} if annotation is None else {ANNOTATION_POD_CPU_BURST: json.dumps(annotation)}
    assert pod_burst_config(annotations, NODE_CFG) == want


@pytest.mark.parametrize("text, field", [
    ("{bad", "bad JSON"), ("[1]", "want an object"), ('{"policy": "always"}', "policy"),
    ('{"cpuBurstPercent": -1}', "cpuBurstPercent"), ('{"cpuBurstPercent": true}', "cpuBurstPercent"),
    ('{"cfsQuotaBurstPeriodSeconds": -2}', "cfsQuotaBurstPeriodSeconds"), ("x" * 5000, "at most"),
])
def test_bad_pod_annotation_names_the_field(text: str, field: str) -> None:
    with pytest.raises(BurstError, match=field) as info:
        pod_burst_config({ANNOTATION_POD_CPU_BURST: text}, NODE_CFG)
    assert ANNOTATION_POD_CPU_BURST in str(info.value)


def test_node_slo_defaults_and_errors() -> None:
    assert burst_strategy({"spec": {}}) == BurstStrategy(BurstConfig(Policy.NONE, 1000, 300, -1), 50)
    assert burst_strategy({"spec": {"cpuBurstStrategy": {"policy": "auto", "sharePoolThresholdPercent": 70}}}) \
        == BurstStrategy(BurstConfig(Policy.AUTO, 1000, 300, -1), 70)
    for bad, field in (({"sharePoolThresholdPercent": 101}, "sharePoolThresholdPercent"),
                       ({"policy": 3}, "policy"), ("auto", "cpuBurstStrategy")):
        with pytest.raises(BurstError, match=field):
            burst_strategy({"spec": {"cpuBurstStrategy": bad}})


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=4), max_leaves=12),
       st.sampled_from(["policy", "cpuBurstPercent", "cfsQuotaBurstPercent", "cfsQuotaBurstPeriodSeconds",
                        "sharePoolThresholdPercent"]))
def test_any_input_is_a_config_or_a_named_error(value, key) -> None:
    for raw in (value, {key: value}):
        try:
            strategy = burst_strategy({"spec": {"cpuBurstStrategy": raw}})
            config = pod_burst_config({ANNOTATION_POD_CPU_BURST: json.dumps(raw)}, NODE_CFG)
        except BurstError:
            continue
        assert strategy is not None and 0 <= strategy.share_pool_threshold_percent <= 100
        assert config.policy in Policy and config.cfs_quota_burst_period_seconds >= -1


# ---- Test_burstLimiter_Allow / UpdateIfChanged --------------------------------------------------
@pytest.mark.parametrize("name, period, max_percent, init_ratio, elapsed, usage, allow, tokens", [
    ("consume-enough-token-with-full-init", 100, 150, 1, 10, 150, True, 4500),
    ("consume-not-enough-token-with-part-init", 100, 150, 0.01, 10, 200, False, -950),
    ("consume-not-enough-token-to-bottom-with-part-init", 10, 150, 0.01, 10, 200, False, -500),
    ("accumulate-token-with-part-init", 100, 150, 0.1, 10, 40, True, 1100),
    ("accumulate-token-to-ceil-with-part-init", 100, 150, 0.9, 10, 40, True, 5000),
])
def test_limiter_allow(name, period, max_percent, init_ratio, elapsed, usage, allow, tokens) -> None:
    limiter = BurstLimiter(period, max_percent, now=1000.0)
    limiter.tokens = int(limiter.capacity * init_ratio)
    limiter.last = 1000.0 - elapsed
    assert limiter.allow(1000.0, usage) == (allow, tokens)


def test_limiter_update_if_changed() -> None:
    limiter = BurstLimiter(600, 300, now=0.0)
    limiter.update_if_changed(300, 200, now=0.0)
    assert limiter.capacity == 300 * 100
    assert limiter.expired(601.0) and not limiter.expired(600.0)


# ---- the strategy on a fake v1 tree -------------------------------------------------------------
def burst_pod(uid: str, limits: list[int | None], koord_qos: str = "LS", annotations: dict | None = None) -> PodMeta:
    p = pod(uid, koord_qos, "burstable", containers=len(limits), annotations=annotations)
    for i, limit in enumerate(limits):
        if limit is not None:
            p = with_resources(p, i, limits={"cpu": limit})
    return p


def make_rig(tmp_path: Path, pods: list[PodMeta], *, burst_file: bool = True,
             pod_quota: int = -1, container_quotas: list[int] | None = None) -> tuple[Rig, CPUBurst]:
    rig = Rig(tmp_path, pods, gates={"BECPUSuppress": False, "CPUBurst": True})
    for p in pods:
        rig.write(p.cgroup_dir, "cpu", "cpu.cfs_quota_us", str(pod_quota))
        for i, c in enumerate(p.containers):
            rig.write(c.cgroup_dir, "cpu", "cpu.cfs_quota_us", str((container_quotas or [-1] * 9)[i]))
        if burst_file:
            for d in (p.cgroup_dir, *(c.cgroup_dir for c in p.containers)):
                rig.write(d, "cpu", "cpu.cfs_burst_us", "0")
    strategy = rig.strategy("CPUBurst")
    assert isinstance(strategy, CPUBurst)
    return rig, strategy


def bursts(rig: Rig, p: PodMeta) -> tuple[int, list[int]]:
    return (int(rig.file(p.cgroup_dir, "cpu", "cpu.cfs_burst_us")),
            [int(rig.file(c.cgroup_dir, "cpu", "cpu.cfs_burst_us")) for c in p.containers])


def quotas(rig: Rig, p: PodMeta) -> tuple[int, list[int]]:
    return (int(rig.file(p.cgroup_dir, "cpu", "cpu.cfs_quota_us")),
            [int(rig.file(c.cgroup_dir, "cpu", "cpu.cfs_quota_us")) for c in p.containers])


# TestCPUBurst_applyCPUBurst: limits 5 and 3 cores, unlimited quotas (nothing to clamp to)
@pytest.mark.parametrize("name, config, limits, want", [
    ("apply-by-default-burst-config", AUTO, [5000, 3000], (8 * 10 * BASE, [5 * 10 * BASE, 3 * 10 * BASE])),
    ("apply-by-specified-burst-config", BurstConfig(Policy.AUTO, 500), [5000, 3000],
     (8 * 5 * BASE, [5 * 5 * BASE, 3 * 5 * BASE])),
    ("apply-by-disabled-burst-config", BurstConfig(Policy.CFS_QUOTA_BURST_ONLY, 500), [5000, 3000], (0, [0, 0])),
    ("apply-by-unlimited-container", AUTO, [None, 3000], (3 * 10 * BASE, [0, 3 * 10 * BASE])),
])
def test_apply_cpu_burst(tmp_path: Path, name, config, limits, want) -> None:
    p = burst_pod("p1", limits)
    rig, strategy = make_rig(tmp_path, [p])
    strategy.apply_pod(p, config, NodeState.IDLE)
    assert bursts(rig, p) == want
    for c, value in zip(p.containers, want[1], strict=True):
        if value:
            assert rig.metric("koordlet_container_scaled_cfs_burst_us", pod_namespace="default",
                              pod_name="p1", container_id=c.id, container_name=c.name) == value


def test_burst_is_clamped_to_the_quota_and_said_once(tmp_path: Path, caplog) -> None:
    """Mainline kernels refuse a burst above the quota: 1000% of 2 cores is clamped to 200000."""
    p = burst_pod("p1", [2000])
    rig, strategy = make_rig(tmp_path, [p], pod_quota=200000, container_quotas=[200000])
    for _ in range(3):
        strategy.apply_pod(p, BurstConfig(Policy.CPU_BURST_ONLY), NodeState.IDLE)
    assert bursts(rig, p) == (200000, [200000])
    assert sum("clamped" in r.message for r in caplog.records) == 1


# TestCPUBurst_applyCFSQuotaBurst: one container of 2 cores (base 200000, ceiling 300%)
# unless said otherwise; "throttled" is the container's last throttled ratio.
@pytest.mark.parametrize("name, config, state, throttled, pod_quota, current, want_pod, want", [
    ("scale-reset-for-burst-config-disabled-on-idle-state", BurstConfig(Policy.CPU_BURST_ONLY), NodeState.IDLE,
     0.5, 400000, [400000], 200000, [200000]),
    ("scale-remain-for-throttled-pod-on-cooling-state", AUTO, NodeState.COOLING, 0.5, 400000, [400000],
     400000, [400000]),
    ("scale-down-to-base-for-throttled-pod-on-overload-state", AUTO, NodeState.OVERLOAD, 0.5, 202000, [202000],
     200000, [200000]),
    ("scale-down-for-throttled-pod-on-overload-state", AUTO, NodeState.OVERLOAD, 0.5, 400000, [400000],
     320000, [320000]),
    ("scale-down-because-burst-period-config-zero-on-idle-state", BurstConfig(Policy.AUTO, 1000, 300, 0),
     NodeState.IDLE, 0.5, 400000, [400000], 320000, [320000]),
    ("scale-reset-because-burst-percent-config-illegal-on-idle-state", BurstConfig(Policy.AUTO, 1000, 90, -1),
     NodeState.IDLE, 0.5, 400000, [400000], 200000, [200000]),
    ("scale-remain-because-not-throttled-on-idle-state", AUTO, NodeState.IDLE, 0.0, 580000, [580000],
     580000, [580000]),
    ("scale-up-limit-by-ceil-on-idle-state", AUTO, NodeState.IDLE, 0.5, 580000, [580000], 600000, [600000]),
    ("scale-up-from-base-on-idle-state", AUTO, NodeState.IDLE, 0.5, 200000, [200000], 240000, [240000]),
    ("scale-up-two-container-from-base-on-idle-state", AUTO, NodeState.IDLE, 0.5, 500000, [200000, 300000],
     600000, [240000, 360000]),
    ("scale-up-one-container-in-unlimited-pod-from-base-on-idle-state", AUTO, NodeState.IDLE, 0.5, -1,
     [200000], -1, [240000]),
    # ours: a quota another writer lowered below the base is not raised back by reset/remain
    ("reset-keeps-a-quota-below-the-base", BurstConfig(Policy.NONE), NodeState.IDLE, 0.5, 166667, [166667],
     166667, [166667]),
])
def test_apply_cfs_quota_burst(tmp_path: Path, name, config, state, throttled, pod_quota, current,
                               want_pod, want) -> None:
    p = burst_pod("p1", [2000, 3000][:len(current)])
    rig, strategy = make_rig(tmp_path, [p], burst_file=False, pod_quota=pod_quota, container_quotas=current)
    for c in p.containers:
        rig.sample("container_cpu_throttled", throttled, container_id=c.id)
    strategy.apply_pod(p, config, state)
    assert quotas(rig, p) == (want_pod, want)


def test_quota_lowered_below_the_burst_lowers_the_burst_first(tmp_path: Path) -> None:
    """auto on an overloaded node: quota 400000 -> 320000 while the burst is 400000."""
    p = burst_pod("p1", [2000])
    rig, strategy = make_rig(tmp_path, [p], pod_quota=400000, container_quotas=[400000])
    rig.write(p.containers[0].cgroup_dir, "cpu", "cpu.cfs_burst_us", "400000")
    rig.sample("container_cpu_throttled", 0.5, container_id=p.containers[0].id)
    strategy.apply_pod(p, AUTO, NodeState.OVERLOAD)
    assert quotas(rig, p) == (320000, [320000])
    assert bursts(rig, p) == (320000, [320000])


# TestCPUBurst_start: LSR and BE pods are left alone, an LS pod is scaled, by NodeSLO
def test_run_once_follows_node_slo_and_skips_lsr_and_be(tmp_path: Path) -> None:
    ls, lsr, be = burst_pod("ls", [2000]), burst_pod("lsr", [2000], "LSR"), burst_pod("be", [2000], "BE")
    opted_out = burst_pod("out", [2000], annotations={ANNOTATION_POD_CPU_BURST: '{"policy": "none"}'})
    pods = [ls, lsr, be, opted_out]
    rig, strategy = make_rig(tmp_path, pods, pod_quota=200000, container_quotas=[200000])
    rig.cache.set_kv("node_cpu_info", {"processors": [{"cpu": i} for i in range(16)]})
    rig.sample("node_cpu_usage", 2.0)
    for p in pods:
        rig.sample("container_cpu_throttled", 0.5, container_id=p.containers[0].id)
    strategy.run_once()
    assert quotas(rig, ls) == (200000, [200000])  # no NodeSLO: nothing
    rig.informer.set_object(NODE_SLO, {"spec": {"cpuBurstStrategy": {"policy": "auto"}}})
    strategy.run_once()
    assert quotas(rig, ls) == (240000, [240000]) and bursts(rig, ls) == (240000, [240000])
    for p in (lsr, be, opted_out):
        assert quotas(rig, p) == (200000, [200000]) and bursts(rig, p) == (0, [0])
    assert rig.metric("koordlet_cpu_burst_share_pool_usage_ratio") == pytest.approx(2 / 16)
    assert rig.metric("koordlet_container_scaled_cfs_quota_us", pod_namespace="default", pod_name="ls",
                      container_id=ls.containers[0].id, container_name="c0") == 240000


# ---- ours: a pod whose last pass wrote nothing is not passed over until something changed --------
def settled_rig(tmp_path: Path, policy: str) -> tuple[Rig, CPUBurst, PodMeta]:
    """An LS pod of two 2-core containers at kubelet's quota; two rounds: the first writes the
    bursts, the second finds everything as wanted."""
    p = burst_pod("p1", [2000, 2000])
    rig, strategy = make_rig(tmp_path, [p], pod_quota=400000, container_quotas=[200000, 200000])
    rig.cache.set_kv("node_cpu_info", {"processors": [{"cpu": i} for i in range(16)]})
    rig.sample("node_cpu_usage", 2.0)
    rig.informer.set_object(NODE_SLO, {"spec": {"cpuBurstStrategy": {"policy": policy}}})
    strategy.run_once()
    strategy.run_once()
    return rig, strategy, p


def rounds_until(strategy: CPUBurst, done, limit: int = 3 * REREAD_ROUNDS) -> int | None:
    for n in range(1, limit + 1):
        strategy.run_once()
        if done():
            return n
    return None


def relisted(rig: Rig, p: PodMeta, limit: int) -> None:
    """The pod list now says the first container's cpu limit is ``limit``."""
    rig.informer.pods_source.pods = [with_resources(p, 0, limits={"cpu": limit})]  # type: ignore[union-attr]
    assert rig.informer.sync_pods()


def outside_write(rig: Rig, p: PodMeta, quota: int = 400000) -> None:
    """kubelet or runc raising the first container's quota: not through this process."""
    rig.write(p.containers[0].cgroup_dir, "cpu", "cpu.cfs_quota_us", str(quota))


# policy cpuBurstOnly: quotas reset to the 200000 base, bursts 1000% of 2 cores clamped to it
@pytest.mark.parametrize("name, policy, change, want_quota, want_burst, rounds", [
    ("written-outside-this-process-noticed-at-the-reread", "cpuBurstOnly",
     lambda rig, s, p: outside_write(rig, p), 200000, 200000, REREAD_ROUNDS),
    ("written-by-this-process-noticed-next-round", "cpuBurstOnly",
     lambda rig, s, p: rig.executor.write(p.containers[0].cgroup_dir, "cpu_quota", 400000),
     200000, 200000, 1),
    ("pod-list-change-noticed-next-round", "cpuBurstOnly",
     lambda rig, s, p: relisted(rig, p, 1000), 100000, 100000, 1),
    ("pleg-change-noticed-next-round", "cpuBurstOnly",
     lambda rig, s, p: (outside_write(rig, p), rig.manager.cgroups_changed()), 200000, 200000, 1),
    ("node-slo-change-noticed-next-round", "cpuBurstOnly",
     lambda rig, s, p: rig.informer.set_object(NODE_SLO, {"spec": {"cpuBurstStrategy": {"policy": "none"}}}),
     200000, 0, 1),
    ("new-throttling-under-auto-noticed-next-round", "auto",
     lambda rig, s, p: rig.sample("container_cpu_throttled", 0.5, container_id=p.containers[0].id),
     240000, 240000, 1),
])
def test_settled_pod_notices_a_change(tmp_path: Path, name, policy, change, want_quota, want_burst,
                                      rounds) -> None:
    rig, strategy, p = settled_rig(tmp_path, policy)
    assert quotas(rig, p)[1][0] == 200000
    change(rig, strategy, p)
    c = p.containers[0].cgroup_dir
    assert rounds_until(strategy, lambda: (int(rig.file(c, "cpu", "cpu.cfs_quota_us")),
                                           int(rig.file(c, "cpu", "cpu.cfs_burst_us"))) == (want_quota, want_burst)) \
        == rounds


def test_settled_pod_keeps_its_gauges_and_loses_them_with_the_pod(tmp_path: Path) -> None:
    rig, strategy, p = settled_rig(tmp_path, "cpuBurstOnly")
    labels = {"pod_namespace": "default", "pod_name": "p1", "container_name": "c1", "container_id": p.containers[1].id}
    for _ in range(REREAD_ROUNDS + 1):
        strategy.run_once()
        assert rig.metric("koordlet_container_scaled_cfs_burst_us", **labels) == 200000
    rig.informer.pods_source.pods = []  # type: ignore[union-attr]
    rig.informer.sync_pods()
    strategy.run_once()
    assert rig.metric("koordlet_container_scaled_cfs_burst_us", **labels) is None


def test_failed_pass_is_tried_again_next_round(tmp_path: Path) -> None:
    """A container whose cgroup is not there yet fails its pass: it is not left for rounds
    when the dir appears without any other sign."""
    p = burst_pod("p1", [2000])
    rig, strategy = make_rig(tmp_path, [p], pod_quota=200000, container_quotas=[200000])
    rig.informer.set_object(NODE_SLO, {"spec": {"cpuBurstStrategy": {"policy": "cpuBurstOnly"}}})
    ctr = rig.root / "cpu" / p.containers[0].cgroup_dir
    (ctr / "cpu.cfs_quota_us").rename(ctr.parent / "saved")
    strategy.run_once()
    strategy.run_once()
    (ctr.parent / "saved").rename(ctr / "cpu.cfs_quota_us")
    strategy.run_once()
    assert bursts(rig, p) == (200000, [200000])


@pytest.mark.parametrize("case, level", [
    ("cgroup-gone", logging.DEBUG),  # the container left before the pod list said so: as upstream
    ("file-missing", logging.WARNING),  # its cgroup is there without the file
    ("unreadable", logging.WARNING),  # something else is wrong
])
def test_a_leaving_containers_cgroup_is_not_a_warning(tmp_path: Path, caplog, case, level) -> None:
    p = burst_pod("p1", [2000])
    rig, strategy = make_rig(tmp_path, [p], pod_quota=200000, container_quotas=[200000])
    cgroup = rig.root / "cpu" / p.containers[0].cgroup_dir
    if case == "cgroup-gone":
        shutil.rmtree(cgroup)
    else:
        (cgroup / "cpu.cfs_quota_us").unlink()
        if case == "unreadable":
            (cgroup / "cpu.cfs_quota_us").mkdir()  # a read fails, not as "missing"
    with caplog.at_level(logging.DEBUG, logger="koord.koordlet.qosmanager.framework"):
        strategy.apply_pod(p, BurstConfig(Policy.CPU_BURST_ONLY), NodeState.IDLE)
    said = [r for r in caplog.records if "container c0" in r.getMessage()]
    assert [r.levelno for r in said] == [level], [r.getMessage() for r in said]


@pytest.mark.parametrize("name, qos, want_ratio", [
    # 16 cpus, node 6 cores used; pod i uses i + 0.5 cores on average (samples i and i + 1)
    ("few-excluded-looked-up-one-by-one", ["LS", "LS", "LS", "BE"], (6 - 3.5) / 16),
    ("most-excluded-in-one-pass", ["LS", "BE", "BE", "LSR"], (6 - 1.5 - 2.5 - 3.5) / (16 - 1)),
])
def test_share_pool_usage_either_way(tmp_path: Path, name, qos, want_ratio) -> None:
    pods = [with_resources(burst_pod(f"p{i}", [1000], q), requests={"cpu": 1000}) for i, q in enumerate(qos)]
    rig, strategy = make_rig(tmp_path, pods)
    rig.cache.set_kv("node_cpu_info", {"processors": [{"cpu": i} for i in range(16)]})
    rig.sample("node_cpu_usage", 6.0)
    for i, p in enumerate(pods):
        rig.sample("pod_cpu_usage", i, pod_uid=p.uid)
        rig.now += 1
        rig.sample("pod_cpu_usage", i + 1, pod_uid=p.uid)
        rig.now -= 1
    rig.now += 1
    strategy.node_state(50, pods)
    assert rig.metric("koordlet_cpu_burst_share_pool_usage_ratio") == pytest.approx(want_ratio)
