"""Issue 2's acceptance tests: with no plugins, the proxy is invisible to kubelet.

Every check runs the same thing through the proxy and straight at containerd and
compares the answers, after removing only what legitimately differs between two
runs (ids, timestamps, stats counters, streaming tokens). Where real containerd
can't show a property (it does not implement GetContainerEvents; it doesn't echo
metadata or deadlines), a tiny fake CRI backend stands in for it.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from cri_api.v1alpha2 import api_pb2 as cri_v1alpha2
from google.protobuf.json_format import MessageToDict, MessageToJson
from google.protobuf.message import Message

from koord.runtimeproxy.streams import STOPPING_MESSAGE
from koord_testing.cgroups import Cgroup, shares_to_weight
from koord_testing.containerd import Containerd
from koord_testing.fakecri import ECHO_CODE, INITIAL_METADATA_KEY, MIRROR_METHOD, FakeCRI
from koord_testing.kubelet import KubeletClient, grpc_target
from koord_testing.proxy import RuntimeProxy
from koord_testing.runtimes import ContainerdRuntime
from koord_testing.sharedbin import missing_shared_binaries, shared_binary
from koord_testing.wait import wait_for

pytestmark = pytest.mark.e2e

# Values that differ between two identical runs on the same runtime.
VOLATILE_FIELDS = frozenset(
    {
        "created_at",
        "started_at",
        "finished_at",
        "timestamp",
        "usage_core_nano_seconds",
        "usage_nano_cores",
        "working_set_bytes",
        "available_bytes",
        "usage_bytes",
        "rss_bytes",
        "page_faults",
        "major_page_faults",
        "used_bytes",
        "inodes_used",
    }
)
_STREAM_URL_TOKEN = re.compile(r"/(exec|attach|portforward)/[A-Za-z0-9_-]+")
CALL_TIMEOUT = 15.0


@pytest.fixture(params=["haproxy", "python"])
def data_plane(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both data planes: each must be invisible to kubelet."""
    return str(request.param)


def normalized(value: Any, ids: dict[str, str]) -> Any:
    """A comparable form of a response: volatile fields dropped, run-specific ids named."""
    if isinstance(value, Message):
        value = MessageToDict(value, preserving_proto_field_name=True)
    if isinstance(value, dict):
        return {k: normalized(v, ids) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, (list, tuple)):
        return [normalized(v, ids) for v in value]
    if isinstance(value, str):
        for real, name in ids.items():
            value = value.replace(real, name)
        return _STREAM_URL_TOKEN.sub(r"/\1/<token>", value)
    return value


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def rpc_error(call: Callable[[], Any]) -> tuple[str, str]:
    """``(code name, details)`` of a call expected to fail; fails the test if it succeeds."""
    try:
        call()
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""
    pytest.fail("call succeeded but an error was expected")


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """``(code name, details)`` of any call; ``("OK", "")`` on success."""
    try:
        call()
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""
    return "OK", ""


