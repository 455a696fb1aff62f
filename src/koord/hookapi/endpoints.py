"""Endpoints: unix socket paths, ``host:port`` bind addresses, and preparing a socket to listen on.

Every flag and registration field that names an endpoint goes through these functions, so
they all accept the same spellings and fail with the same messages. Errors are ValueError
whose message does not name the field: the caller prefixes its flag or field name.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import stat
from pathlib import Path

log = logging.getLogger(__name__)

UNIX_PATH_MAX = 107
"""sun_path holds 108 bytes including the terminating NUL."""

SOCKET_MODE = 0o660
"""Mode of the sockets the proxy and koordlet serve on (set after listening: grpc creates them
with the umask's mode): root and the socket's group may connect, nobody else."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def _show(value: str, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def unix_socket_path(value: str) -> str:
    """The path of ``/path``, ``unix:///path`` or ``unix:/path``; ValueError saying what is wrong otherwise."""
    if value.startswith("unix://"):
        path = value[len("unix://"):]
    elif value.startswith("unix:"):
        path = value[len("unix:"):]
    elif m := _SCHEME.match(value):
        raise ValueError(f"{_show(value)} uses scheme {m.group(1)!r}; only unix sockets are supported")
    else:
        path = value
    if not path:
        raise ValueError("is empty")
    if "\0" in path:
        raise ValueError("contains a NUL character")
    if not path.startswith("/"):
        raise ValueError(f"{_show(value)} is not an absolute unix socket path")
    size = len(path.encode("utf-8", "surrogateescape"))
    if size > UNIX_PATH_MAX:
        raise ValueError(f"is {size} bytes, longer than the {UNIX_PATH_MAX}-byte limit of unix socket paths")
    return path


def parse_bind_address(address: str) -> tuple[socket.AddressFamily, str, int]:
    """``host:port`` → (family, host, port); an empty host means all interfaces, as in Go.

    Hosts are IP addresses (IPv6 in brackets) or ``localhost``: a name would need a resolver
    at start-up and could bind somewhere unexpected.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isascii() or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"bind address {_show(address)}: expected host:port with a port in 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bind address {_show(address)}: put an IPv6 host in brackets, e.g. [::1]:9319")
    if host == "":
        return (socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET), "", int(port_text)
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"bind address {_show(address)}: host must be an IP address or localhost") from None
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), str(ip), int(port_text)


def prepare_socket(path: Path) -> None:
    """Creates the socket's directory and removes a socket left by a previous (killed) run.

    Anything at ``path`` that is not a socket is refused: a typo in a flag must not delete a file.
    Once listening, the caller sets ``SOCKET_MODE``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket; refusing to replace it")
    log.info("removing stale socket %s", path)
    path.unlink()

