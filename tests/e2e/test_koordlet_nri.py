"""koordlet's NRI mode against real containerd 2.x with NRI on: pods created straight on
containerd with a CRI client, no proxy, and koordlet's reconciler off, so that whatever
koordlet's hooks do reaches the pods through NRI alone.

The values a container gets at creation are read by the container itself: its command is
``/pause cat <its own cgroup file>``, so what it prints is what runc applied before the
container's first instruction ran. They equal what the same pods get through the proxy
(``test_koordlet.py``).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from koord_testing.cgroups import Cgroup, cgroup_version, shares_to_weight
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy
from koord_testing.sockets import make_short_socket_dir
from koord_testing.wait import wait_for

from .test_upstream_dropin import upstream_args

pytestmark = pytest.mark.e2e
cgroup = pytest.mark.cgroup

QOS = "koordinator.sh/qosClass"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"
TWO_GI = 2 * 1024**3
REGISTERED = "NRI plugin 00-koordlet_nri registered"


def batch_spec(*containers: str) -> str:
    limits = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"}
    return json.dumps({"containers": {name: {"requests": limits, "limits": limits} for name in containers}})


# What a container reads of its own cgroup, in each hierarchy's names (the container sees its
# own cgroup at /sys/fs/cgroup: a bind mount per controller on v1, its cgroup namespace on v2).
OWN_FILES_V1 = {"shares": "cpu/cpu.shares", "quota": "cpu/cpu.cfs_quota_us", "memory": "memory/memory.limit_in_bytes",
                "cpuset": "cpuset/cpuset.cpus"}
OWN_FILES_V2 = {"shares": "cpu.weight", "quota": "cpu.max", "memory": "memory.max", "cpuset": "cpuset.cpus"}


def own_file(what: str) -> str:
    return "/sys/fs/cgroup/" + (OWN_FILES_V2 if cgroup_version() == 2 else OWN_FILES_V1)[what]


def expected_at_creation(what: str, shares: int, quota: int, memory: int) -> str:
    """What ``own_file(what)`` reads with those values applied."""
    if cgroup_version() == 2:
        return {"shares": str(shares_to_weight(shares)), "quota": f"{quota} 100000", "memory": str(memory)}[what]
    return {"shares": str(shares), "quota": str(quota), "memory": str(memory)}[what]


def printed(kubelet: KubeletClient, sandbox_id: str, name: str, container_id: str) -> str:
    """What the container's first instruction printed, from its CRI log, once it exited."""
    wait_for(lambda: kubelet.container_status(container_id).status.state == kubelet.pb.CONTAINER_EXITED,
             f"container {name} to run and exit", timeout=60)
    log_file = Path(kubelet.sandbox_configs[sandbox_id].log_directory) / name / "0.log"
    # CRI log lines: "<time> <stream> <tag> <text>"
    return "".join(line.split(" ", 3)[3] for line in log_file.read_text().splitlines()
                   if line.count(" ") >= 3).strip()


@pytest.fixture
def nri_koordlet(containerd2: Containerd, tmp_path: Path) -> Iterator[Callable[[], KoordletProcess]]:
    """koordlet with upstream's NRI flags pointed at the private containerd's socket, no reconciler."""
    started: list[KoordletProcess] = []

    def start() -> KoordletProcess:
        k = KoordletProcess(tmp_path / f"koordlet{len(started)}", [
            "--runtime-hooks-reconcile-interval", "0", "--containerd-endpoint", containerd2.endpoint,
            "-enable-nri-runtime-hook=true", f"-var-run-root-dir={containerd2.workdir}",
            "-runtime-hooks-nri-socket-path=nri.sock"]).start()
        started.append(k)
        return k

    yield start
    for k in started:
        rc = k.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{k.logs(tail=200)}")


def registrations(k: KoordletProcess) -> int:
    return k.logs(tail=100000).count(REGISTERED)