def answer_of(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("OK", normalized response)`` or ``(code name, details)``: what a caller sees of a call."""
    try:
        return "OK", normalized(call(), {})
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""


# ------------------------------------------------------------------ the full lifecycle


def kubelet_lifecycle(client: KubeletClient, image: str, uid: str) -> dict[str, Any]:
    """Drives one pod through every lifecycle call kubelet makes; returns each normalized answer."""
    pb, rt = cri, client.runtime
    out: dict[str, Any] = {}
    ids: dict[str, str] = {}

    def record(step: str, response: Any) -> Any:
        out[step] = normalized(response, ids)
        return response

    record("Version", rt.Version(pb.VersionRequest(), timeout=CALL_TIMEOUT))
    sandbox_id = client.run_pod(
        "transparency", namespace="e2e", uid=uid, labels={"app": "t"}, annotations={"note": "x"}, qos="burstable"
    )
    ids[sandbox_id] = "<sandbox>"
    parent = client.pod_cgroup_parent(sandbox_id)
    record("PodSandboxStatus", client.pod_status(sandbox_id))

    container_id = client.create_container(
        sandbox_id,
        "app",
        image,
        envs={"KOORD_E2E": "1", "B": "2"},
        labels={"tier": "web"},
        annotations={"anno": "v"},
        resources={"cpu_shares": 512, "memory_limit_in_bytes": 512 << 20},
    )
    ids[container_id] = "<container>"
    record("ContainerStatus.created", client.container_status(container_id))
    client.start_container(container_id)
    record("ContainerStatus.running", client.container_status(container_id))

    container_filters = {
        "sandbox": pb.ContainerFilter(pod_sandbox_id=sandbox_id),
        "id": pb.ContainerFilter(id=container_id),
        "label": pb.ContainerFilter(label_selector={"io.kubernetes.pod.uid": uid, "tier": "web"}),
        "state": pb.ContainerFilter(
            pod_sandbox_id=sandbox_id, state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING)
        ),
    }
    for name, flt in container_filters.items():
        listed = rt.ListContainers(pb.ListContainersRequest(filter=flt), timeout=CALL_TIMEOUT)
        assert len(listed.containers) == 1, f"ListContainers filter {name} via {client.endpoint}: {listed}"
        record(f"ListContainers.{name}", listed)
    pod_filters = {
        "id": pb.PodSandboxFilter(id=sandbox_id),
        "label": pb.PodSandboxFilter(label_selector={"io.kubernetes.pod.uid": uid, "app": "t"}),
        "state": pb.PodSandboxFilter(
            label_selector={"io.kubernetes.pod.uid": uid},
            state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY),
        ),
    }
    for name, flt in pod_filters.items():
        listed = rt.ListPodSandbox(pb.ListPodSandboxRequest(filter=flt), timeout=CALL_TIMEOUT)
        assert len(listed.items) == 1, f"ListPodSandbox filter {name} via {client.endpoint}: {listed}"
        record(f"ListPodSandbox.{name}", listed)

    client.update_resources(
        container_id,
        {"cpu_shares": 256, "cpu_period": 100000, "cpu_quota": 20000, "memory_limit_in_bytes": 256 << 20},
    )
    cg = Cgroup.of_container(parent, container_id)
    out["cgroup"] = {"cpu_weight": cg.cpu_weight(), "cpu_max": cg.cpu_max(), "memory_limit": cg.memory_limit()}
    record("ContainerStatus.updated", client.container_status(container_id))

    env = record("ExecSync.env", client.exec_sync(container_id, ["/pause", "env"]))
    out["env"] = sorted(env.stdout.decode().splitlines())
    record("ExecSync.echo", client.exec_sync(container_id, ["/pause", "echo", "hello", "proxy"]))
    record("ExecSync.exit", client.exec_sync(container_id, ["/pause", "exit", "3"]))
    record(
        "Exec",
        rt.Exec(pb.ExecRequest(container_id=container_id, cmd=["/pause", "env"], stdout=True), timeout=CALL_TIMEOUT),
    )
    record("Attach", rt.Attach(pb.AttachRequest(container_id=container_id, stdout=True), timeout=CALL_TIMEOUT))
    record(
        "PortForward",
        rt.PortForward(pb.PortForwardRequest(pod_sandbox_id=sandbox_id, port=[8080]), timeout=CALL_TIMEOUT),
    )

    container_stats = rt.ContainerStats(pb.ContainerStatsRequest(container_id=container_id), timeout=CALL_TIMEOUT)
    record("ContainerStats", container_stats)
    stats = rt.ListContainerStats(
        pb.ListContainerStatsRequest(filter=pb.ContainerStatsFilter(pod_sandbox_id=sandbox_id)), timeout=CALL_TIMEOUT
    )
    assert len(stats.stats) == 1, f"ListContainerStats via {client.endpoint}: {stats}"
    record("ListContainerStats", stats)
    pod_stats = rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    record("PodSandboxStats", pod_stats)
    record(
        "ListPodSandboxStats",
        rt.ListPodSandboxStats(
            pb.ListPodSandboxStatsRequest(filter=pb.PodSandboxStatsFilter(id=sandbox_id)), timeout=CALL_TIMEOUT
        ),
    )
    record(
        "ReopenContainerLog",
        rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=container_id), timeout=CALL_TIMEOUT),
    )
    record("Status", rt.Status(pb.StatusRequest(), timeout=CALL_TIMEOUT))

    images = client.image
    spec = pb.ImageSpec(image=image)
    listed_images = images.ListImages(pb.ListImagesRequest(filter=pb.ImageFilter(image=spec)), timeout=CALL_TIMEOUT)
    assert len(listed_images.images) == 1, f"ListImages via {client.endpoint}: {listed_images}"
    record("ListImages", listed_images)
    record("ImageStatus", images.ImageStatus(pb.ImageStatusRequest(image=spec, verbose=True), timeout=CALL_TIMEOUT))
    record("ImageFsInfo", images.ImageFsInfo(pb.ImageFsInfoRequest(), timeout=CALL_TIMEOUT))

    client.stop_container(container_id, grace=5)
    record("ContainerStatus.exited", client.container_status(container_id))
    exited = rt.ListContainers(
        pb.ListContainersRequest(
            filter=pb.ContainerFilter(
                pod_sandbox_id=sandbox_id, state=pb.ContainerStateValue(state=pb.CONTAINER_EXITED)
            )
        ),
        timeout=CALL_TIMEOUT,
    )
    record("ListContainers.exited", exited)
    client.remove_container(container_id)
    out["ContainerStatus.removed"] = normalized(rpc_error(lambda: client.container_status(container_id)), ids)
    client.stop_pod(sandbox_id)
    record("PodSandboxStatus.stopped", client.pod_status(sandbox_id))
    client.remove_pod(sandbox_id)
    out["PodSandboxStatus.removed"] = normalized(rpc_error(lambda: client.pod_status(sandbox_id)), ids)
    removed = rt.ListPodSandbox(pb.ListPodSandboxRequest(filter=pod_filters["id"]), timeout=CALL_TIMEOUT)
    record("ListPodSandbox.removed", removed)
    return out


def test_lifecycle_through_proxy_matches_direct(
    containerd: Containerd, kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    uid = str(uuid.uuid4())  # the same pod identity both times: only ids and times may differ
    direct = kubelet_lifecycle(kubelet, containerd.image, uid)
    proxied = kubelet_lifecycle(proxied_kubelet, containerd.image, uid)

    assert direct["cgroup"] == {"cpu_weight": shares_to_weight(256), "cpu_max": (20000, 100000),
                                "memory_limit": 256 << 20}
    assert {"KOORD_E2E=1", "B=2"} <= set(direct["env"])
    assert proxied.keys() == direct.keys()
    mismatched = [step for step in direct if proxied[step] != direct[step]]
    assert {s: proxied[s] for s in mismatched} == {s: direct[s] for s in mismatched}, f"differ: {mismatched}"
    assert proxied["Exec"]["url"].startswith("http://127.0.0.1:")


# ------------------------------------------------------------------ every method, error paths


def _cri_methods() -> list[tuple[str, Any]]:
    return [
        (service.full_name, method)
        for service in cri.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


# containerd 2.x resets a quiet stream with RST_STREAM(CANCEL) when the caller's deadline passes,
# racing the caller's own timer: the same direct call answers DEADLINE_EXCEEDED or CANCELLED
# ("Received RST_STREAM with error code 8"), so both read as the deadline here.
_DEADLINE = ("DEADLINE_EXCEEDED", "<the caller's deadline passed>")


def _raw_call(channel: grpc.Channel, service: str, method: Any, request: Message) -> tuple[str, str]:
    path = f"/{service}/{method.name}"
    if method.server_streaming:
        stream = channel.unary_stream(path, request_serializer=_serialize)(request, timeout=3)

        def first() -> None:
            for _ in stream:
                break
            stream.cancel()

        answer = outcome(first)
        if answer[0] == "DEADLINE_EXCEEDED" or (answer[0] == "CANCELLED" and "error code 8" in answer[1]):
            return _DEADLINE
        return answer
    call = channel.unary_unary(path, request_serializer=_serialize)
    return outcome(lambda: call(request, timeout=CALL_TIMEOUT))


def drain_held_events(channel: grpc.Channel) -> int:
    """Reads the container events containerd holds for its next subscriber until none comes
    for a second; returns how many.

    containerd 2.x keeps the events it publishes while nobody subscribes and hands them all to
    the first stream opened next, so of two streams opened one after the other only the first
    would see them: both sides of a comparison must start with none held.
    """
    drained = 0
    while True:
        stream = channel.unary_stream("/runtime.v1.RuntimeService/GetContainerEvents",
                                      request_serializer=_serialize)(cri.GetEventsRequest(), timeout=1.0)
        got = 0
        try:
            for _ in stream:
                got += 1
        except grpc.RpcError:
            pass
        drained += got
        if got == 0:
            return drained


def _bogus_request(method: Any, bogus_id: str) -> Message | None:
    """The method's request with every id field set to an id that doesn't exist, if it has any."""
    request = getattr(cri, method.input_type.name)()
    id_fields = [f.name for f in method.input_type.fields if f.name in ("container_id", "pod_sandbox_id")]
    for name in id_fields:
        setattr(request, name, bogus_id)
    return request if id_fields else None


def _restore_test_image(containerd: Containerd, kubelet: KubeletClient) -> None:
    """Re-imports the test image if a call removed it.

    containerd 1.6 treats an empty RemoveImageRequest as matching an image and deletes
    it: both sides must start from the same state, and later tests need the image.
    """
    spec = cri.ImageSpec(image=containerd.image)
    if not kubelet.image.ImageStatus(cri.ImageStatusRequest(image=spec), timeout=CALL_TIMEOUT).HasField("image"):
        containerd.reimport_image()


def test_descriptor_has_all_cri_methods() -> None:
    services = {s.full_name: len(s.methods) for s in cri.DESCRIPTOR.services_by_name.values()}
    assert services["runtime.v1.RuntimeService"] >= 30
    assert services["runtime.v1.ImageService"] >= 5


def test_every_method_answers_like_direct(
    containerd: Containerd, kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    bogus_id = "bogus" + uuid.uuid4().hex
    differences, not_found = [], []
    for service, method in _cri_methods():
        empty = getattr(cri, method.input_type.name)()
        requests = {"empty": empty, "bogus-id": _bogus_request(method, bogus_id)}
        for kind, request in requests.items():
            if request is None:
                continue
            if method.server_streaming:
                drain_held_events(kubelet.channel)
            direct = _raw_call(kubelet.channel, service, method, request)
            _restore_test_image(containerd, kubelet)
            proxied = _raw_call(proxied_kubelet.channel, service, method, request)
            _restore_test_image(containerd, kubelet)
            if proxied != direct:
                differences.append(f"{method.name} ({kind}): direct {direct} != proxied {proxied}")
            if kind == "bogus-id" and direct[0] == "NOT_FOUND":
                not_found.append(method.name)
    assert not differences, "\n".join(differences)
    # The comparison above covered containerd's NotFound messages, not just codes (StopPodSandbox
    # of an unknown id is NOT_FOUND on 1.6 and OK on 2.x).
    assert {"ContainerStatus", "PodSandboxStatus", "StartContainer"} <= set(not_found)


# ------------------------------------------------------------------ deadlines, sizes, versions


@pytest.fixture
def running_container(containerd: Containerd, kubelet: KubeletClient) -> str:
    sandbox_id = kubelet.run_pod("transparency-exec")
    return kubelet.run_container(sandbox_id, "app", containerd.image)


def test_call_without_deadline_works(running_container: str, proxied_kubelet: KubeletClient) -> None:
    response = proxied_kubelet.runtime.ExecSync(
        cri.ExecSyncRequest(container_id=running_container, cmd=["/pause", "sleep", "1"], timeout=10)
    )
    assert response.exit_code == 0


def test_deadline_is_passed_on(
    running_container: str, kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    request = cri.ExecSyncRequest(container_id=running_container, cmd=["/pause", "sleep", "3"], timeout=10)
    direct = rpc_error(lambda: kubelet.runtime.ExecSync(request, timeout=1))
    proxied = rpc_error(lambda: proxied_kubelet.runtime.ExecSync(request, timeout=1))
    assert at_deadline(direct), direct
    assert at_deadline(proxied), proxied


def at_deadline(answer: tuple[str, str]) -> bool:
    """The caller's own DEADLINE_EXCEEDED, or the runtime's answer to the same deadline when it
    comes first (containerd ends the call with its context's "deadline exceeded" error, which
    grpc-go sends as UNKNOWN: a race the caller's timer usually wins, less often on a busy node)."""
    code, details = answer
    return code == "DEADLINE_EXCEEDED" or (code == "UNKNOWN" and "deadline exceeded" in details.lower())


def test_twelve_mib_response_passes(
    running_container: str, kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    size = 12 * 1024 * 1024
    direct = kubelet.exec_sync(running_container, ["/pause", "big", str(size)])
    assert len(direct.stdout) == size, "containerd itself capped ExecSync output; the test needs another source"
    proxied = proxied_kubelet.exec_sync(running_container, ["/pause", "big", str(size)])
    assert proxied.exit_code == 0
    assert len(proxied.stdout) == size
    assert proxied.stdout == direct.stdout


def _serves_v1alpha2(endpoint: str) -> bool:
    """Whether the runtime answers CRI v1alpha2 (containerd 1.6 does; 2.x removed it)."""
    with KubeletClient(endpoint, version="v1alpha2") as client:
        return outcome(lambda: client.runtime.Version(cri_v1alpha2.VersionRequest(), timeout=CALL_TIMEOUT))[0] == "OK"


def test_v1alpha2_calls_pass(containerd: Containerd, kubelet: KubeletClient, proxy: RuntimeProxy) -> None:
    """A v1alpha2 call gets through the proxy what the runtime answers: its data where it serves
    v1alpha2, its error where it does not."""
    sandbox_id = kubelet.run_pod("transparency-v1alpha2")
    pb = cri_v1alpha2
    direct = KubeletClient(containerd.endpoint, version="v1alpha2")
    proxied = KubeletClient(proxy.endpoint, version="v1alpha2")
    request = pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id=sandbox_id))
    try:
        answers = {
            name: [answer_of(lambda c=client: c.runtime.Version(pb.VersionRequest(), timeout=CALL_TIMEOUT)),
                   answer_of(lambda c=client: c.runtime.ListPodSandbox(request, timeout=CALL_TIMEOUT))]
            for name, client in (("direct", direct), ("proxied", proxied))
        }
        assert answers["proxied"] == answers["direct"]
        if containerd.runtime.major < 2:
            assert [p["id"] for p in answers["proxied"][1][1]["items"]] == [sandbox_id]
        else:
            assert answers["direct"][0][0] == "UNIMPLEMENTED", answers["direct"]
    finally:
        direct.close()
        proxied.close()


V1ALPHA2_LIFECYCLE = ("RunPodSandbox", "CreateContainer", "StartContainer", "UpdateContainerResources",
                      "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox")


def test_v1alpha2_lifecycle_through_proxy(containerd: Containerd, proxy: RuntimeProxy) -> None:
    if not _serves_v1alpha2(containerd.endpoint):
        # The runtime has no v1alpha2: every intercepted call must bring its own error back.
        service = cri_v1alpha2.DESCRIPTOR.services_by_name["RuntimeService"]
        direct_channel = grpc.insecure_channel(grpc_target(containerd.endpoint))
        proxied_channel = grpc.insecure_channel(grpc_target(proxy.endpoint))
        try:
            for name in V1ALPHA2_LIFECYCLE:
                method = service.methods_by_name[name]
                request = getattr(cri_v1alpha2, method.input_type.name)()
                direct = _raw_call(direct_channel, service.full_name, method, request)
                assert direct[0] == "UNIMPLEMENTED", (name, direct)
                assert _raw_call(proxied_channel, service.full_name, method, request) == direct, name
        finally:
            direct_channel.close()
            proxied_channel.close()
        return
    client = KubeletClient(
        proxy.endpoint,
        version="v1alpha2",
        on_pod_created=containerd.track_pod_cgroup,
        log_root=containerd.workdir / "pod-logs",
    )
    try:
        sandbox_id = client.run_pod("transparency-v1alpha2-life")
        container_id = client.run_container(sandbox_id, "app", containerd.image, resources={"cpu_shares": 300})
        assert client.container_status(container_id).status.state == cri_v1alpha2.CONTAINER_RUNNING
        parent = client.pod_cgroup_parent(sandbox_id)
        assert Cgroup.of_container(parent, container_id).cpu_weight() == shares_to_weight(300)
        assert client.exec_sync(container_id, ["/pause", "echo", "old", "kubelet"]).stdout == b"old kubelet\n"
        client.stop_container(container_id, grace=5)
        client.remove_container(container_id)
        client.stop_pod(sandbox_id)
        client.remove_pod(sandbox_id)
    finally:
        errors = client.cleanup()
        client.close()
    assert not errors


# ------------------------------------------------------------------ backend outage


def _wait_for(call: Callable[[], Any], timeout: float) -> Any:
    """Retries ``call`` while it fails with UNAVAILABLE; the last error is raised after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:
                raise
        time.sleep(0.1)


def test_backend_down_then_back(tmp_path: Path, data_plane: str, containerd_runtime: ContainerdRuntime) -> None:
    with Containerd(tmp_path / "ctd", runtime=containerd_runtime) as backend:
        with RuntimeProxy(tmp_path / "proxy", backend.endpoint, data_plane=data_plane) as proxy:
            client = KubeletClient(
                proxy.endpoint, on_pod_created=backend.track_pod_cgroup, log_root=backend.workdir / "pod-logs"
            )
            try:
                sandbox_id = client.run_pod("transparency-outage")
                backend.stop_daemon()
                assert rpc_error(lambda: client.runtime.Version(cri.VersionRequest(), timeout=5))[0] == "UNAVAILABLE"
                listing = rpc_error(lambda: client.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=5))
                assert listing[0] == "UNAVAILABLE"
                assert rpc_error(lambda: client.image.ImageFsInfo(cri.ImageFsInfoRequest(), timeout=5))[0] == (
                    "UNAVAILABLE"
                )
                assert proxy.running, "the proxy must survive a backend outage"

                backend.restart_daemon()
                listed = _wait_for(
                    lambda: client.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=5), timeout=10
                )
                assert sandbox_id in [p.id for p in listed.items]
                container_id = client.run_container(sandbox_id, "app", backend.image)
                assert client.container_status(container_id).status.state == cri.CONTAINER_RUNNING
            finally:
                client.cleanup()
                client.close()


# ------------------------------------------------------------------ fake backend: metadata, deadlines, events


@pytest.fixture
def fake_proxy(tmp_path: Path, data_plane: str) -> Iterator[tuple[FakeCRI, grpc.Channel]]:
    with FakeCRI(tmp_path / "fake.sock") as fake:
        fake.echo.add("StartContainer")  # answered with the echo, like the methods it does not implement
        proxy = RuntimeProxy(tmp_path / "proxy", str(fake.socket), data_plane=data_plane)
        proxy.start()
        channel = grpc.insecure_channel(
            grpc_target(proxy.endpoint),
            options=[("grpc.max_receive_message_length", 64 << 20)],  # the proxy's limit, not kubelet's
        )
        try:
            yield fake, channel
        finally:
            channel.close()
            proxy.stop()
            print("--- runtime proxy log ---\n" + proxy.logs(tail=200))


def _echo_of(channel: grpc.Channel, path: str, request: bytes, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    call = channel.unary_unary(path)
    try:
        call(request, **kwargs)
    except grpc.RpcError as err:
        assert err.code() == ECHO_CODE, f"{path}: {err.code()} {err.details()}"
        return json.loads(err.details()), dict(err.trailing_metadata() or ())
    pytest.fail(f"{path}: the fake backend always fails this call")


# A method the proxy knows (passthrough), one it intercepts, and one no CRI version has.
ECHO_PATHS = (
    "/runtime.v1.RuntimeService/ContainerStats",
    "/runtime.v1.RuntimeService/StartContainer",
    "/runtime.v1.RuntimeService/SomeFutureMethod",
    "/runtime.v1.ImageService/PullImage",
)


@pytest.mark.parametrize("path", ECHO_PATHS)
def test_metadata_and_request_bytes_pass_unchanged(fake_proxy: tuple[FakeCRI, grpc.Channel], path: str) -> None:
    _, channel = fake_proxy
    # Field 2047 is unknown to every CRI message: a transparent proxy keeps it.
    request = cri.StartContainerRequest(container_id="c1").SerializeToString() + b"\xf8\x7f\x01"
    metadata = (("x-koord-test", "value-1"), ("x-koord-test-bin", b"\x00\x01\xff"))
    echo, trailers = _echo_of(channel, path, request, metadata=metadata, timeout=CALL_TIMEOUT)
    assert ["x-koord-test", "value-1"] in echo["metadata"]
    assert ["x-koord-test-bin", "0001ff"] in echo["metadata"]
    assert echo["request"] == request.hex()
    assert trailers.get("x-fake-trailer") == "kept"


@pytest.mark.parametrize("path", ECHO_PATHS[:2])
def test_backend_sees_callers_deadline(fake_proxy: tuple[FakeCRI, grpc.Channel], path: str) -> None:
    _, channel = fake_proxy
    request = cri.StartContainerRequest(container_id="c1").SerializeToString()
    with_deadline, _ = _echo_of(channel, path, request, timeout=7.0)
    # grpc-timeout travels rounded up to its unit, so allow a little over the caller's 7 s.
    assert with_deadline["deadline"] is not None and 0 < with_deadline["deadline"] <= 7.5
    without_deadline, _ = _echo_of(channel, path, request)
    assert without_deadline["deadline"] is None, "a call with no deadline must reach the backend with none"


def test_container_events_stream_through_proxy(fake_proxy: tuple[FakeCRI, grpc.Channel]) -> None:
    fake, channel = fake_proxy
    events = channel.unary_stream(
        "/runtime.v1.RuntimeService/GetContainerEvents",
        request_serializer=_serialize,
        response_deserializer=cri.ContainerEventResponse.FromString,
    )(cri.GetEventsRequest(), timeout=30)
    wait_for(lambda: fake.subscriber_count() == 1, "the proxy to open the backend's event stream")

    run = channel.unary_unary(
        "/runtime.v1.RuntimeService/RunPodSandbox",
        request_serializer=_serialize,
        response_deserializer=cri.RunPodSandboxResponse.FromString,
    )
    config = cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="evt", namespace="e2e", uid="u1"))
    sandbox_id = run(cri.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT).pod_sandbox_id

    event = next(events)
    assert event.container_id == sandbox_id
    assert event.container_event_type == cri.CONTAINER_STARTED_EVENT
    assert event.pod_sandbox_status.metadata.name == "evt"
    events.cancel()
    wait_for(lambda: fake.subscriber_count() == 0, "the cancel to reach the backend's stream")


def test_container_events_answer_like_direct(
    containerd: Containerd, kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    """UNIMPLEMENTED on containerd 1.6; on 2.x a quiet stream that ends at the caller's deadline."""
    method = cri.DESCRIPTOR.services_by_name["RuntimeService"].methods_by_name["GetContainerEvents"]
    drain_held_events(kubelet.channel)
    direct = _raw_call(kubelet.channel, "runtime.v1.RuntimeService", method, cri.GetEventsRequest())
    proxied = _raw_call(proxied_kubelet.channel, "runtime.v1.RuntimeService", method, cri.GetEventsRequest())
    assert proxied == direct


class EventReader:
    """Reads one GetContainerEvents stream in a thread: its events, then how it ended."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.stream = channel.unary_stream(
            "/runtime.v1.RuntimeService/GetContainerEvents",
            request_serializer=_serialize,
            response_deserializer=cri.ContainerEventResponse.FromString,
        )(cri.GetEventsRequest())
        self.events: list[cri.ContainerEventResponse] = []
        self.ended: tuple[str, str] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self.stream:
                self.events.append(event)
            self.ended = ("OK", "")
        except grpc.RpcError as err:
            self.ended = (err.code().name, err.details() or "")

    def close(self) -> None:
        self.stream.cancel()
        self._thread.join(timeout=10)


def test_lifecycle_events_through_proxy_match_direct(
    containerd: Containerd, kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    """A pod's and a container's lifecycle made through the proxy shows the same events, in the
    same order, on a stream opened through the proxy as on one opened straight at containerd
    (1.6, which has no event stream, answers both UNIMPLEMENTED)."""
    drain_held_events(kubelet.channel)
    direct, proxied = EventReader(kubelet.channel), EventReader(proxied_kubelet.channel)
    try:
        sandbox_id = proxied_kubelet.run_pod("transparency-events")
        container_id = proxied_kubelet.run_container(sandbox_id, "app", containerd.image)
        proxied_kubelet.stop_container(container_id, grace=5)
        proxied_kubelet.remove_container(container_id)
        proxied_kubelet.stop_pod(sandbox_id)
        proxied_kubelet.remove_pod(sandbox_id)
        ids = {sandbox_id: "<sandbox>", container_id: "<container>"}

        def mine(reader: EventReader) -> list[Any]:
            return [normalized(e, ids) for e in list(reader.events) if e.container_id in ids]

        def types(reader: EventReader) -> list[tuple[str, str]]:
            return [(ids[e.container_id], cri.ContainerEventType.Name(e.container_event_type))
                    for e in list(reader.events) if e.container_id in ids]

        def sandbox_deleted(reader: EventReader) -> bool:
            return reader.ended is not None or ("<sandbox>", "CONTAINER_DELETED_EVENT") in types(reader)

        wait_for(lambda: sandbox_deleted(direct) and sandbox_deleted(proxied), "both streams to see the pod go")
        assert proxied.ended == direct.ended
        assert mine(proxied) == mine(direct)
        if containerd.runtime.major >= 2:
            seen = types(direct)
            for kind in ("CREATED", "STARTED", "STOPPED", "DELETED"):
                assert ("<container>", f"CONTAINER_{kind}_EVENT") in seen, seen
            assert seen[-1] == ("<sandbox>", "CONTAINER_DELETED_EVENT"), seen
        else:
            assert direct.ended is not None and direct.ended[0] == "UNIMPLEMENTED", direct.ended
    finally:
        direct.close()
        proxied.close()


def test_proxy_stop_ends_event_streams_and_the_client_reopens(tmp_path: Path, data_plane: str) -> None:
    """SIGTERM ends an open event stream at once with UNAVAILABLE naming the stop (not after the
    grace period, not as a refused stream); the backend's stream goes too, and a stream reopened
    through the restarted proxy carries the next event."""
    with FakeCRI(tmp_path / "fake.sock") as fake:
        proxy = RuntimeProxy(tmp_path / "proxy", str(fake.socket), data_plane=data_plane).start()
        channel = grpc.insecure_channel(grpc_target(proxy.endpoint))
        try:
            reader = EventReader(channel)
            wait_for(lambda: fake.subscriber_count() == 1, "the proxy to open the backend's event stream")
            assert proxy.stop(timeout=15) == 0, proxy.logs(tail=40)
            wait_for(lambda: reader.ended is not None, "the stream to end")
            assert reader.ended == ("UNAVAILABLE", STOPPING_MESSAGE)
            wait_for(lambda: fake.subscriber_count() == 0, "the backend's stream to end")
            assert "finishing in-flight calls" in proxy.logs()

            proxy.start()
            reopened = EventReader(channel)
            wait_for(lambda: fake.subscriber_count() == 1, "the reopened stream to reach the backend")
            config = cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="after", namespace="e2e", uid="u9"))
            channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox", request_serializer=_serialize)(
                cri.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
            wait_for(lambda: reopened.events, "the event on the reopened stream")
            assert reopened.events[0].pod_sandbox_status.metadata.name == "after"
            reopened.close()
        finally:
            channel.close()
            proxy.stop()


def test_quiet_stream_is_cut_only_by_the_idle_timeout(tmp_path: Path, data_plane: str) -> None:
    """The idle timeout is the one thing that bounds a quiet stream: set to 8 s, a stream quiet
    for 5 s still carries the next event, and one quiet for 8 s ends with UNAVAILABLE saying why
    and takes the backend's stream with it (the default is a day)."""
    with FakeCRI(tmp_path / "fake.sock") as fake:
        proxy = RuntimeProxy(tmp_path / "proxy", str(fake.socket), data_plane=data_plane,
                             extra_args=["--data-plane-idle-timeout", "8s"]).start()
        channel = grpc.insecure_channel(grpc_target(proxy.endpoint))
        try:
            reader = EventReader(channel)
            wait_for(lambda: fake.subscriber_count() == 1, "the proxy to open the backend's event stream")
            time.sleep(5)
            config = cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="quiet", namespace="e2e", uid="u8"))
            channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox", request_serializer=_serialize)(
                cri.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
            wait_for(lambda: reader.events, "the event after 5 quiet seconds")
            assert reader.ended is None
            quiet_since = time.monotonic()
            wait_for(lambda: reader.ended is not None, "the idle timeout to end the stream", timeout=60)
            assert time.monotonic() - quiet_since >= 7.5
            assert reader.ended is not None and reader.ended[0] == "UNAVAILABLE", reader.ended
            assert "--data-plane-idle-timeout" in reader.ended[1]
            wait_for(lambda: fake.subscriber_count() == 0, "the backend's stream to end")
        finally:
            channel.close()
            proxy.stop()


