"""The NRI wire layer against real containerd 2.x: registration, a container adjusted by the
example plugin, lifecycle events, a handler that raises, and a containerd restart.

containerd 1.6 has no NRI, so this module does not follow ``$KOORD_TEST_CONTAINERD``: its
own fixture always starts the private 2.x build and fails (never skips) when it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from koord.nri import api_pb2 as api
from koord.nri import events
from koord.nri.stub import Handlers, NriStub
from koord.testing.containerd import Containerd
from koord.testing.kubelet import KubeletClient
from koord.testing.runtimes import resolve
from koord.testing.wait import wait_for

pytestmark = pytest.mark.e2e

CHECKOUT = Path(__file__).resolve().parents[2]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nri_env_plugin", CHECKOUT / "examples" / "nri_env_plugin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def containerd2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    try:
        runtime = resolve("2", CHECKOUT)
    except RuntimeError as err:
        pytest.fail(f"the NRI tests need containerd 2.x: {err}", pytrace=False)
    assert runtime.has_nri, f"{runtime.id} has no NRI"
    instance = Containerd(tmp_path_factory.mktemp("containerd-nri"), runtime=runtime)
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def kubelet2(containerd2: Containerd) -> Iterator[KubeletClient]:
    client = containerd2.client()
    yield client
    containerd2.remove_pods_of(client)


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

    def record(event: str):  # type: ignore[no-untyped-def]
        def handler(pod: api.PodSandbox, container: api.Container | None = None) -> None:
            with lock:
                seen.append((event, container.name if container is not None else pod.name))
        return handler

    def broken(pod: api.PodSandbox, container: api.Container) -> None:
        raise RuntimeError(f"post-start handler broke on {container.name}")

    synced: list[int] = []
    handlers = Handlers(
        synchronize=lambda pods, containers: synced.append(len(containers)),  # type: ignore[func-returns-value]
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
