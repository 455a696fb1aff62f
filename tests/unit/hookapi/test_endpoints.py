"""Unix socket paths, bind addresses and socket preparation, as every flag and registration takes them."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import UNIX_PATH_MAX, parse_bind_address, prepare_socket, unix_socket_path


@pytest.mark.parametrize("value, path", [
    ("/run/a.sock", "/run/a.sock"), ("unix:///run/a.sock", "/run/a.sock"), ("unix:/run/a.sock", "/run/a.sock"),
    ("/" + "s" * (UNIX_PATH_MAX - 1), "/" + "s" * (UNIX_PATH_MAX - 1)),
])
def test_socket_paths(value: str, path: str) -> None:
    assert unix_socket_path(value) == path


@pytest.mark.parametrize("value, problem", [
    ("", "is empty"), ("unix://", "is empty"), ("run/a.sock", "is not an absolute unix socket path"),
    ("unix://run/a.sock", "is not an absolute"), ("tcp://1.2.3.4:5", "uses scheme 'tcp'"),
    ("/a\0b", "NUL character"), ("/" + "s" * UNIX_PATH_MAX, "108 bytes, longer than the 107-byte limit"),
    ("/" + "é" * 60, "121 bytes"),
])
def test_bad_socket_paths(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        unix_socket_path(value)


@given(st.text(max_size=150))
def test_any_text_is_an_absolute_bounded_path_or_a_value_error(value: str) -> None:
    try:
        path = unix_socket_path(value)
    except ValueError:
        return
    assert path.startswith("/") and "\0" not in path
    assert len(path.encode("utf-8", "surrogateescape")) <= UNIX_PATH_MAX


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:9319", (socket.AF_INET, "127.0.0.1", 9319)),
    ("localhost:0", (socket.AF_INET, "127.0.0.1", 0)),
    ("[::1]:80", (socket.AF_INET6, "::1", 80)),
    (":9319", (socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET, "", 9319)),
])
def test_bind_addresses(address: str, expected: tuple) -> None:
    assert parse_bind_address(address) == expected


@pytest.mark.parametrize("address, problem", [
    ("nope", "expected host:port"), ("127.0.0.1:99999", "port in 0-65535"), ("example.com:80", "IP address"),
    ("::1:80", "brackets"), ("1.2.3.4:\u0661", "expected host:port"), ("1.2.3.4:", "expected host:port"),
])
def test_bad_bind_addresses(address: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_bind_address(address)


def test_prepare_socket_creates_the_dir_and_removes_a_stale_socket(short_socket_dir: Path) -> None:
    path = short_socket_dir / "sub" / "a.sock"
    prepare_socket(path)
    assert path.parent.is_dir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    prepare_socket(path)
    assert not os.path.lexists(path)


def test_prepare_socket_refuses_to_delete_a_file(short_socket_dir: Path) -> None:
    path = short_socket_dir / "a.sock"
    path.write_text("precious")
    with pytest.raises(OSError, match="exists and is not a socket"):
        prepare_socket(path)
    assert path.read_text() == "precious"
