"""The Docker server in process against a scripted fake dockerd: streaming, framing, and backend data
the proxy must survive (the real dockerd is in tests/e2e/test_docker.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry

from koord.runtimeproxy.dispatcher import RuntimeDispatcher
from koord.runtimeproxy.dockerserver.backend import DockerBackend
from koord.runtimeproxy.dockerserver.dockerjson import ContainerView
from koord.runtimeproxy.dockerserver.intercept import Interceptor
from koord.runtimeproxy.dockerserver.server import DockerServer
from koord.runtimeproxy.metrics import ProxyMetrics
from koord.runtimeproxy.pluginsmanager import PluginsManager
from koord.runtimeproxy.store import Store

Script = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""Answers one request (its head already read) on the fake dockerd's connection."""

SKIP = ("runtimeproxy.koordinator.sh/skip-hookserver", "true")


@asynccontextmanager
async def fake_dockerd(path: Path, script: Script) -> AsyncIterator[None]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                await script(head, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, str(path))
    try:
        yield
    finally:
        server.close()


@asynccontextmanager
async def docker_proxy(root: Path) -> AsyncIterator[tuple[str, Interceptor]]:
    (root / "hooks").mkdir()
    manager = PluginsManager(root / "hooks", default_timeout=5.0)
    metrics = ProxyMetrics(CollectorRegistry())
    dispatcher = RuntimeDispatcher(manager, metrics)
    backend = DockerBackend(str(root / "docker.sock"))
    interceptor = Interceptor(backend, Store(), dispatcher, SKIP)
    server = DockerServer(backend.endpoint, interceptor, metrics, lambda: None)
    await server.start(str(root / "proxy.sock"))
    try:
        yield str(root / "proxy.sock"), interceptor
    finally:
        await server.stop(1.0)
        await dispatcher.close()


