"""The koordlet command: flag validation, the assembled daemon, and the binary over its socket."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from koord.apis.runtime.v1alpha1 import api_pb2, api_pb2_grpc
from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet import cli, flags, flagtypes
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.processes import stop_process

WAIT = 20.0


def wait_for(predicate, what: str):
    """Polls until ``predicate()`` is truthy; the deadline only bounds a hung test."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("text,seconds", [
    ("10s", 10.0), ("500ms", 0.5), ("1m", 60.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("0", 0.0),
])
def test_go_durations(text, seconds):
    assert flagtypes.go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("argv,flag", [
    (["--runtime-hooks-network", "udp"], "--runtime-hooks-network"),
    (["--runtime-hooks-failure-policy", "Maybe"], "--runtime-hooks-failure-policy"),
    (["--runtime-hooks-plugin-failure-policy", "fail"], "--runtime-hooks-plugin-failure-policy"),
    (["--runtime-hooks-disable-stages", "PreRunPodSandbox,Bogus"], "--runtime-hooks-disable-stages"),
    (["--runtime-hooks-reconcile-interval", "10"], "--runtime-hooks-reconcile-interval"),
    (["--runtime-hooks-reconcile-interval", "5x"], "--runtime-hooks-reconcile-interval"),
    (["--cgroup-driver", "cgroupv3"], "--cgroup-driver"),
    (["--cgroup-root-dir", "/no/such/dir"], "--cgroup-root-dir"),
    (["--feature-gates", "Nope=true"], "--feature-gates"),
    (["--feature-gates", "Resctrl=maybe"], "--feature-gates"),
    (["--containerd-endpoint", "relative.sock"], "--containerd-endpoint"),
    (["--runtime-hooks-addr", "relative.sock"], "--runtime-hooks-addr"),
    (["--runtime-hooks-network", "tcp", "--runtime-hooks-addr", "/a.sock"], "--runtime-hooks-addr"),
    (["--runtime-hooks-network", "tcp", "--runtime-hooks-addr", "127.0.0.1:٩٣١٨"], "--runtime-hooks-addr"),
    (["--kubelet-read-only-port", "١٠٢٥٥"], "--kubelet-read-only-port"),
    (["--kubelet-read-only-port", "65536"], "--kubelet-read-only-port"),
    (["--enable-pagecache-collector=yes"], "--enable-pagecache-collector"),
])
def test_bad_flag_exits_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        flags.parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_one_feature_gates_flag_reaches_every_module():
    """Hook plugins, QoS strategies and the advisor's PSI collector share ``--feature-gates``."""
    from koord.koordlet import metricsadvisor, qosmanager

    args = flags.parse_args(["--feature-gates", "PSICollector=true,BECPUSuppress=false,Resctrl=true"])
    assert metricsadvisor.from_args(args).psi_collector is True
    assert qosmanager.QOSConfig.from_args(args).gates["BECPUSuppress"] is False
    assert args.feature_gates["Resctrl"] is True
    assert metricsadvisor.from_args(flags.parse_args([])).psi_collector is False


def test_defaults_match_issue_4():
    args = flags.parse_args([])
    assert args.runtime_hooks_network == "unix"
    assert args.runtime_hooks_addr == "/var/run/koordlet/koordlet.sock"
    assert args.runtime_hooks_host_endpoint is None
    assert args.runtime_hooks_config_path == Path("/etc/runtime/hookserver.d")
    assert args.runtime_hooks_failure_policy is FailurePolicy.IGNORE
    assert args.runtime_hooks_plugin_failure_policy is FailurePolicy.IGNORE
    assert args.runtime_hooks_reconcile_interval == 10.0
    assert args.containerd_endpoint == "/var/run/containerd/containerd.sock"
    assert {k for k, v in args.feature_gates.items() if v} == {  # upstream's on-by-default gates
        "GroupIdentity", "CPUSetAllocator", "BatchResource", "BECPUSuppress", "NodeTopologyReport",
        "CPUBurst", "RdtResctrl"}


