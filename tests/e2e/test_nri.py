"""The NRI wire layer against real containerd 2.x: registration, a container adjusted by the
example plugin, lifecycle events, a handler that raises, and a containerd restart.

containerd 1.6 has no NRI, so this module does not follow ``$KOORD_TEST_CONTAINERD``: its
own fixture always starts the private 2.x build and fails (never skips) when it is missing.
The hostile-peer tests stand a fake socket in for the runtime: what a broken or malicious
peer sends must end the session with a reason naming the fault, in bounded memory.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import random
import struct
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from koord.nri import api_pb2 as api
from koord.nri import events
from koord.nri.mux import encode_frames
from koord.nri.stub import Handlers, NriStub
from koord_testing.containerd import Containerd
from koord_testing.kubelet import KubeletClient
from koord_testing.wait import wait_for

pytestmark = pytest.mark.e2e

CHECKOUT = Path(__file__).resolve().parents[2]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nri_env_plugin", CHECKOUT / "examples" / "nri_env_plugin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Losses:
    """on_disconnect's reports, waitable."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, reason: str) -> None:
        with self.lock:
            self.reasons.append(reason)


def _runtime_spec(kubelet: KubeletClient, container_id: str) -> dict[str, object]:
    info = json.loads(kubelet.container_status(container_id, verbose=True).info["info"])
    spec: dict[str, object] = info["runtimeSpec"]
    return spec


def _env_of(kubelet: KubeletClient, container_id: str) -> list[str]:
    result = kubelet.exec_sync(container_id, ["/pause", "env"])
    assert result.exit_code == 0, result.stderr
    lines: list[str] = result.stdout.decode().splitlines()
    return lines


def test_example_plugin_adjusts_new_containers_and_survives_a_restart(
        containerd2: Containerd, kubelet2: KubeletClient) -> None:
    example = _example()
    losses = Losses()
    plugin = example.build(containerd2.nri_socket)
    plugin.stub.on_disconnect = losses
    plugin.start()
    try:
        assert plugin.stub.ready.wait(20), "the plugin did not get Configure and Synchronize"
        assert plugin.stub.subscribed == events.mask(api.CREATE_CONTAINER)

        sandbox = kubelet2.run_pod("nri-env", namespace="e2e")
        container = kubelet2.run_container(sandbox, "app", containerd2.image)
        assert f"{example.ENV_NAME}=nri-env" in _env_of(kubelet2, container)
        annotations = _runtime_spec(kubelet2, container)["annotations"]
        assert isinstance(annotations, dict)
        assert annotations[example.ANNOTATION] == "koord-env"

        containerd2.restart_daemon()
        wait_for(lambda: bool(losses.reasons), timeout=20, what="the stub to report the lost connection")
        assert plugin.stub.ready.wait(30), f"no re-registration after the restart (losses: {losses.reasons})"
        again = kubelet2.run_container(sandbox, "after-restart", containerd2.image)
        assert f"{example.ENV_NAME}=nri-env" in _env_of(kubelet2, again)
    finally:
        plugin.stop()