def answer(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def test_rebuild_survives_garbage_from_dockerd(short_socket_dir: Path) -> None:
    async def script(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if b"/containers/json" in head.split(b"\r\n")[0] and b"/containers/json?" in head:
            writer.write(answer("200 OK", b'[7, "x", {"Id": "c1"}, {"Id": "c2"}, {"Id": 3}]'))
        elif b"/containers/c1/json" in head:
            writer.write(answer("200 OK", b"not json"))
        else:
            writer.write(answer("200 OK", json.dumps({"Id": "c2", "Name": "/k8s_POD_p_n_u_0", "Config": {
                "Labels": {"io.kubernetes.docker.type": "podsandbox"}}}).encode()))
        await writer.drain()

    async def main() -> None:
        async with fake_dockerd(short_socket_dir / "docker.sock", script), docker_proxy(short_socket_dir) as (_, icp):
            assert await icp.rebuild() == 1  # c1's inspect is unreadable: skipped; c2 kept
            pod = icp.store.get_pod("c2")
            assert pod is not None and (pod.pod_meta.name, pod.pod_meta.uid) == ("p", "u")

    asyncio.run(main())


def test_rebuild_of_a_list_that_is_not_json_starts_empty(short_socket_dir: Path) -> None:
    async def script(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer("200 OK", b"\xff\xfe garbage"))
        await writer.drain()

    async def main() -> None:
        async with fake_dockerd(short_socket_dir / "docker.sock", script), docker_proxy(short_socket_dir) as (_, icp):
            assert await icp.rebuild() == 0

    asyncio.run(main())


def test_chunked_answers_are_relayed_as_they_arrive(short_socket_dir: Path) -> None:
    first_seen = asyncio.Event()

    async def script(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
        await writer.drain()
        await first_seen.wait()  # the second chunk exists only once the client saw the first
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        async with fake_dockerd(short_socket_dir / "docker.sock", script), docker_proxy(short_socket_dir) as (sock, _):
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(b"GET /v1.41/events HTTP/1.1\r\nHost: d\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
            assert await asyncio.wait_for(reader.readuntil(b"first\n"), 10)
            first_seen.set()
            assert await asyncio.wait_for(reader.readuntil(b"second\n"), 10)
            writer.close()

    asyncio.run(main())


def test_request_body_streams_before_it_ends(short_socket_dir: Path) -> None:
    got_first = asyncio.Event()

    async def script(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"part-one")
        got_first.set()
        await reader.readuntil(b"0\r\n\r\n")
        writer.write(answer("200 OK", b'{"stream":"loaded"}'))
        await writer.drain()

    async def main() -> None:
        async with fake_dockerd(short_socket_dir / "docker.sock", script), docker_proxy(short_socket_dir) as (sock, _):
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(b"POST /v1.41/images/load HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"8\r\npart-one\r\n")
            await asyncio.wait_for(got_first.wait(), 10)  # dockerd has it while the client still sends
            writer.write(b"8\r\npart-two\r\n0\r\n\r\n")
            assert (await asyncio.wait_for(reader.readuntil(b"loaded\"}"), 10)).startswith(b"HTTP/1.1 200")
            writer.close()

    asyncio.run(main())


def test_a_dead_backend_is_a_502_in_dockers_shape(short_socket_dir: Path) -> None:
    async def main() -> None:
        async with docker_proxy(short_socket_dir) as (sock, _):
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(b"GET /v1.41/containers/json HTTP/1.1\r\nHost: d\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 10)
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 502")
            assert "cannot connect to dockerd" in json.loads(body)["message"]

    asyncio.run(main())


def test_store_records_are_found_by_id_name_or_unique_prefix(tmp_path: Path) -> None:
    manager = PluginsManager(tmp_path, default_timeout=5.0)
    icp = Interceptor(DockerBackend(str(tmp_path / "none.sock")), Store(),
                      RuntimeDispatcher(manager, ProxyMetrics(CollectorRegistry())), SKIP)
    sandbox = {"Labels": {"io.kubernetes.docker.type": "podsandbox"}}
    container = {"Labels": {"io.kubernetes.docker.type": "container", "io.kubernetes.sandbox.id": "abc111"}}
    icp._keep("abc111", ContainerView.of_create(sandbox, "k8s_POD_web_ns_uid1_0"))
    icp._keep("abc222", ContainerView.of_create(container, "k8s_app_web_ns_uid1_0"))
    by_id, by_name, by_slash, by_prefix = (icp._cached(r) for r in ("abc222", "k8s_app_web_ns_uid1_0",
                                                                      "/k8s_app_web_ns_uid1_0", "abc2"))
    assert by_id is not None and by_id.record is not None and by_id.pod is not None
    assert by_id.pod.pod_meta.uid == "uid1" and by_id.record.info.container_meta.name == "app"
    assert [f.id for f in (by_name, by_slash, by_prefix) if f is not None] == ["abc222"] * 3
    sandbox_found = icp._cached("k8s_POD_web_ns_uid1_0")
    assert sandbox_found is not None and sandbox_found.record is None and sandbox_found.id == "abc111"
    assert icp._cached("abc") is None  # ambiguous prefix: dockerd decides
    assert icp._cached("nope") is None


def test_a_kept_alive_connection_dockerd_closed_is_replaced(short_socket_dir: Path) -> None:
    async def script(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer("200 OK", b'{"ok":true}'))
        await writer.drain()
        writer.close()  # like a dockerd restart between two calls of a kept-alive client

    async def main() -> None:
        async with fake_dockerd(short_socket_dir / "docker.sock", script), docker_proxy(short_socket_dir) as (sock, _):
            reader, writer = await asyncio.open_unix_connection(sock)
            for _ in range(3):
                writer.write(b"GET /v1.41/version HTTP/1.1\r\nHost: d\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200"), head
                assert await asyncio.wait_for(reader.readexactly(11), 10) == b'{"ok":true}'
                await asyncio.sleep(0.05)  # the close reaches the proxy before the next call
            writer.close()

    asyncio.run(main())