@cgroup
def test_new_containers_get_koordlets_values_at_creation_through_nri(
        containerd2: Containerd, kubelet2: KubeletClient, nri_koordlet: Callable[[], KoordletProcess]) -> None:
    koordlet = nri_koordlet()
    wait_for(lambda: registrations(koordlet) == 1, "koordlet to register with containerd's NRI")
    image = containerd2.image

    lsr = kubelet2.run_pod(f"lsr-{uuid.uuid4().hex[:6]}", labels={QOS: "LSR"},
                           annotations={RESOURCE_STATUS: '{"cpuset":"0"}'}, qos="guaranteed")
    cpuset = kubelet2.run_container(lsr, "cpuset", image, command=["/pause", "cat", own_file("cpuset")],
                                    resources={"cpu_period": 100000, "cpu_quota": 200000, "cpuset_cpus": "0-1"})
    assert printed(kubelet2, lsr, "cpuset", cpuset) == "0"

    names = ("shares", "quota", "memory")
    be = kubelet2.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                          annotations={EXTENDED_SPEC: batch_spec(*names)}, qos="besteffort")
    ids = {name: kubelet2.run_container(be, name, image, command=["/pause", "cat", own_file(name)],
                                        resources={"cpu_shares": 2}) for name in names}
    for name in names:
        assert printed(kubelet2, be, name, ids[name]) == expected_at_creation(name, 512, 50000, TWO_GI), name
    # The pod level (the sum of its three containers), which NRI cannot adjust: koordlet wrote it
    # at RunPodSandbox.
    pod = Cgroup.of_pod(kubelet2.pod_cgroup_parent(be))
    assert pod.cpu_weight() == shares_to_weight(3 * 512)
    assert pod.cpu_max() == (3 * 50000, 100000)
    assert pod.memory_limit() == 3 * TWO_GI
    assert "Traceback" not in koordlet.logs(tail=400)


def test_update_container_resources_keeps_the_batch_values(
        containerd2: Containerd, kubelet2: KubeletClient, nri_koordlet: Callable[[], KoordletProcess]) -> None:
    koordlet = nri_koordlet()
    wait_for(lambda: registrations(koordlet) == 1, "koordlet to register with containerd's NRI")
    be = kubelet2.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                          annotations={EXTENDED_SPEC: batch_spec("main")}, qos="besteffort")
    container = kubelet2.run_container(be, "main", containerd2.image, resources={"cpu_shares": 2})
    cg = Cgroup.of_container(kubelet2.pod_cgroup_parent(be), container)
    assert cg.cpu_weight() == shares_to_weight(512)
    # kubelet resizes the container with its own values: NRI's UpdateContainer puts koordlet's back.
    kubelet2.update_resources(container, {"cpu_shares": 2, "cpu_quota": 0, "memory_limit_in_bytes": 0})
    assert cg.cpu_weight() == shares_to_weight(512)
    assert cg.cpu_max() == (50000, 100000)
    assert cg.memory_limit() == TWO_GI


@cgroup
def test_restarts_of_containerd_and_koordlet_bring_existing_containers_in_line(
        containerd2: Containerd, kubelet2: KubeletClient, nri_koordlet: Callable[[], KoordletProcess]) -> None:
    def be_pod() -> Cgroup:
        sandbox = kubelet2.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                                   annotations={EXTENDED_SPEC: batch_spec("main")}, qos="besteffort")
        container = kubelet2.run_container(sandbox, "main", containerd2.image, resources={"cpu_shares": 2})
        return Cgroup.of_container(kubelet2.pod_cgroup_parent(sandbox), container)

    # Before koordlet: containerd creates the pod with kubelet's values.
    before = be_pod()
    assert before.cpu_weight() == shares_to_weight(2)
    koordlet = nri_koordlet()
    wait_for(lambda: registrations(koordlet) == 1, "koordlet to register with containerd's NRI")
    # Synchronize brought the running container in line (the reconciler is off).
    wait_for(lambda: before.cpu_weight() == shares_to_weight(512), "Synchronize to update the container")

    containerd2.restart_daemon()
    wait_for(lambda: registrations(koordlet) == 2, "koordlet to reconnect after containerd's restart", timeout=60)
    assert be_pod().cpu_weight() == shares_to_weight(512)

    # koordlet gone: containerd still creates pods, with what it has.
    koordlet.kill()
    unhooked = be_pod()
    assert unhooked.cpu_weight() == shares_to_weight(2)
    again = nri_koordlet()
    wait_for(lambda: registrations(again) == 1, "the restarted koordlet to register")
    wait_for(lambda: unhooked.cpu_weight() == shares_to_weight(512), "Synchronize to bring the pod in line")