# ------------------------------------------------------------------ what real clients need of the data plane


def test_unknown_method_answers_like_direct_every_time(
    kubelet: KubeletClient, proxied_kubelet: KubeletClient
) -> None:
    path = "/runtime.v1.RuntimeService/NoSuchMethodAnywhere"
    direct = {outcome(lambda: kubelet.channel.unary_unary(path)(b"", timeout=CALL_TIMEOUT)) for _ in range(30)}
    proxied = [outcome(lambda: proxied_kubelet.channel.unary_unary(path)(b"", timeout=CALL_TIMEOUT))
               for _ in range(30)]
    assert len(direct) == 1 and next(iter(direct))[0] == "UNIMPLEMENTED"
    assert set(proxied) == direct, f"30 calls through the proxy answered {proxied}"


def test_backend_initial_metadata_reaches_the_client(fake_proxy: tuple[FakeCRI, grpc.Channel]) -> None:
    fake, channel = fake_proxy
    fake.add_pod("s1", "meta", {}, None)
    calls = {  # a pass-through method and a hooked one
        "ListPodSandbox": cri.ListPodSandboxRequest(),
        "RunPodSandbox": cri.RunPodSandboxRequest(
            config=cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="m", namespace="e2e", uid="u2"))),
    }
    for method, request in calls.items():
        _, call = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}", request_serializer=_serialize
                                      ).with_call(request, timeout=CALL_TIMEOUT)
        assert (INITIAL_METADATA_KEY, method) in tuple(call.initial_metadata()), method


