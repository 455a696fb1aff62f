"""Flag parsing: defaults are upstream's, and every bad value names its flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from koord.runtimeproxy import cli
from koord.runtimeproxy.config import BackendMode, OptionError, parse_options


def test_defaults_are_upstreams() -> None:
    o = parse_options([])
    assert o.proxy_endpoint == "/var/run/koord-runtimeproxy/runtimeproxy.sock"
    assert o.runtime_endpoint == o.image_endpoint == "/var/run/containerd/containerd.sock"
    assert o.backend_mode is BackendMode.CONTAINERD
    assert (o.skip_key, o.skip_val) == ("runtimeproxy.koordinator.sh/skip-hookserver", "true")
    assert o.hook_config_dir == Path("/etc/runtime/hookserver.d")
    assert o.metrics_address == "127.0.0.1:9319"
    assert o.hook_timeout == 5.0


def test_unix_prefix_and_separate_image_endpoint() -> None:
    o = parse_options(["--remote-runtime-service-endpoint=unix:///run/c.sock",
                       "--remote-image-service-endpoint", "/run/i.sock",
                       "--koord-runtimeproxy-endpoint", "unix:///tmp/p.sock"])
    assert (o.runtime_endpoint, o.image_endpoint, o.proxy_endpoint) == ("/run/c.sock", "/run/i.sock", "/tmp/p.sock")


@pytest.mark.parametrize("value,seconds", [("5", 5.0), ("2.5", 2.5), ("500ms", 0.5), ("3s", 3.0), ("1m", 60.0)])
def test_hook_timeout_durations(value: str, seconds: float) -> None:
    assert parse_options(["--hook-timeout", value]).hook_timeout == seconds


def test_data_plane_start_timeout() -> None:
    assert parse_options([]).data_plane_start_timeout == 30.0
    assert parse_options(["--data-plane-start-timeout", "2m"]).data_plane_start_timeout == 120.0


BAD = [
    (["--remote-runtime-service-endpoint", "tcp://1.2.3.4:5"], "--remote-runtime-service-endpoint"),
    (["--remote-image-service-endpoint", "relative.sock"], "--remote-image-service-endpoint"),
    (["--koord-runtimeproxy-endpoint", "x"], "--koord-runtimeproxy-endpoint"),
    (["--backend-runtime-mode", "cri-o"], "--backend-runtime-mode"),
    (["--metrics-bind-address", "nope"], "--metrics-bind-address"),
    (["--metrics-bind-address", "example.com:80"], "--metrics-bind-address"),
    (["--metrics-bind-address", "127.0.0.1:99999"], "--metrics-bind-address"),
    (["--hook-timeout", "0"], "--hook-timeout"),
    (["--hook-timeout", "soon"], "--hook-timeout"),
    (["--data-plane-start-timeout=-1s"], "--data-plane-start-timeout"),
    (["--data-plane-start-timeout", "later"], "--data-plane-start-timeout"),
    (["--runtime-hook-server-key", ""], "--runtime-hook-server-key"),
]


@pytest.mark.parametrize("argv,flag", BAD, ids=[a[0] for a, _ in BAD])
def test_bad_values_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(OptionError, match=flag):
        parse_options(argv)


@pytest.mark.parametrize("argv,flag", BAD, ids=[a[0] for a, _ in BAD])
def test_main_exits_2_naming_the_flag(argv, flag, capsys) -> None:
    assert cli.main(argv) == 2
    assert flag in capsys.readouterr().err


def test_docker_mode_defaults_to_dockerds_socket() -> None:
    o = parse_options(["--backend-runtime-mode=Docker"])
    assert o.backend_mode is BackendMode.DOCKER
    assert o.runtime_endpoint == "/var/run/docker.sock"
    assert parse_options(["--backend-runtime-mode=Docker", "--remote-runtime-service-endpoint",
                          "unix:///run/d.sock"]).runtime_endpoint == "/run/d.sock"


def test_docker_mode_refuses_an_image_endpoint(capsys) -> None:
    argv = ["--backend-runtime-mode=Docker", "--remote-image-service-endpoint", "/run/i.sock"]
    with pytest.raises(OptionError, match="--remote-image-service-endpoint: has no meaning"):
        parse_options(argv)
    assert cli.main(argv) == 2
    assert "--remote-image-service-endpoint" in capsys.readouterr().err


def test_docker_mode_refuses_the_haproxy_data_plane(capsys) -> None:
    argv = ["--backend-runtime-mode=Docker", "--data-plane=haproxy"]
    with pytest.raises(OptionError, match="--data-plane=haproxy: Docker mode"):
        parse_options(argv)
    assert cli.main(argv) == 2
    assert "--data-plane" in capsys.readouterr().err
    assert parse_options(["--backend-runtime-mode=Docker", "--data-plane=auto"]).backend_mode is BackendMode.DOCKER


def test_metrics_address_accepts_all_interfaces_and_ipv6() -> None:
    assert parse_options(["--metrics-bind-address", ":9319"]).metrics_address == ":9319"
    assert parse_options(["--metrics-bind-address", "[::1]:0"]).metrics_address == "[::1]:0"
    assert parse_options(["--metrics-bind-address", ""]).metrics_address == ""
