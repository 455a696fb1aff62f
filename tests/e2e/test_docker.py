"""Docker mode end to end: cri-dockerd (kubelet's side) -> koord-runtime-proxy -> a private dockerd.

The same pod lifecycle runs through a cri-dockerd talking to dockerd directly and one talking
to the proxy; hooks are checked at the plugin and in ``docker inspect``; the docker CLI and
SDK run through the proxy's socket.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import docker
import grpc
import pytest

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import HookPoint
from koord_testing.docker import CriDockerd, UnixHTTPConnection, api
from koord_testing.hookplugin import Behaviour
from koord_testing.image import build_pause_image
from koord_testing.kubelet import KubeletClient

from .docker_rig import DockerRig
from .rig import free_port

pytestmark = pytest.mark.e2e
MiB = 1 << 20
SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"


def crictl(cri: CriDockerd, *args: str, input: bytes | None = None) -> bytes:
    result = cri.crictl(*args, input=input)
    assert result.returncode == 0, f"crictl {' '.join(args)}: {result.stderr.decode()}"
    return result.stdout


def lifecycle(rig: DockerRig, cri: CriDockerd, client: KubeletClient, name: str) -> dict[str, object]:
    """kubelet's pod lifecycle through ``cri``; returns what each step showed, ids left out."""
    seen: dict[str, object] = {}
    sandbox_id = client.run_pod(name, labels={"app": name}, annotations={"team": "a"})
    container_id = client.create_container(sandbox_id, "app", rig.dockerd.image, command=["/pause", "hold", "1"],
                                           envs={"GREETING": "hello"})
    client.start_container(container_id)
    seen["state"] = client.container_status(container_id).status.state
    seen["exec -s"] = crictl(cri, "exec", "-s", container_id, "/pause", "echo", "sync")
    seen["exec"] = crictl(cri, "exec", container_id, "/pause", "echo", "streamed")
    seen["exec -i"] = crictl(cri, "exec", "-i", container_id, "/pause", "cat", "/proc/self/fd/0",
                             input=b"from stdin\n")
    seen["env"] = sorted(kv for kv in crictl(cri, "exec", "-s", container_id, "/pause", "env").decode().split()
                         if kv.startswith("GREETING="))
    deadline = time.monotonic() + 10
    while b"holding" not in (logs := crictl(cri, "logs", container_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    seen["logs"] = logs
    seen["stats"] = container_id[:13] in crictl(cri, "stats", "--id", container_id).decode()
    crictl(cri, "update", "--cpu-share", "512", "--memory", str(64 * MiB), container_id)
    host = rig.inspect(container_id)["HostConfig"]
    seen["update"] = (host["CpuShares"], host["Memory"])
    crictl(cri, "stop", container_id)
    seen["stopped"] = client.container_status(container_id).status.state
    crictl(cri, "rm", container_id)
    crictl(cri, "stopp", sandbox_id)
    crictl(cri, "rmp", sandbox_id)
    client.pods.remove(sandbox_id)
    seen["pods left"] = [p.id for p in client.runtime.ListPodSandbox(client.pb.ListPodSandboxRequest()).items
                         if p.id == sandbox_id]
    return seen


def test_pod_lifecycle_is_the_same_through_the_proxy(docker_rig: DockerRig) -> None:
    docker_rig.plugin("noop.json")
    docker_rig.start_proxy()
    direct = lifecycle(docker_rig, docker_rig.env.direct_cri, docker_rig.direct(), "direct")
    proxied = lifecycle(docker_rig, docker_rig.env.proxied_cri, docker_rig.kubelet(), "proxied")
    assert proxied == direct
    assert direct["exec -i"] == b"from stdin\n" and direct["update"] == (512, 64 * MiB)
    assert b"holding 1 MiB" in direct["logs"]  # type: ignore[operator]


def _pod_answer(req: hook.PodSandboxHookRequest) -> hook.PodSandboxHookResponse:
    return hook.PodSandboxHookResponse(labels={"hooked": "yes"}, annotations={"koord/pod": "seen"},
                                       resources=hook.LinuxContainerResources(cpu_shares=300))


def _create_answer(req: hook.ContainerResourceHookRequest) -> hook.ContainerResourceHookResponse:
    return hook.ContainerResourceHookResponse(
        container_annotations={"koord/container": "seen"}, container_envs={"GREETING": "hooked", "ADDED": "1"},
        container_resources=hook.LinuxContainerResources(cpu_shares=700, cpuset_cpus="0"))


def test_all_seven_hooks_get_full_info_and_answers_land_in_docker(docker_rig: DockerRig) -> None:
    plugin = docker_rig.plugin("recorder.json")
    plugin.behaviours[HookPoint.PRE_RUN_POD_SANDBOX] = Behaviour(answer=_pod_answer)
    plugin.behaviours[HookPoint.PRE_CREATE_CONTAINER] = Behaviour(answer=_create_answer)
    plugin.behaviours[HookPoint.PRE_START_CONTAINER] = Behaviour(
        answer=lambda req: hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(cpu_quota=50000, cpu_period=100000)))
    plugin.behaviours[HookPoint.PRE_UPDATE_CONTAINER_RESOURCES] = Behaviour(
        answer=lambda req: hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(memory_limit_in_bytes=96 * MiB)))
    docker_rig.start_proxy()
    client = docker_rig.kubelet()
    uid = "0f0e0d0c-1111-2222-3333-444455556666"
    sandbox_id = client.run_pod("hooked", namespace="koord", uid=uid, labels={"app": "web"},
                                annotations={"team": "a"})
    container_id = client.create_container(sandbox_id, "app", docker_rig.dockerd.image, command=["/pause"],
                                           envs=[("FIRST", "1"), ("GREETING", "hello"), ("LAST", "2")],
                                           resources={"memory_limit_in_bytes": 64 * MiB, "cpu_shares": 2})
    client.start_container(container_id)
    client.update_resources(container_id, {"cpu_shares": 400, "memory_limit_in_bytes": 80 * MiB})
    client.stop_container(container_id)
    client.stop_pod(sandbox_id)
    assert plugin.hooks_seen() == [str(h) for h in HookPoint]

    run = plugin.requests(HookPoint.PRE_RUN_POD_SANDBOX)[0]
    assert (run.pod_meta.name, run.pod_meta.namespace, run.pod_meta.uid) == ("hooked", "koord", uid)
    assert run.labels["app"] == "web" and run.annotations["team"] == "a"
    assert run.cgroup_parent == client.pod_cgroup_parent(sandbox_id)
    create = plugin.requests(HookPoint.PRE_CREATE_CONTAINER)[0]
    assert create.pod_meta.uid == uid and create.container_meta.name == "app"
    assert create.pod_labels["hooked"] == "yes" and create.pod_annotations["koord/pod"] == "seen"
    assert create.container_envs["GREETING"] == "hello"
    assert create.container_resources.memory_limit_in_bytes == 64 * MiB
    for point in (HookPoint.PRE_START_CONTAINER, HookPoint.POST_START_CONTAINER, HookPoint.POST_STOP_CONTAINER):
        req = plugin.requests(point)[0]
        assert (req.pod_meta.uid, req.container_meta.name, req.container_meta.id) == (uid, "app", container_id)
        assert req.container_envs["GREETING"] == "hooked" and req.container_annotations["koord/container"] == "seen"
    start = plugin.requests(HookPoint.PRE_START_CONTAINER)[0]
    assert start.container_resources.cpu_shares == 700 and start.pod_cgroup_parent == run.cgroup_parent
    update = plugin.requests(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)[0]
    assert (update.container_resources.cpu_shares, update.container_resources.memory_limit_in_bytes) == (400, 80 * MiB)
    assert plugin.requests(HookPoint.POST_STOP_POD_SANDBOX)[0].pod_meta.uid == uid

    sandbox = docker_rig.inspect(sandbox_id)
    assert sandbox["Config"]["Labels"]["hooked"] == "yes"
    assert sandbox["Config"]["Labels"]["annotation.koord/pod"] == "seen"
    assert sandbox["Config"]["Labels"]["annotation.team"] == "a"  # unanswered: kept
    assert sandbox["HostConfig"]["CpuShares"] == 300
    container = docker_rig.inspect(container_id)
    assert [e for e in container["Config"]["Env"] if e.split("=")[0] in {"FIRST", "GREETING", "LAST", "ADDED"}] == [
        "FIRST=1", "GREETING=hooked", "LAST=2", "ADDED=1"]
    assert container["Config"]["Labels"]["annotation.koord/container"] == "seen"
    host = container["HostConfig"]
    assert (host["CpusetCpus"], host["CpuQuota"], host["CpuPeriod"]) == ("0", 50000, 100000)
    assert (host["CpuShares"], host["Memory"]) == (400, 96 * MiB)  # update asked 400/80Mi, the plugin 96Mi