def test_flag_values_are_parsed():
    args = flags.parse_args([
        "--runtime-hooks-disable-stages", "PreStartContainer, PostStopContainer",
        "--containerd-endpoint", "unix:///run/c.sock", "--feature-gates", "GPUEnvInject=true",
        "--runtime-hooks-addr", "unix:///run/k.sock"])
    assert args.runtime_hooks_disable_stages == {HookPoint.PRE_START_CONTAINER, HookPoint.POST_STOP_CONTAINER}
    assert args.containerd_endpoint == "/run/c.sock"
    assert args.runtime_hooks_addr == "/run/k.sock"
    assert args.feature_gates["GPUEnvInject"] and args.feature_gates["GroupIdentity"]


def node_slo(be_bvt: int, be_enabled: bool = True) -> str:
    return json.dumps({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                       "metadata": {"name": "n1"},
                       "spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {
                           "enable": be_enabled, "groupIdentity": be_bvt}}}}})


BE_POD = "kubepods/besteffort/podu1"


def test_node_slo_change_refreshes_existing_pods(short_socket_dir, tmp_path, fake_cri):
    """The rule callback: NodeSLO file -> parse_rules -> plugins -> reconcile_now."""
    root = tmp_path / "cg"
    make_fake_v1_cgroup(root, BE_POD)
    (tmp_path / "proc").mkdir()
    slo = tmp_path / "nodeslo.json"
    slo.write_text(node_slo(-1))
    fake_cri.add_pod("p1", "batch", {"koordinator.sh/qosClass": "BE"}, "/" + BE_POD)
    args = flags.parse_args([
        "--runtime-hooks-addr", str(short_socket_dir / "k.sock"),
        "--runtime-hooks-config-path", str(short_socket_dir / "hookserver.d"),
        "--cgroup-root-dir", str(root), "--proc-root-dir", str(tmp_path / "proc"),
        "--containerd-endpoint", fake_cri.endpoint, "--node-slo-file", str(slo),
        "--runtime-hooks-reconcile-interval", "1h", *PRIVATE_PATHS(tmp_path)[:4]])
    koordlet = cli.Koordlet(args)
    koordlet.start()
    try:
        bvt = root / "cpu" / BE_POD / "cpu.bvt_warp_ns"
        qos_bvt = root / "cpu/kubepods/besteffort/cpu.bvt_warp_ns"
        wait_for(lambda: bvt.read_text().strip() == "-1", "first round to set BE bvt -1")
        assert qos_bvt.read_text().strip() == "-1"
        slo.write_text(node_slo(-1, be_enabled=False))
        # the interval is an hour: only the rule callback can bring this round
        wait_for(lambda: bvt.read_text().strip() == "0", "NodeSLO change to reset BE bvt to 0")
        wait_for(lambda: qos_bvt.read_text().strip() == "0", "kube-QoS besteffort bvt to 0")
    finally:
        koordlet.stop()
    assert not (short_socket_dir / "hookserver.d" / "koordlet.json").exists()


def test_pleg_tells_the_qos_manager_once_it_runs(short_socket_dir, tmp_path, monkeypatch):
    """A cgroup dir coming or going also reaches the QoS strategies (their cached tree)."""
    plegs = []

    class RecordingPleg:
        def __init__(self, executor, on_change):
            self.on_change = list(on_change)
            plegs.append(self)

        def start(self):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(cli, "Pleg", RecordingPleg)
    make_fake_v1_cgroup(tmp_path / "cg", "kubepods")
    koordlet = cli.Koordlet(flags.parse_args([
        "--runtime-hooks-addr", str(short_socket_dir / "k.sock"), "--cgroup-root-dir", str(tmp_path / "cg"),
        *PRIVATE_PATHS(tmp_path)]))
    (module,) = [m for m in koordlet.modules.modules if m.name == "pleg"]
    module.start()
    (pleg,) = plegs
    for fn in pleg.on_change:
        fn()  # no QoS manager yet: nothing to tell
    calls = []
    koordlet.qos_manager.running = type("Manager", (), {"cgroups_changed": lambda self: calls.append(1)})()
    for fn in pleg.on_change:
        fn()
    assert calls == [1]
    koordlet.qos_manager.running = None
    koordlet.stop()


