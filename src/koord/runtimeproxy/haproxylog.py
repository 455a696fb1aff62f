"""HAProxy's own messages (its stdout and stderr, piped) as the proxy's log records, so the
proxy's log stays in one format, klog's, that a log pipeline can read."""

from __future__ import annotations

import asyncio
import logging
import re

log = logging.getLogger(__name__)

HAPROXY_LEVELS = {"EMERG": logging.ERROR, "ALERT": logging.ERROR, "WARNING": logging.WARNING,
                  "NOTICE": logging.INFO, "INFO": logging.INFO, "DEBUG": logging.DEBUG}
"""HAProxy's message tags (``[WARNING]  (pid) : text``) onto this process's levels."""
_HAPROXY_TAG = re.compile(r"\[([A-Z]+)\]")
MAX_HAPROXY_LINE = 1 << 16


def haproxy_level(line: str) -> int:
    match = _HAPROXY_TAG.match(line)
    return HAPROXY_LEVELS.get(match[1], logging.INFO) if match else logging.INFO


async def relay_haproxy_output(stream: asyncio.StreamReader) -> None:
    """HAProxy's messages as this process's log records, so the log stays in one format; a line
    longer than ``MAX_HAPROXY_LINE`` bytes is cut there."""
    pending = b""
    while chunk := await stream.read(MAX_HAPROXY_LINE):
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) >= MAX_HAPROXY_LINE:
            lines.append(pending)
            pending = b""
        for raw in lines:
            _log_haproxy_line(raw)
    if pending:
        _log_haproxy_line(pending)


def _log_haproxy_line(raw: bytes) -> None:
    line = raw.decode(errors="replace").rstrip()
    if line:
        log.log(haproxy_level(line), "haproxy: %s", line)