def test_fail_policy_names_plugin_and_ignore_goes_on(docker_rig: DockerRig) -> None:
    failing = docker_rig.plugin("strict.json", hooks=[HookPoint.PRE_CREATE_CONTAINER], failure_policy="Fail")
    failing.behaviours[HookPoint.PRE_CREATE_CONTAINER] = Behaviour(error=(grpc.StatusCode.INTERNAL, "no cpus left"))
    lenient = docker_rig.plugin("lenient.json", hooks=[HookPoint.PRE_RUN_POD_SANDBOX])
    lenient.behaviours[HookPoint.PRE_RUN_POD_SANDBOX] = Behaviour(error=(grpc.StatusCode.INTERNAL, "ignored"))
    docker_rig.start_proxy()
    client = docker_rig.kubelet()
    sandbox_id = client.run_pod("failing")
    with pytest.raises(grpc.RpcError) as err:
        client.create_container(sandbox_id, "app", docker_rig.dockerd.image, command=["/pause"])
    message = err.value.details()
    assert "strict" in message and "PreCreateContainer" in message and "no cpus left" in message, message
    assert lenient.requests(HookPoint.PRE_RUN_POD_SANDBOX)
    # The same refusal as a docker client sees it: dockerd's error shape.
    status, body = api(docker_rig.env.proxy_endpoint, "POST", "/v1.41/containers/create?name="
                       f"k8s_app_failing_default_{'u' * 8}_0", {
                           "Image": docker_rig.dockerd.image,
                           "Labels": {"io.kubernetes.docker.type": "container",
                                      "io.kubernetes.sandbox.id": sandbox_id}})
    assert status == 500 and "strict" in body["message"] and "PreCreateContainer" in body["message"]