LSR_CONTAINER = api_pb2.ContainerResourceHookRequest(
    pod_meta=api_pb2.PodSandboxMetadata(name="lsr", namespace="default", uid="u2"),
    container_meta=api_pb2.ContainerMetadata(name="main"),
    pod_labels={"koordinator.sh/qosClass": "LSR"},
    pod_annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset":"0"}',
                     "scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":1}]}'},
    pod_cgroup_parent="/kubepods/podu2")

BE_SPEC = json.dumps({"containers": {"main": {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"},
    "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"}}}})
BE_SANDBOX = api_pb2.PodSandboxHookRequest(
    pod_meta=api_pb2.PodSandboxMetadata(name="batch", namespace="default", uid="u1"),
    labels={"koordinator.sh/qosClass": "BE"},
    annotations={"node.koordinator.sh/extended-resource-spec": BE_SPEC},
    cgroup_parent="/" + BE_POD)


def PRIVATE_PATHS(tmp_path):
    """Keeps a koordlet process off the host's metric cache, CRI socket and port 9316."""
    return ["--tsdb-path", str(tmp_path / "tsdb"), "--addr", "",
            "--prediction-checkpoint-filepath", str(tmp_path / "prediction"),
            "--containerd-endpoint", str(tmp_path / "no-cri.sock")]


def test_koordlet_binary_answers_every_rpc_and_cleans_up(short_socket_dir, tmp_path):
    root = tmp_path / "cg"
    make_fake_v1_cgroup(root, BE_POD)
    (tmp_path / "proc").mkdir()
    config = short_socket_dir / "hookserver.d"
    sock = short_socket_dir / "koordlet.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "koord.koordlet", "--runtime-hooks-addr", str(sock),
         "--runtime-hooks-config-path", str(config), "--cgroup-root-dir", str(root),
         "--proc-root-dir", str(tmp_path / "proc"), "--runtime-hooks-reconcile-interval", "0",
         "--feature-gates", "GPUEnvInject=true", "--runtime-hooks-disable-stages", "PostStopContainer",
         *PRIVATE_PATHS(tmp_path)],
        stderr=subprocess.PIPE, text=True)
    try:
        registration = wait_for(lambda: (config / "koordlet.json").exists()
                                and json.loads((config / "koordlet.json").read_text()), "registration")
        assert registration == {"remote-endpoint": str(sock), "failure-policy": "Ignore",
                                "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer",
                                                  "PreUpdateContainerResources"]}
        with grpc.insecure_channel("unix:" + str(sock)) as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            pod = stub.PreRunPodSandboxHook(BE_SANDBOX, timeout=10)
            assert (pod.resources.cpu_shares, pod.resources.cpu_quota,
                    pod.resources.memory_limit_in_bytes) == (512, 50000, 2147483648)
            # pod-level values are also written, since this pod's cgroup exists
            assert (root / "cpu" / BE_POD / "cpu.shares").read_text().strip() == "512"
            container = stub.PreCreateContainerHook(LSR_CONTAINER, timeout=10)
            assert container.container_resources.cpuset_cpus == "0"
            assert container.container_resources.cpu_quota == -1
            assert dict(container.container_envs) == {"NVIDIA_VISIBLE_DEVICES": "1"}
            update = stub.PreUpdateContainerResourcesHook(LSR_CONTAINER, timeout=10)
            assert update.container_resources.cpuset_cpus == "0"
            for rpc in ("PreStartContainerHook", "PostStartContainerHook", "PostStopContainerHook"):
                assert getattr(stub, rpc)(LSR_CONTAINER, timeout=10).ByteSize() == 0
            assert stub.PostStopPodSandboxHook(BE_SANDBOX, timeout=10).ByteSize() == 0
        assert stop_process(proc, timeout=WAIT) == 0
    finally:
        stop_process(proc, timeout=0)
        stderr = proc.stderr.read()
    assert not (config / "koordlet.json").exists(), stderr
    assert not sock.exists()
    assert "SIGTERM received" in stderr