def test_lifecycle_events_and_a_raising_handler(containerd2: Containerd, kubelet2: KubeletClient,
                                                caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def record(event: str) -> Callable[..., None]:
        def handler(pod: api.PodSandbox, container: api.Container | None = None) -> None:
            with lock:
                seen.append((event, container.name if container is not None else pod.name))
        return handler

    def broken(pod: api.PodSandbox, container: api.Container) -> None:
        raise RuntimeError(f"post-start handler broke on {container.name}")

    synced: list[int] = []
    handlers = Handlers(
        synchronize=lambda pods, containers: synced.append(len(containers)),
        run_pod_sandbox=record("run_pod_sandbox"), stop_pod_sandbox=record("stop_pod_sandbox"),
        remove_pod_sandbox=record("remove_pod_sandbox"), start_container=record("start_container"),
        post_start_container=broken, stop_container=record("stop_container"),
        remove_container=record("remove_container"),
        create_container=lambda pod, container: api.ContainerAdjustment(env=[api.KeyValue(key="SEEN", value="1")]),
    )
    stub = NriStub("koord-events", "60", handlers, socket_path=containerd2.nri_socket)
    stub.start()
    try:
        assert stub.ready.wait(20)
        assert synced, "Synchronize was answered without calling the handler"
        with caplog.at_level(logging.ERROR, logger="koord.nri"):
            sandbox = kubelet2.run_pod("nri-events", namespace="e2e")
            container = kubelet2.run_container(sandbox, "app", containerd2.image)
            wait_for(lambda: "post-start handler broke on app" in caplog.text, timeout=10,
                       what="the raising handler's log line")
        assert "SEEN=1" in _env_of(kubelet2, container)
        kubelet2.stop_container(container, grace=1)
        kubelet2.remove_container(container)
        kubelet2.stop_pod(sandbox)
        kubelet2.remove_pod(sandbox)
        expected = [("run_pod_sandbox", "nri-events"), ("start_container", "app"), ("stop_container", "app"),
                    ("remove_container", "app"), ("stop_pod_sandbox", "nri-events"),
                    ("remove_pod_sandbox", "nri-events")]
        wait_for(lambda: all(e in seen for e in expected), timeout=10, what=f"all of {expected} (seen {seen})")
        assert stub.ready.is_set(), "the raising handler ended the session"
    finally:
        stub.stop()


class HostilePeer:
    """A fake NRI socket that answers the stub's connection with ``reply`` bytes, then either
    closes or keeps the connection open."""

    def __init__(self, path: str, reply: bytes, close: bool) -> None:
        self.path, self.reply, self.close = path, reply, close

    async def __aenter__(self) -> HostilePeer:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # Read RegisterPlugin first: closing with unread data would reset the connection
            # and hide the reply behind ECONNRESET.
            await reader.read(65536)
            writer.write(self.reply)
            await writer.drain()
            if self.close:
                writer.close()
            else:
                await reader.read()  # until the stub hangs up

        self.server = await asyncio.start_unix_server(answer, path=self.path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


def _ttrpc_in_frame(conn: int, length: int, stream: int = 1, kind: int = 1) -> bytes:
    return encode_frames(conn, struct.pack(">IIBB", length, stream, kind, 0))


@pytest.mark.parametrize(("reply", "close", "reason"), [
    (b"\0\0\0\1\xff\xff\xff\xff", False, "mux: frame length 4294967295 exceeds the 4194314-byte limit"),
    (_ttrpc_in_frame(1, 0x7FFFFFFF), False, "ttrpc server: message length 2147483647 exceeds"),
    (_ttrpc_in_frame(2, 16, stream=1, kind=2) + b"\0\0\0\2\0\0\0\x10" + b"short", True,
     "mux: truncated frame: stream ended after 5 of 16 payload bytes for connection 2"),
    (_ttrpc_in_frame(2, 1 << 20, stream=1, kind=2), True,
     "ttrpc client: truncated message: stream ended after 0 of 1048576 payload bytes"),
    (bytes(random.Random(7).randrange(256) for _ in range(4096)), False, "ProtocolError: mux: "),
    (_ttrpc_in_frame(1, 0, stream=1, kind=9), False, "ttrpc server: unknown message type 9 on stream 1"),
], ids=["huge-mux-frame", "huge-ttrpc-message", "truncated-frame", "truncated-message", "garbage", "unknown-type"])
def test_hostile_peer_gets_a_clear_reason_and_bounded_memory(
        short_socket_dir: Path, caplog: pytest.LogCaptureFixture, reply: bytes, close: bool, reason: str) -> None:
    async def main() -> str:
        path = str(short_socket_dir / "hostile.sock")
        async with HostilePeer(path, reply, close):
            stub = NriStub("victim", "10", Handlers(start_container=lambda p, c: None), socket_path=path,
                           registration_timeout=2.0)
            try:
                return await asyncio.wait_for(stub.run_once(), 10)
            finally:
                stub.stop(timeout=0)

    tracemalloc.start()
    try:
        with caplog.at_level(logging.ERROR, logger="koord.nri"):
            got = asyncio.run(main())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reason in got
    assert reason in caplog.text
    assert peak < 4 << 20, f"{peak} bytes allocated for a {len(reply)}-byte hostile reply"
