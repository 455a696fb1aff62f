"""The HAProxy data plane's pure parts: choosing it, its configuration, reading its stats."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from koord.runtimeproxy import dataplane
from koord.runtimeproxy.config import DataPlane, OptionError, parse_options
from koord.runtimeproxy.criserver import cri_paths, hooked_paths, python_paths


def _routes(**overrides: str) -> dataplane.Routes:
    fields = {"public_socket": "/run/p/proxy.sock", "runtime_endpoint": "/run/c/containerd.sock",
              "image_endpoint": "/run/i/images.sock", **overrides}
    return dataplane.Routes(python_paths=python_paths(), known_paths=sorted(cri_paths()), **fields)


def test_hooked_paths_are_the_eight_lifecycle_methods_in_both_versions() -> None:
    paths = hooked_paths()
    assert len(paths) == len(set(paths)) == 16
    assert "/runtime.v1.RuntimeService/RunPodSandbox" in paths
    assert "/runtime.v1alpha2.RuntimeService/UpdateContainerResources" in paths
    assert not any("ListContainers" in p or "Version" in p or "ImageService" in p for p in paths)


def test_flag_and_choice() -> None:
    assert parse_options([]).data_plane is DataPlane.AUTO
    assert parse_options(["--data-plane", "python"]).data_plane is DataPlane.PYTHON
    with pytest.raises(SystemExit):
        parse_options(["--data-plane", "nghttpx"])
    found, missing = (lambda _: "/usr/sbin/haproxy"), (lambda _: None)
    assert dataplane.choose(DataPlane.AUTO, found)[::2] == (DataPlane.HAPROXY, "/usr/sbin/haproxy")
    plane, why, binary = dataplane.choose(DataPlane.AUTO, missing)
    assert (plane, binary) == (DataPlane.PYTHON, None) and "no haproxy binary" in why
    assert dataplane.choose(DataPlane.PYTHON, found)[::2] == (DataPlane.PYTHON, None)
    with pytest.raises(dataplane.DataPlaneError, match="--data-plane=haproxy: no haproxy binary"):
        dataplane.choose(DataPlane.HAPROXY, missing)


def test_python_paths_are_the_hooked_ones_and_every_event_stream() -> None:
    assert set(python_paths()) - set(hooked_paths()) == {"/runtime.v1.RuntimeService/GetContainerEvents"}


def test_map_sends_hooked_paths_to_python_and_every_other_method_to_its_own_backend() -> None:
    routes = _routes()
    entries = dict(line.split(" ") for line in dataplane.render_map(routes).splitlines())
    assert set(entries) == set(cri_paths())
    assert {p for p, backend in entries.items() if backend == "hooks"} == set(python_paths())
    assert entries["/runtime.v1.RuntimeService/ListContainers"] == "runtime.v1.RuntimeService.ListContainers"
    assert entries["/runtime.v1alpha2.ImageService/PullImage"] == "runtime.v1alpha2.ImageService.PullImage"
    labels = dataplane.method_labels(routes)
    assert labels["runtime.v1.RuntimeService.ListContainers"] == "runtime.v1.RuntimeService/ListContainers"


def test_config_routes_by_path_with_the_settings_real_clients_need(tmp_path: Path) -> None:
    layout = dataplane.Layout(tmp_path / "dp")
    text = dataplane.render_config(_routes(), layout)
    lines = [line.strip() for line in text.splitlines()]
    assert "bind unix@/run/p/proxy.sock mode 660 proto h2" in lines
    route = f"path,map_str({layout.routes_map})"
    assert f"use_backend %[{route}] if {{ {route} -m found }}" in lines
    backends = text.split("\nbackend ")[1:]
    servers = {b.splitlines()[0]: b.splitlines()[2].strip() for b in backends}
    assert servers["hooks"] == f"server hooks unix@{layout.hooked_socket} proto h2"
    assert servers["runtime.v1.RuntimeService.Version"] == "server runtime unix@/run/c/containerd.sock proto h2"
    assert servers["runtime.v1.ImageService.ListImages"] == "server image unix@/run/i/images.sock proto h2"
    assert servers["image"] == "server image unix@/run/i/images.sock proto h2"
    assert "hard-stop-after 10s" in lines
    assert "tune.h2.max-concurrent-streams 10000" in lines
    assert "tune.h2.initial-window-size 1048576" in lines
    # A quiet event stream stays open a day by default, at least the hour kubelet needs; HAProxy
    # waits 10 s more, so that the Python side ends it first with a status.
    assert {"timeout client 86410000ms", "timeout server 86410000ms", "timeout tunnel 86410000ms"} <= set(lines)
    assert any(line.startswith("http-request set-uri http://localhost/") and "-m beg /" in line for line in lines)
    assert f"errorfile 503 {layout.errorfile('hooks', 503)}" in lines


@pytest.mark.parametrize(("flag", "seconds"), [([], 86400.0), (["--data-plane-idle-timeout", "90m"], 5400.0),
                                               (["--data-plane-idle-timeout", "1s"], 1.0)])
def test_idle_timeout_flag_sets_every_haproxy_idle_timeout(tmp_path: Path, flag: list[str], seconds: float) -> None:
    options = parse_options(flag)
    assert options.data_plane_idle_timeout == seconds
    lines = [line.strip() for line in dataplane.render_config(
        _routes(), dataplane.Layout(tmp_path / "dp"), options.data_plane_idle_timeout).splitlines()]
    for kind in ("client", "server", "tunnel", "http-keep-alive"):
        assert f"timeout {kind} {round((seconds + 10) * 1000)}ms" in lines


@pytest.mark.parametrize("value", ["0s", "500ms", "597h", "soon"])
def test_idle_timeout_out_of_haproxys_range_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(OptionError, match="--data-plane-idle-timeout"):
        parse_options(["--data-plane-idle-timeout", value])


@pytest.mark.parametrize("field", ["public_socket", "runtime_endpoint", "image_endpoint"])
def test_config_refuses_paths_that_would_inject_settings(tmp_path: Path, field: str) -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        dataplane.render_config(_routes(**{field: "/run/x.sock\n    stats socket /tmp/open"}),
                                dataplane.Layout(tmp_path))


def test_errorfile_is_a_grpc_unavailable() -> None:
    text = dataplane.errorfile_text(503, "koord-runtime-proxy: down\r\nx: y %s")
    head = text.split("\r\n")
    assert head[0] == "HTTP/1.1 200 OK"
    assert "content-type: application/grpc" in head and "grpc-status: 14" in head
    assert "grpc-message: koord-runtime-proxy: down??x: y ?s" in head
    assert "grpc-status: 4" in dataplane.errorfile_text(504, "slow").split("\r\n")


def test_layout_is_private_and_replaces_what_a_killed_run_left(tmp_path: Path) -> None:
    layout = dataplane.Layout.for_public_socket("/run/p/proxy.sock", root=tmp_path)
    assert layout == dataplane.Layout.for_public_socket("/run/p/proxy.sock", root=tmp_path)
    assert layout != dataplane.Layout.for_public_socket("/run/q/proxy.sock", root=tmp_path)
    layout.prepare()
    (layout.directory / "stale").write_text("x")
    layout.prepare()
    assert list(layout.directory.iterdir()) == []
    assert layout.directory.stat().st_mode & 0o777 == 0o700
    layout.remove()
    layout.directory.write_text("not a directory")
    with pytest.raises(dataplane.DataPlaneError, match="not a directory owned by us"):
        layout.prepare()


def test_haproxy_that_never_serves_is_killed_after_the_start_timeout(tmp_path: Path) -> None:
    silent = tmp_path / "haproxy"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    layout = dataplane.Layout.for_public_socket(str(tmp_path / "p.sock"), root=tmp_path)
    layout.prepare()
    supervisor = dataplane.Supervisor(str(silent), layout, str(tmp_path / "p.sock"), ready_timeout=0.3)
    with pytest.raises(dataplane.DataPlaneError, match=r"within 0.3s \(--data-plane-start-timeout\)"):
        asyncio.run(supervisor._spawn())
    assert not supervisor.alive


def test_stats_parser_tolerates_junk() -> None:
    csv = ("# pxname,svname,req_tot,ttime,econ\n"
           "runtime,BACKEND,12,3,0\nruntime,runtime,12,3,0\ncri,FRONTEND,,,\nshort,BACKEND\n")
    rows = list(dataplane.parse_backend_stats(csv))
    assert [(r["pxname"], r.get("req_tot")) for r in rows] == [("runtime", "12"), ("short", None)]
    assert list(dataplane.parse_backend_stats("not csv")) == []
