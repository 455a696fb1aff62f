"""The metrics advisor on real containerd and real cgroups: a container burning one CPU and
one holding 200 MiB of touched memory show up in the metric cache as ~1 core and ~200 MiB,
per pod and per container, as collected by the PodResource collector from the pods the
states informer lists from CRI."""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from koord.koordlet import metriccache as mc
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import kinds
from koord.koordlet.metricsadvisor import AdvisorConfig, MetricsAdvisor
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.statesinformer import StatesInformer
from koord.koordlet.statesinformer.pods import CriPodsSource
from koord_testing.cgroups import Cgroup
from koord_testing.containerd import Containerd
from koord_testing.kubelet import KubeletClient
from koord_testing.wait import wait_for
from koord_testing.workloads import burn_command, hold_command

pytestmark = [pytest.mark.e2e, pytest.mark.cgroup]

MiB = 1024 * 1024
WAIT = 60.0


@pytest.fixture
def advisor(containerd: Containerd, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[tuple[MetricsAdvisor, mc.MetricCache]]:
    """The advisor on the pods CRI lists, collecting every second; a test adds AdvisorConfig
    fields with ``@pytest.mark.advisor_config(...)``."""
    marker = request.node.get_closest_marker("advisor_config")
    cache = mc.MetricCache(tmp_path / "tsdb")
    cgroups = CgroupExecutor(CgroupLayout(driver="cgroupfs"))
    pods = CriPodsSource(containerd.endpoint, cgroups.layout)
    informer = StatesInformer(pods=pods, pods_interval=0.5)
    informer.start()
    config = AdvisorConfig(collect_res_used_interval=1.0, **(marker.kwargs if marker else {}))
    advisor = MetricsAdvisor(config, informer, cache, cgroups)
    advisor.start()
    try:
        yield advisor, cache
    finally:
        advisor.stop()
        informer.stop()
        cache.close()


def task_pids(kubelet: KubeletClient, sandbox: str, container: str) -> list[int]:
    """Host pids of a container's processes (the burner's supervisor and its workers)."""
    return Cgroup.of_container(kubelet.pod_cgroup_parent(sandbox), container).threads()


def demand_ns(pids: list[int]) -> int:
    """ns the tasks ran plus waited to run: what they asked for, whatever the machine's load."""
    total = 0
    for pid in pids:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        total += int(on_cpu) + int(waiting)
    return total


def proc_cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def last_values(cache: mc.MetricCache, kind: str, labels: dict[str, str], n: int) -> list[float]:
    return [v for _, v in cache.query(kind, 0, time.time() + 1, labels)][-n:]


def test_burner_and_holder_measured_from_real_cgroups(containerd: Containerd, kubelet: KubeletClient,
                                                      advisor) -> None:
    _, cache = advisor
    burn_uid, hold_uid = str(uuid.uuid4()), str(uuid.uuid4())
    burn_pod = kubelet.run_pod(f"burn-{burn_uid[:6]}", uid=burn_uid, qos="burstable")
    burner = kubelet.run_container(burn_pod, "burn", containerd.image, command=burn_command(1))
    hold_pod = kubelet.run_pod(f"hold-{hold_uid[:6]}", uid=hold_uid, qos="burstable")
    holder = kubelet.run_container(hold_pod, "hold", containerd.image, command=hold_command(200))

    wait_for(lambda: last_values(cache, mc.POD_CPU_USAGE, {mc.POD_UID: burn_uid}, 1),
             "the burner's first CPU sample", WAIT)
    wait_for(lambda: len(last_values(cache, mc.CONTAINER_MEMORY_USAGE, {mc.CONTAINER_ID: holder}, 3)) >= 3,
             "memory samples of the holding container", WAIT)
    # The burner asks for one CPU (its tasks' run + wait time), but this machine is shared: what
    # it really gets is measured independently (the kernel's per-task tick accounting in /proc)
    # over the same window, and the collector must report that.
    pids = task_pids(kubelet, burn_pod, burner)
    t0, ticks0, demand0 = time.time(), proc_cpu_ticks(pids), demand_ns(pids)
    time.sleep(6)
    t1, ticks1, demand1 = time.time(), proc_cpu_ticks(pids), demand_ns(pids)
    got = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / (t1 - t0)
    asked = (demand1 - demand0) / 1e9 / (t1 - t0)
    window = (t0 + 1.0, t1)
    pod_cpu = statistics.mean(v for _, v in cache.query(mc.POD_CPU_USAGE, *window, {mc.POD_UID: burn_uid}))
    container_cpu = statistics.mean(
        v for _, v in cache.query(mc.CONTAINER_CPU_USAGE, *window, {mc.CONTAINER_ID: burner}))
    pod_mem = last_values(cache, mc.POD_MEMORY_USAGE, {mc.POD_UID: hold_uid}, 1)[0]
    container_mem = last_values(cache, mc.CONTAINER_MEMORY_USAGE, {mc.CONTAINER_ID: holder}, 1)[0]
    print(f"burner asked {asked:.3f} cores, got {got:.3f} (/proc); "
          f"collected pod {pod_cpu:.3f}, container {container_cpu:.3f}; "
          f"holder pod {pod_mem / MiB:.1f} MiB, container {container_mem / MiB:.1f} MiB")

    assert asked == pytest.approx(1.0, rel=0.2)
    assert got > 0.1, "the burner hardly ran: the machine is too busy to measure anything"
    assert pod_cpu == pytest.approx(got, rel=0.2)
    assert container_cpu == pytest.approx(got, rel=0.2)
    assert pod_mem == pytest.approx(200 * MiB, rel=0.1)
    assert container_mem == pytest.approx(200 * MiB, rel=0.1)
    # The holder does not burn and the burner holds almost nothing.
    assert last_values(cache, mc.POD_CPU_USAGE, {mc.POD_UID: hold_uid}, 1)[0] < 0.1
    assert last_values(cache, mc.POD_MEMORY_USAGE, {mc.POD_UID: burn_uid}, 1)[0] < 20 * MiB
    # The node sees at least the burner, and the system collector has run.
    assert cache.aggregate(mc.NODE_CPU_USAGE, *window, mc.Aggregation.AVG) >= 0.8 * got
    assert cache.query(mc.SYS_CPU_USAGE, time.time() - 10, time.time())

    # A pod that goes away mid-collection leaves no error behind: its series just stop.
    kubelet.stop_pod(burn_pod)
    kubelet.remove_pod(burn_pod)
    stopped = time.time()
    time.sleep(3)
    newer = [t for t, _ in cache.query(mc.POD_CPU_USAGE, stopped + 1.5, time.time() + 1, {mc.POD_UID: burn_uid})]
    assert newer == []
    assert last_values(cache, mc.POD_MEMORY_USAGE, {mc.POD_UID: hold_uid}, 1)


@pytest.mark.advisor_config(psi_collector=True, psi_collector_interval=1.0)
def test_pressure_stall_information_of_pods_and_containers(containerd: Containerd, kubelet: KubeletClient,
                                                           advisor) -> None:
    """PSICollector on: v2 has cpu/memory/io.pressure in every pod and container cgroup and
    they reach the cache; this v1 kernel has none, and the collector stays quiet."""
    _, cache = advisor
    uid = str(uuid.uuid4())
    pod = kubelet.run_pod(f"psi-{uid[:6]}", uid=uid, qos="burstable")
    container = kubelet.run_container(pod, "burn", containerd.image, command=burn_command(1))
    cg = Cgroup.of_container(kubelet.pod_cgroup_parent(pod), container)
    has_psi = cg.file("cpu", "cpu.pressure").exists()
    wait_for(lambda: last_values(cache, mc.POD_CPU_USAGE, {mc.POD_UID: uid}, 2), "two CPU samples", WAIT)
    if cg.version == 2:
        assert has_psi, "a v2 kernel with PSI has cpu.pressure in every cgroup"
    if has_psi:
        for resource in ("cpu", "mem", "io"):
            labels = {mc.POD_UID: uid, kinds.PSI_RESOURCE: resource, kinds.PSI_DEGREE: "some"}
            samples = wait_for(lambda labels=labels: last_values(cache, mc.POD_PSI, labels, 1),
                               f"the pod's {resource} pressure", WAIT)
            assert 0 <= samples[0] <= 100
        assert wait_for(lambda: last_values(cache, mc.CONTAINER_PSI, {mc.CONTAINER_ID: container,
                                                                      kinds.PSI_RESOURCE: "cpu"}, 1),
                        "the container's cpu pressure", WAIT)
    else:
        time.sleep(2)
        assert last_values(cache, mc.POD_PSI, {mc.POD_UID: uid}, 1) == []