def test_skip_label_and_plain_containers_get_no_hooks(docker_rig: DockerRig) -> None:
    plugin = docker_rig.plugin("recorder.json", failure_policy="Fail")
    for point in HookPoint:
        plugin.behaviours[point] = Behaviour(error=(grpc.StatusCode.INTERNAL, "must not be called"))
    docker_rig.start_proxy()
    client = docker_rig.kubelet()
    sandbox_id = client.run_pod("skipped", labels={SKIP_LABEL: "true"})
    container_id = client.create_container(sandbox_id, "app", docker_rig.dockerd.image, command=["/pause"])
    client.start_container(container_id)
    client.stop_container(container_id)
    client.stop_pod(sandbox_id)
    docker_rig.dockerd.cli("run", "-d", "--network", "none", "--name", "plain", docker_rig.dockerd.image,
                           endpoint=docker_rig.env.proxy_endpoint)
    docker_rig.dockerd.cli("stop", "plain", endpoint=docker_rig.env.proxy_endpoint)
    assert plugin.hooks_seen() == []


def test_start_after_kill_9_between_create_and_start_has_full_info(docker_rig: DockerRig) -> None:
    plugin = docker_rig.plugin("recorder.json", hooks=[HookPoint.PRE_START_CONTAINER])
    proxy = docker_rig.start_proxy()
    client = docker_rig.kubelet()
    uid = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    sandbox_id = client.run_pod("restarted", namespace="ns1", uid=uid, annotations={"keep": "me"})
    container_id = client.create_container(sandbox_id, "app", docker_rig.dockerd.image, command=["/pause"],
                                           envs={"E": "1"}, resources={"cpu_shares": 256})
    proxy.kill()
    proxy.start()
    client.start_container(container_id)
    req = plugin.wait_for(HookPoint.PRE_START_CONTAINER)[0]
    assert (req.pod_meta.name, req.pod_meta.namespace, req.pod_meta.uid) == ("restarted", "ns1", uid)
    assert req.pod_annotations["keep"] == "me" and req.container_envs["E"] == "1"
    assert req.container_meta.id == container_id and req.container_resources.cpu_shares == 256
    assert req.pod_cgroup_parent == client.pod_cgroup_parent(sandbox_id)