def test_koordlet_exits_1_when_it_cannot_listen(short_socket_dir, tmp_path):
    blocker = short_socket_dir / "k.sock"
    blocker.write_text("a regular file")
    result = subprocess.run(
        [sys.executable, "-m", "koord.koordlet", "--runtime-hooks-addr", str(blocker),
         "--runtime-hooks-config-path", str(short_socket_dir / "cfg"), "--cgroup-root-dir", str(tmp_path),
         "--runtime-hooks-reconcile-interval", "0", *PRIVATE_PATHS(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KUBERNETES_SERVICE_HOST": ""})
    assert result.returncode == 1
    assert "not a socket" in result.stderr
    assert not (short_socket_dir / "cfg" / "koordlet.json").exists()


@pytest.mark.parametrize("blocked, error", [
    ("socket", "not a socket"),  # the server cannot listen
    ("config", "File exists"),  # it listens, then the registration cannot be written
])
def test_runtime_hooks_that_cannot_start_end_the_start_and_leave_nothing(
        short_socket_dir: Path, tmp_path: Path, blocked: str, error: str) -> None:
    sock, config = short_socket_dir / "k.sock", short_socket_dir / "cfg"
    (sock if blocked == "socket" else config).write_text("a regular file")
    make_fake_v1_cgroup(tmp_path / "cg", "kubepods")
    koordlet = cli.Koordlet(flags.parse_args([
        "--runtime-hooks-addr", str(sock), "--runtime-hooks-config-path", str(config),
        "--cgroup-root-dir", str(tmp_path / "cg"), "--runtime-hooks-reconcile-interval", "0",
        *PRIVATE_PATHS(tmp_path)]))
    try:
        with pytest.raises(OSError, match=error):
            koordlet.start()
        (pleg,) = [m for m in koordlet.modules.modules if m.name == "pleg"]
        assert getattr(pleg, "running", None) is None, "nothing after the runtime hooks was started"
        # The blocker left as it was; the server that did listen stopped, its socket gone.
        assert (sock.exists(), config.exists()) == (blocked == "socket", blocked == "config")
    finally:
        koordlet.stop()


def test_resctrl_with_default_flags_uses_sys_fs_resctrl():
    """Upstream's semantics: --sys-fs-root-dir is /sys/fs, resctrl is <sys-fs-root>/resctrl."""
    args = flags.parse_args(["--feature-gates", "Resctrl=true", "--runtime-hooks-reconcile-interval", "0"])
    assert args.sys_fs_root_dir == Path("/sys/fs")
    koordlet = cli.Koordlet(args)
    resctrl = [p for p in koordlet.hooks.plugins if p.name == "Resctrl"]
    assert len(resctrl) == 1
    assert resctrl[0].root == Path("/sys/fs/resctrl")


@pytest.mark.parametrize("argv, force, ttl", [
    ([], 60, 120.0),
    (["-resource-force-update-seconds=5"], 5, 120.0),
    (["-resource-force-update-seconds=600"], 600, 1200.0),
    (["-resource-force-update-seconds=-1"], 0, 120.0),
])
def test_resource_force_update_seconds_reaches_the_executor(tmp_path: Path, short_socket_dir: Path, argv: list[str],
                                                            force: float, ttl: float) -> None:
    make_fake_v1_cgroup(tmp_path / "cg", "kubepods")
    koordlet = cli.Koordlet(flags.parse_args([
        "--runtime-hooks-addr", str(short_socket_dir / "k.sock"), "--cgroup-root-dir", str(tmp_path / "cg"),
        *PRIVATE_PATHS(tmp_path), *argv]))
    try:
        assert (koordlet.executor.force_update_seconds, koordlet.executor.cache_ttl) == (force, ttl)
    finally:
        koordlet.stop()