def test_twenty_mib_each_way(fake_proxy: tuple[FakeCRI, grpc.Channel]) -> None:
    _, channel = fake_proxy
    payload = bytes(range(256)) * (20 * 1024 * 1024 // 256)
    answer = channel.unary_unary(f"/runtime.v1.RuntimeService/{MIRROR_METHOD}")(payload, timeout=60)
    assert len(answer) == len(payload)
    assert answer == payload


def test_idle_event_stream_outlives_short_timeouts(fake_proxy: tuple[FakeCRI, grpc.Channel]) -> None:
    fake, channel = fake_proxy
    events = channel.unary_stream(
        "/runtime.v1.RuntimeService/GetContainerEvents",
        request_serializer=_serialize,
        response_deserializer=cri.ContainerEventResponse.FromString,
    )(cri.GetEventsRequest())
    wait_for(lambda: fake.subscriber_count() == 1, "the proxy to open the backend's event stream")
    time.sleep(3)  # longer than every short timeout of the data plane (the 1 s connect timeout)
    config = cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="late", namespace="e2e", uid="u3"))
    channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox", request_serializer=_serialize)(
        cri.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
    assert next(events).pod_sandbox_status.metadata.name == "late"
    events.cancel()


def test_many_concurrent_long_calls_on_one_channel(fake_proxy: tuple[FakeCRI, grpc.Channel]) -> None:
    """kubelet multiplexes every call on one connection: 150 streams at once, beyond HTTP/2's usual 100.

    The fake backend, because containerd 1.6 itself stalls at about 120 concurrent ExecSync calls.
    """
    fake, channel = fake_proxy
    exec_sync = channel.unary_unary("/runtime.v1.RuntimeService/ExecSync", request_serializer=_serialize,
                                    response_deserializer=cri.ExecSyncResponse.FromString)
    request = cri.ExecSyncRequest(container_id="c1", cmd=["sleep", "2"], timeout=60)
    futures = [exec_sync.future(request, timeout=120) for _ in range(150)]
    assert [f.result().exit_code for f in futures] == [0] * 150
    # All at once, not 100 and then the rest: a stream limit would hold calls back.
    assert fake.most_concurrent_execs == 150