def test_containers_created_behind_the_proxys_back_are_looked_up(docker_rig: DockerRig) -> None:
    plugin = docker_rig.plugin("recorder.json", hooks=[HookPoint.PRE_START_CONTAINER, HookPoint.POST_STOP_POD_SANDBOX])
    docker_rig.start_proxy()
    direct = docker_rig.direct()
    uid = "12345678-0000-0000-0000-000000000abc"
    sandbox_id = direct.run_pod("behind", namespace="ns2", uid=uid, labels={"tier": "be"})
    container_id = direct.create_container(sandbox_id, "side", docker_rig.dockerd.image, command=["/pause"],
                                           envs={"K": "v"})
    proxied = docker_rig.kubelet()
    proxied.start_container(container_id)
    req = plugin.wait_for(HookPoint.PRE_START_CONTAINER)[0]
    assert (req.pod_meta.name, req.pod_meta.uid, req.container_meta.name) == ("behind", uid, "side")
    assert req.pod_labels["tier"] == "be" and req.container_envs["K"] == "v"
    proxied.stop_pod(sandbox_id)
    assert plugin.wait_for(HookPoint.POST_STOP_POD_SANDBOX)[0].pod_meta.uid == uid


def test_metrics_health_and_readiness(docker_rig: DockerRig) -> None:
    port = free_port()
    docker_rig.start_proxy(metrics_bind_address=f"127.0.0.1:{port}")
    client = docker_rig.kubelet()
    client.run_pod("measured")
    base = f"http://127.0.0.1:{port}"
    assert urllib.request.urlopen(f"{base}/healthz", timeout=5).status == 200
    assert urllib.request.urlopen(f"{base}/readyz", timeout=5).status == 200
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    assert 'koord_runtime_proxy_cri_requests_total{code="201",method="docker POST /containers/create"} 1.0' \
        in metrics.splitlines()
    assert "koord_runtime_proxy_store_pods" in metrics


def test_docker_cli_and_sdk_through_the_proxy(docker_rig: DockerRig, tmp_path) -> None:
    docker_rig.start_proxy()
    endpoint = docker_rig.env.proxy_endpoint
    cli = docker_rig.dockerd.cli
    image = docker_rig.dockerd.image
    archive = build_pause_image(tmp_path / "image", "koord/loaded:test")
    assert b"koord/loaded:test" in cli("load", "-i", str(archive), endpoint=endpoint).stdout
    cid = cli("run", "-d", "--network", "none", "--name", "web", image, "hold", "1",  # the entrypoint is /pause
              endpoint=endpoint).stdout.decode().strip()
    assert cid[:12] in cli("ps", endpoint=endpoint).stdout.decode()
    assert cli("exec", "-i", "web", "/pause", "cat", "/proc/self/fd/0", input=b"piped\n",
               endpoint=endpoint).stdout == b"piped\n"
    follow = subprocess.Popen([docker_rig.dockerd.docker_binary(), "-H", f"unix://{endpoint}", "logs", "-f", "web"],
                              stdout=subprocess.PIPE, env=dict(os.environ, DOCKER_CONFIG=str(
                                  docker_rig.dockerd.docker_config)))
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == b"holding 1 MiB\n"  # relayed while the stream stays open
        assert follow.poll() is None
    finally:
        follow.kill()
        follow.wait()
    assert json.loads(cli("inspect", "web", endpoint=endpoint).stdout)[0]["Id"] == cid
    assert cli("run", "-i", "--rm", "--network", "none", image, "cat", "/proc/self/fd/0", input=b"run -i\n",
               endpoint=endpoint).stdout == b"run -i\n"  # attach before start, stdin half-closed at EOF
    cli("rm", "-f", "web", endpoint=endpoint)

    sdk = docker.DockerClient(base_url=f"unix://{endpoint}")
    try:
        assert sdk.ping()
        container = sdk.containers.run(image, ["hold", "1"], network_mode="none", detach=True)
        assert container.exec_run(["/pause", "echo", "exec'd"]).output == b"exec'd\n"
        container.stop(timeout=5)
        created = sdk.api.create_container(image, ["cat", "/proc/self/fd/0"], stdin_open=True,
                                           host_config=sdk.api.create_host_config(network_mode="none"))
        running = sdk.containers.get(created["Id"])
        sock = running.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
        running.start()
        raw: socket.socket = sock._sock
        raw.sendall(b"through attach\n")
        raw.shutdown(socket.SHUT_WR)  # the half-close reaches the container: cat ends
        assert _read_all(raw).endswith(b"through attach\n")
        assert running.wait(timeout=30)["StatusCode"] == 0
        sock.close()
        assert {c.id for c in sdk.containers.list(all=True)} >= {container.id, running.id}
        container.remove()
        running.remove()
    finally:
        sdk.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    parts = []
    while data := sock.recv(65536):
        parts.append(data)
    return b"".join(parts)


