"""NriStub against a scripted runtime: registration, subscriptions per runtime version,
event delivery (per-event methods and StateChange), error answers, loss and reconnection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from koord.nri import api_pb2 as api
from koord.nri import events
from koord.nri.rpc import Code, RpcError
from koord.nri.stub import API_VERSION, Handlers, NriStub
from koord_testing.nri import FakeRuntime

POD = api.PodSandbox(id="p1", name="pod-a", namespace="ns")
CTR = api.Container(id="c1", pod_sandbox_id="p1", name="app")


def session(tmp: Path, handlers: Handlers, body: Callable[[FakeRuntime, NriStub], Awaitable[None]],
            **runtime: Any) -> None:
    """Runs ``body`` with a stub connected to a fake runtime (handshake left to ``body``)."""
    async def main() -> None:
        fake = await FakeRuntime(str(tmp / "nri.sock"), **runtime).start()
        stub = NriStub("test", "10", handlers, socket_path=fake.socket_path, handler_timeout=0.5)
        serving = asyncio.ensure_future(stub.run_once())
        try:
            await body(fake, stub)
        finally:
            stub.stop(timeout=0)
            await asyncio.wait_for(serving, 5)
            await fake.close()
    asyncio.run(main())


def test_registration_configure_and_split_synchronize(short_socket_dir: Path) -> None:
    seen: list[tuple[list[str], list[str]]] = []

    def sync(pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        seen.append(([p.id for p in pods], [c.id for c in containers]))
        return [api.ContainerUpdate(container_id="c1")]

    async def body(fake: FakeRuntime, stub: NriStub) -> None:
        registration = await fake.wait_registered()
        assert (registration.plugin_name, registration.plugin_idx, registration.NRI_version) == \
            ("test", "10", API_VERSION)
        configured = await fake.call("Configure", fake.configure_request, api.ConfigureResponse)
        assert configured.events == events.mask(api.CREATE_CONTAINER, api.STOP_CONTAINER)
        first = await fake.call("Synchronize", api.SynchronizeRequest(pods=[POD], more=True), api.SynchronizeResponse)
        assert first.more and not first.update and not stub.ready.is_set()
        last = await fake.call("Synchronize", api.SynchronizeRequest(containers=[CTR]), api.SynchronizeResponse)
        assert [u.container_id for u in last.update] == ["c1"]
        assert seen == [(["p1"], ["c1"])]
        await asyncio.sleep(0.05)
        assert stub.ready.is_set()

    handlers = Handlers(synchronize=sync, create_container=lambda pod, ctr: None,
                        stop_container=lambda pod, ctr: None)
    session(short_socket_dir, handlers, body)


@pytest.mark.parametrize(("runtime", "pod_update"), [
    ({"runtime_version": "2.1.9"}, False),
    ({"runtime_version": "v2.2.1"}, True),
    ({"runtime_name": "cri-o", "runtime_version": "1.34.0"}, False),
    ({"runtime_version": "2.1.9", "nri_version": "v0.12.2"}, True),
])
def test_subscription_is_cut_to_the_runtimes_events(short_socket_dir: Path, runtime: dict[str, str],
                                                    pod_update: bool) -> None:
    async def body(fake: FakeRuntime, stub: NriStub) -> None:
        subscribed, _ = await fake.handshake()
        assert subscribed == events.mask(api.CREATE_CONTAINER) | (
            events.mask(api.UPDATE_POD_SANDBOX) if pod_update else 0)

    handlers = Handlers(create_container=lambda pod, ctr: None, update_pod_sandbox=lambda pod, o, r: None)
    session(short_socket_dir, handlers, body, **runtime)


def test_configure_chooses_and_an_empty_choice_is_refused(short_socket_dir: Path) -> None:
    choice = [events.mask(api.START_CONTAINER)]

    async def body(fake: FakeRuntime, stub: NriStub) -> None:
        subscribed, _ = await fake.handshake()
        assert subscribed == events.mask(api.START_CONTAINER)
        choice[0] = events.mask(api.VALIDATE_CONTAINER_ADJUSTMENT)  # unknown to containerd 2.1
        with pytest.raises(RpcError) as caught:
            await fake.call("Configure", fake.configure_request, api.ConfigureResponse)
        assert caught.value.code == Code.INVALID_ARGUMENT
        assert "subscribes to no event the runtime knows" in caught.value.message

    session(short_socket_dir, Handlers(configure=lambda request: choice[0], start_container=lambda p, c: None), body)


def test_events_reach_their_handlers_by_either_method(short_socket_dir: Path) -> None:
    calls: list[tuple[str, str]] = []

    def note(name: str) -> Callable[..., None]:
        return lambda pod, *rest: calls.append((name, rest[0].name if rest else pod.name))

    def create(pod: api.PodSandbox, ctr: api.Container) -> api.ContainerAdjustment:
        adjust = api.ContainerAdjustment()
        adjust.env.add(key="POD", value=pod.name)
        adjust.annotations["seen"] = ctr.name
        return adjust

    def update(pod: api.PodSandbox, ctr: api.Container, res: api.LinuxResources) -> list[api.ContainerUpdate]:
        change = api.ContainerUpdate(container_id=ctr.id)
        change.linux.resources.cpu.shares.value = res.cpu.shares.value * 2
        return [change]

    handlers = Handlers(create_container=create, update_container=update, run_pod_sandbox=note("run"),
                        start_container=note("start"), remove_pod_sandbox=note("remove-pod"))

    async def body(fake: FakeRuntime, stub: NriStub) -> None:
        await fake.handshake()
        created = await fake.call("CreateContainer", api.CreateContainerRequest(pod=POD, container=CTR),
                                  api.CreateContainerResponse)
        assert [(kv.key, kv.value) for kv in created.adjust.env] == [("POD", "pod-a")]
        assert dict(created.adjust.annotations) == {"seen": "app"}
        resources = api.LinuxResources()
        resources.cpu.shares.value = 100
        updated = await fake.call("UpdateContainer", api.UpdateContainerRequest(
            pod=POD, container=CTR, linux_resources=resources), api.UpdateContainerResponse)
        assert updated.update[0].linux.resources.cpu.shares.value == 200
        await fake.call("RunPodSandbox", api.RunPodSandboxRequest(pod=POD), api.RunPodSandboxResponse)
        await fake.call("StateChange", api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=POD), api.Empty)
        await fake.call("StartContainer", api.StartContainerRequest(pod=POD, container=CTR),
                        api.StartContainerResponse)
        await fake.call("StateChange", api.StateChangeEvent(event=api.START_CONTAINER, pod=POD, container=CTR),
                        api.Empty)
        await fake.call("StateChange", api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=POD), api.Empty)
        # Not handled: answered empty, no call.
        await fake.call("StateChange", api.StateChangeEvent(event=api.REMOVE_CONTAINER, pod=POD, container=CTR),
                        api.Empty)
        assert calls == [("run", "pod-a"), ("run", "pod-a"), ("start", "app"), ("start", "app"),
                         ("remove-pod", "pod-a")]

    session(short_socket_dir, handlers, body)


def test_raising_and_slow_handlers_get_error_answers_and_the_stub_serves_on(
        short_socket_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    def raising(pod: api.PodSandbox, ctr: api.Container) -> None:
        raise KeyError("no cpuset for app")

    def slow(pod: api.PodSandbox) -> None:
        time.sleep(1.0)

    async def body(fake: FakeRuntime, stub: NriStub) -> None:
        await fake.handshake()
        with pytest.raises(RpcError) as caught:
            await fake.call("CreateContainer", api.CreateContainerRequest(pod=POD, container=CTR),
                            api.CreateContainerResponse)
        assert caught.value.code == Code.UNKNOWN
        assert "KeyError: 'no cpuset for app'" in caught.value.message
        assert "CreateContainer: handler raised KeyError" in caplog.text
        started = time.monotonic()
        with pytest.raises(RpcError) as caught:
            await fake.call("RunPodSandbox", api.RunPodSandboxRequest(pod=POD), api.RunPodSandboxResponse)
        assert caught.value.code == Code.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 0.5  # 0.75 of the runtime's 400 ms, under its deadline
        with pytest.raises(RpcError) as caught:
            await fake.call("ValidateContainerAdjustment", api.ValidateContainerAdjustmentRequest(),
                            api.ValidateContainerAdjustmentResponse)
        assert caught.value.code == Code.UNIMPLEMENTED
        assert stub.ready.is_set()

    session(short_socket_dir, Handlers(create_container=raising, run_pod_sandbox=slow), body,
            request_timeout_ms=400)


def test_unsolicited_updates(short_socket_dir: Path) -> None:
    async def body(fake: FakeRuntime, stub: NriStub) -> None:
        with pytest.raises(ConnectionError, match="not connected"):
            await stub.aupdate_containers([api.ContainerUpdate(container_id="c1")])
        await fake.handshake()
        await asyncio.sleep(0.05)
        fake.failed_updates = [api.ContainerUpdate(container_id="c2")]
        failed = await stub.aupdate_containers([api.ContainerUpdate(container_id="c1"),
                                                api.ContainerUpdate(container_id="c2")],
                                               [api.ContainerEviction(container_id="c3", reason="test")])
        assert [u.container_id for u in failed] == ["c2"]
        assert [e.container_id for e in fake.updates[0].evict] == ["c3"]

    session(short_socket_dir, Handlers(start_container=lambda p, c: None), body)


def test_loss_is_reported_and_the_stub_reconnects(short_socket_dir: Path) -> None:
    async def main() -> None:
        fake = await FakeRuntime(str(short_socket_dir / "nri.sock")).start()
        losses: list[str] = []
        stub = NriStub("test", "10", Handlers(start_container=lambda p, c: None), socket_path=fake.socket_path,
                       on_disconnect=losses.append)
        serving = asyncio.ensure_future(stub.serve_forever(backoff=0.05))
        await fake.handshake()
        await asyncio.sleep(0.05)
        assert stub.ready.is_set()
        fake.registrations.clear()
        fake.drop()
        await fake.handshake()
        assert losses == ["the runtime closed the connection"]
        assert [r.plugin_name for r in fake.registrations] == ["test"]
        await fake.close()
        await asyncio.sleep(0.3)
        assert any("cannot connect" in reason for reason in losses[1:]), losses
        stub.stop(timeout=0)
        await asyncio.wait_for(serving, 5)

    asyncio.run(main())


def test_registration_fails_without_configure(short_socket_dir: Path) -> None:
    async def main() -> None:
        fake = await FakeRuntime(str(short_socket_dir / "nri.sock")).start()
        stub = NriStub("test", "10", Handlers(start_container=lambda p, c: None), socket_path=fake.socket_path,
                       registration_timeout=0.2)
        reason = await stub.run_once()
        assert reason == "registration failed: DEADLINE_EXCEEDED: no Configure and Synchronize within 0.2s " \
                         "of registering"
        await fake.close()

    asyncio.run(main())


def test_identity_is_checked() -> None:
    with pytest.raises(ValueError, match="two digits"):
        NriStub("x", "5", Handlers())
    with pytest.raises(ValueError, match="no '/'"):
        NriStub("a/b", "05", Handlers())
