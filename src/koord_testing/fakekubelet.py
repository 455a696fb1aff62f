"""A kubelet's HTTPS endpoint for end-to-end tests: ``/pods/`` and ``/configz`` as the
kubelet serves them (self-signed certificate, bearer token recorded), on loopback at a
free port. The Node object points at it through ``status.daemonEndpoints``."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class FakeKubelet:
    def __init__(self, workdir: Path, pods: list[dict], config: dict[str, Any]) -> None:
        self.pods = pods
        self.config = config
        self.tokens: list[str] = []
        self.paths: list[str] = []
        cert, key = workdir / "kubelet.crt", workdir / "kubelet.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                kubelet.paths.append(self.path)
                kubelet.tokens.append(self.headers.get("Authorization", ""))
                if self.path == "/pods/":
                    body: dict[str, Any] = {"kind": "PodList", "apiVersion": "v1", "items": kubelet.pods}
                elif self.path == "/configz":
                    body = {"kubeletconfig": kubelet.config}
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def node_status(self) -> dict:
        """The Node ``status`` fields koordlet reaches the kubelet by."""
        return {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}}}

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