def test_upstream_daemonset_arguments_connect_through_nri(
        containerd2: Containerd, kubelet2: KubeletClient, tmp_path: Path) -> None:
    """upstream's container arguments (AllAlpha, AllBeta: CPUNormalization on too), with only the
    host dirs its DaemonSet mounts moved to temp dirs: ``-var-run-root-dir`` holds
    ``nri/nri.sock`` (upstream's default path under it), here a link to the private
    containerd's socket. A Node file gives the CPU normalization ratio."""
    var_run = tmp_path / "host-var-run"
    (var_run / "nri").mkdir(parents=True)
    (var_run / "nri" / "nri.sock").symlink_to(containerd2.nri_socket)
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"metadata": {"name": "e2e-node", "annotations": {
        "node.koordinator.sh/cpu-normalization-ratio": "1.2"}}}))
    workdir = tmp_path / "koordlet"
    sockdir = make_short_socket_dir("kl-nri-")
    args = [*upstream_args(Path("/sys/fs/cgroup"), sockdir / "koordlet.sock"),
            f"-runtime-hooks-config-path={workdir / 'hookserver.d'}", f"-tsdb-path={workdir / 'tsdb'}",
            f"-prediction-checkpoint-filepath={workdir / 'prediction'}", "-addr=",
            f"-containerd-endpoint={containerd2.endpoint}", f"-var-run-root-dir={var_run}",
            f"-node-file={node}"]
    koordlet = KoordletProcess(workdir, args, own_flags=False).start()
    try:
        wait_for(lambda: registrations(koordlet) == 1, "koordlet to register with containerd's NRI")
        ls = kubelet2.run_pod(f"ls-{uuid.uuid4().hex[:6]}", labels={QOS: "LS"}, qos="burstable")
        quota = kubelet2.run_container(ls, "quota", containerd2.image, command=["/pause", "cat", own_file("quota")],
                                       resources={"cpu_period": 100000, "cpu_quota": 100000})
        want = "83334 100000" if cgroup_version() == 2 else "83334"
        assert printed(kubelet2, ls, "quota", quota) == want
        be = kubelet2.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                              annotations={EXTENDED_SPEC: batch_spec("memory")}, qos="besteffort")
        memory = kubelet2.run_container(be, "memory", containerd2.image, command=["/pause", "cat", own_file("memory")],
                                        resources={"cpu_shares": 2})
        assert printed(kubelet2, be, "memory", memory) == str(TWO_GI)
    finally:
        rc = koordlet.stop()
        print(f"--- koordlet log (exit {rc}) ---\n{koordlet.logs(tail=200)}")
        shutil.rmtree(sockdir, ignore_errors=True)


def test_proxy_and_nri_together_give_one_answer(
        containerd2: Containerd, nri_koordlet: Callable[[], KoordletProcess], tmp_path: Path) -> None:
    """koordlet registered with the proxy and with containerd's NRI at once: a container created
    through the proxy is adjusted twice with the same values (the proxy's hook, then NRI's on the
    request it changed), so containerd sees no conflict and the container gets them once."""
    koordlet = nri_koordlet()
    wait_for(lambda: registrations(koordlet) == 1, "koordlet to register with containerd's NRI")
    proxy = RuntimeProxy(tmp_path / "proxy", containerd2.endpoint, hook_config_dir=koordlet.config_dir).start()
    client = KubeletClient(proxy.endpoint, on_pod_created=containerd2.track_pod_cgroup,
                           log_root=containerd2.workdir / "pod-logs")
    try:
        be = client.run_pod(f"be-{uuid.uuid4().hex[:6]}", labels={QOS: "BE"},
                            annotations={EXTENDED_SPEC: batch_spec("shares")}, qos="besteffort")
        shares = client.run_container(be, "shares", containerd2.image, command=["/pause", "cat", own_file("shares")],
                                      resources={"cpu_shares": 2})
        assert printed(client, be, "shares", shares) == expected_at_creation("shares", 512, 50000, TWO_GI)
        logs = koordlet.logs(tail=2000)
        assert "NRI CreateContainer for pod default/" in logs  # NRI saw the container too
    finally:
        containerd2.remove_pods_of(client)
        proxy.stop()
