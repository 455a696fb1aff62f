"""The HTTP endpoint both daemons serve: their Prometheus pages, ``/healthz`` and ``/readyz``.

koord-runtime-proxy serves it on ``--metrics-bind-address``, koordlet on ``--addr``; each
passes its own metrics pages (path → WSGI app) and readiness check.
"""

from __future__ import annotations

import errno
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client.exposition import ThreadingWSGIServer

from koord.hookapi import parse_bind_address

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

log = logging.getLogger(__name__)


class _QuietHandler(WSGIRequestHandler):
    """wsgiref writes every request to stderr; scrapes every few seconds would drown the proxy's log."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health server: " + format, *args)


class _Server(ThreadingWSGIServer):
    allow_reuse_address = True

    def server_bind(self) -> None:
        """HTTPServer.server_bind resolves the host name (DNS, can hang); we never need it."""
        if self.address_family == socket.AF_INET6 and self.server_address[0] in ("", "::"):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "all interfaces" = v4 too
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()


class HasPages(Protocol):
    def pages(self) -> Mapping[str, WSGIApp]:
        """The metrics paths served and the app answering each."""


class HealthServer:
    """Serves the metrics pages, /healthz (the process answers) and /readyz (``ready()`` says why not)."""

    def __init__(self, bind_address: str, metrics: HasPages,
                 ready: Callable[[], tuple[bool, str]]) -> None:
        self._family, self._host, self.port = parse_bind_address(bind_address)
        self._address = bind_address
        self._ready = ready
        self._pages = metrics.pages()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            self._server = self._bind(self._family)
        except OSError as e:
            if not (self._host == "" and self._family == socket.AF_INET6 and e.errno == errno.EAFNOSUPPORT):
                raise OSError(e.errno, f"cannot serve metrics on {self._address}: {e.strerror}") from e
            self._server = self._bind(socket.AF_INET)  # IPv6 disabled in the kernel: all IPv4 interfaces
        self._server.set_app(self._app)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-server", daemon=True)
        self._thread.start()
        log.info("serving %s, /healthz and /readyz on %s (port %d)", ", ".join(self._pages), self._address, self.port)

    def _bind(self, family: socket.AddressFamily) -> _Server:
        server_class = type("HealthHTTPServer", (_Server,), {"address_family": family})
        return server_class((self._host, self.port), _QuietHandler)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _text(start_response, "405 Method Not Allowed", "only GET and HEAD are served\n",
                         [("Allow", "GET, HEAD")])
        app = self._pages.get(path)
        if app is not None:
            return app(environ, start_response)
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            try:
                ok, reason = self._ready()
            except Exception as e:
                log.exception("readiness check failed")
                ok, reason = False, f"readiness check failed: {e!r}"
            if ok:
                return _text(start_response, "200 OK", "ok\n")
            return _text(start_response, "503 Service Unavailable", f"{reason}\n")
        paths = ", ".join([*self._pages, "/healthz", "/readyz"])
        return _text(start_response, "404 Not Found", f"not found: try {paths}\n")


def _text(start_response: Callable[..., Any], status: str, body: str,
          extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    data = body.encode("utf-8")
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))] + (extra or []))
    return [data]