def _raw(endpoint: str, data: bytes, read: bool = True) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(endpoint)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return _read_all(sock) if read else b""


def test_hostile_input_gets_clear_errors_and_the_proxy_keeps_serving(docker_rig: DockerRig) -> None:
    docker_rig.start_proxy()
    endpoint = docker_rig.env.proxy_endpoint
    garbage = _raw(endpoint, b"\x00\xff garbage \r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400") and b'"message"' in garbage
    truncated = _raw(endpoint, b"POST /v1.41/containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 100\r\n"
                               b"\r\n{\"Ima")
    assert truncated.startswith(b"HTTP/1.1 400") and b"received 5 bytes, expected 100" in truncated
    # A relayed body broken off: dockerd sees the broken request, the client gets no made-up answer.
    assert _raw(endpoint, b"POST /v1.41/images/load HTTP/1.1\r\nHost: d\r\nContent-Length: 100\r\n\r\nshort") == b""
    malformed = b"POST /v1.41/containers/create HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n" \
                b"Content-Length: 9\r\nConnection: close\r\n\r\n{\"Image\":"
    direct, proxied = _raw(docker_rig.dockerd.endpoint, malformed), _raw(endpoint, malformed)
    assert _status_and_body(proxied) == _status_and_body(direct)
    assert _status_and_body(direct)[0] >= 400 and b"message" in _status_and_body(direct)[1]
    big = 100 * MiB
    head = (b"POST /v1.41/containers/create HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % big)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(endpoint)
        sock.sendall(head + b"{" * 65536)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413") and b"larger than" in answer
    assert api(endpoint, "GET", "/_ping") == (200, b"OK")
    status, containers = api(endpoint, "GET", "/v1.41/containers/json?all=1")
    assert status == 200 and isinstance(containers, list)


def _status_and_body(response: bytes) -> tuple[int, bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.1 (\d+)", head)
    assert match, response[:200]
    if b"chunked" in head.lower():
        size, _, rest = body.partition(b"\r\n")
        body = rest[: int(size, 16)]
    return int(match.group(1)), body


def test_sigterm_drains_and_removes_the_socket(docker_rig: DockerRig) -> None:
    proxy = docker_rig.start_proxy()
    assert proxy.pid is not None
    os.kill(proxy.pid, signal.SIGTERM)
    assert proxy.stop() == 0
    assert not os.path.exists(docker_rig.env.proxy_endpoint)


def _exchange(endpoint: str, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = UnixHTTPConnection(endpoint, timeout=30)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders() if k.lower() not in ("date", "content-length",
                                                                                  "transfer-encoding")}
        return resp.status, headers, resp.read()
    finally:
        conn.close()


def test_pass_through_answers_are_dockerds_own(docker_rig: DockerRig) -> None:
    docker_rig.start_proxy()
    direct, proxied = docker_rig.dockerd.endpoint, docker_rig.env.proxy_endpoint
    for method, path in [("HEAD", "/_ping"), ("GET", "/_ping"), ("GET", "/version"), ("GET", "/v1.41/version"),
                         ("GET", "/v1.41/containers/nope/json"), ("GET", "/v1.41/images/json"),
                         ("POST", "/v1.41/containers/nope/start"), ("DELETE", "/v1.41/containers/nope"),
                         ("GET", "/v1.41/no/such/endpoint")]:
        assert _exchange(proxied, method, path) == _exchange(direct, method, path), (method, path)

    def many(_: int) -> list[tuple[int, dict[str, str], bytes]]:
        return [_exchange(proxied, "GET", "/v1.41/containers/json?all=1") for _ in range(10)]

    with ThreadPoolExecutor(20) as pool:
        results = [r for batch in pool.map(many, range(20)) for r in batch]
    assert {r[0] for r in results} == {200} and len({r[2] for r in results}) == 1
