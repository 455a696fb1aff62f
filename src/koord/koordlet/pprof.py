"""``-enable-pprof``: upstream serves Go's pprof on ``-pprof-addr``; here the Python
equivalents, plain text over HTTP under the same paths: ``/debug/pprof/goroutine`` the
stack of every thread, ``/debug/pprof/heap`` a memory snapshot (the process's RSS and the
live objects the garbage collector tracks, counted by type, most numerous first), and
``/debug/pprof/`` an index. Off by default, as upstream.
"""

from __future__ import annotations

import argparse
import collections
import gc
import logging
import re
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TOP_TYPES = 100
INDEX = "/debug/pprof/"


def parse_addr(text: str) -> tuple[str, int]:
    """Go's ``host:port`` (``:9317`` is every address): (host, port)."""
    m = re.fullmatch(r"(\[[0-9a-fA-F:.]*\]|[^:\[\]]*):([0-9]{1,5})", text)
    if m is None or int(m.group(2)) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r:.60}: want host:port (e.g. :9317)")
    return m.group(1).strip("[]"), int(m.group(2))


def thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"thread {names.get(ident, '?')} ({ident}):\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def heap_snapshot() -> str:
    rss = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS:")), "?")
    counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    lines = [f"VmRSS: {rss}", f"gc tracked objects: {sum(counts.values())}", ""]
    lines += [f"{n:10d} {name}" for name, n in counts.most_common(TOP_TYPES)]
    return "\n".join(lines) + "\n"


PAGES = {INDEX: lambda: "goroutine: every thread's stack\nheap: RSS and live objects by type\n",
         INDEX + "goroutine": thread_stacks, INDEX + "heap": heap_snapshot}


class PprofServer:
    """``PprofServer(host, port).start()`` serves on a daemon thread; ``stop()`` closes it.
    Host "" is every address, as Go's ``:port``."""

    def __init__(self, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                page = PAGES.get(self.path.split("?", 1)[0])
                body = (page() if page else "404 page not found\n").encode()
                self.send_response(200 if page else 404)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="pprof", daemon=True)

    def start(self) -> PprofServer:
        self._thread.start()
        log.info("pprof: serving thread stacks and heap snapshots on port %d under %s", self.port, INDEX)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