CRICTL = str(shared_binary("crictl"))


def test_crictl_lifecycle_with_socket_path_authority(
    containerd: Containerd, kubelet: KubeletClient, proxy: RuntimeProxy, tmp_path: Path
) -> None:
    """crictl 1.26 (grpc-go 1.51) sends the socket path as :authority, like older kubelets."""
    if missing_shared_binaries("crictl"):
        pytest.fail(f"{CRICTL} (cri-tools v1.26.1 built from upstream) is missing", pytrace=False)
    uid = str(uuid.uuid4())
    sandbox_config = kubelet.sandbox_config("crictl", "e2e", uid, None, None, "besteffort")
    container_config = kubelet.container_config(sandbox_config, "app", containerd.image, None, None, None, None,
                                                None, None)
    pod_json, container_json = tmp_path / "pod.json", tmp_path / "container.json"
    pod_json.write_text(MessageToJson(sandbox_config, preserving_proto_field_name=True, use_integers_for_enums=True))
    container_json.write_text(
        MessageToJson(container_config, preserving_proto_field_name=True, use_integers_for_enums=True))
    endpoint = f"unix://{proxy.endpoint}"

    def crictl(*args: str) -> str:
        done = subprocess.run([CRICTL, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
                               "--timeout", "60s", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"crictl {' '.join(args)}: {done.stderr}"
        return done.stdout.strip()

    containerd.track_pod_cgroup(sandbox_config.linux.cgroup_parent)
    sandbox_id = crictl("runp", str(pod_json))
    kubelet.pods.append(sandbox_id)  # removed straight at containerd if the test fails half-way
    kubelet.sandbox_configs[sandbox_id] = sandbox_config
    container_id = crictl("create", "--no-pull", sandbox_id, str(container_json), str(pod_json))
    crictl("start", container_id)
    assert crictl("ps", "-q", "--id", container_id) == container_id
    assert crictl("exec", "-s", container_id, "/pause", "echo", "old", "client") == "old client"
    crictl("stop", container_id)
    crictl("rm", container_id)
    crictl("stopp", sandbox_id)
    crictl("rmp", sandbox_id)
    assert rpc_error(lambda: kubelet.pod_status(sandbox_id))[0] == "NOT_FOUND"


def test_image_calls_go_to_the_image_endpoint(containerd: Containerd, tmp_path: Path, data_plane: str) -> None:
    with FakeCRI(tmp_path / "images.sock") as images:
        proxy = RuntimeProxy(tmp_path / "proxy", containerd.endpoint, data_plane=data_plane,
                             extra_args=("--remote-image-service-endpoint", str(images.socket))).start()
        try:
            with KubeletClient(proxy.endpoint) as client:
                assert client.runtime.Version(cri.VersionRequest(), timeout=CALL_TIMEOUT).runtime_name == "containerd"
                for call in (lambda: client.image.ListImages(cri.ListImagesRequest(), timeout=CALL_TIMEOUT),
                             lambda: client.channel.unary_unary("/runtime.v1.ImageService/SomeFutureMethod")(
                                 b"", timeout=CALL_TIMEOUT)):
                    code, details = rpc_error(call)  # the in-memory backend echoes what reached it
                    assert code == ECHO_CODE.name and json.loads(details)["request"] == "", details
        finally:
            proxy.stop()
