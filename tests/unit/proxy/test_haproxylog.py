"""HAProxy's output relayed as log records: one per line, its tag as the level, however the
pipe cuts the bytes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from koord.runtimeproxy.haproxylog import MAX_HAPROXY_LINE, relay_haproxy_output


def relay(chunks: list[bytes]) -> list[tuple[int, str]]:
    async def run() -> None:
        stream = asyncio.StreamReader()
        for chunk in chunks:
            stream.feed_data(chunk)
        stream.feed_eof()
        await relay_haproxy_output(stream)

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("koord.runtimeproxy.haproxylog")
    logger.addHandler(handler)
    old_level, logger.level = logger.level, logging.DEBUG
    try:
        asyncio.run(run())
    finally:
        logger.removeHandler(handler)
        logger.level = old_level
    return [(r.levelno, r.getMessage()) for r in records]


@pytest.mark.parametrize("chunks, want", [
    ([b"[NOTICE]   (7) : haproxy version is 2.6\n"],
     [(logging.INFO, "haproxy: [NOTICE]   (7) : haproxy version is 2.6")]),
    ([b"[WARNING]  (7) : Proxy GLOBAL stopped\n[ALERT]    (7) : config : parse error\n"],
     [(logging.WARNING, "haproxy: [WARNING]  (7) : Proxy GLOBAL stopped"),
      (logging.ERROR, "haproxy: [ALERT]    (7) : config : parse error")]),
    ([b"[EMERG] x\n[DEBUG] y\n[OTHER] z\nplain\n"],
     [(logging.ERROR, "haproxy: [EMERG] x"), (logging.DEBUG, "haproxy: [DEBUG] y"),
      (logging.INFO, "haproxy: [OTHER] z"), (logging.INFO, "haproxy: plain")]),
    # a line cut by the pipe, blank lines, no final newline, bytes that are not UTF-8
    ([b"[WARN", b"ING] split\n\n\r\n", b"last \xff"],
     [(logging.WARNING, "haproxy: [WARNING] split"), (logging.INFO, "haproxy: last \ufffd")]),
    ([b"x" * (MAX_HAPROXY_LINE + 10) + b"\n"],
     [(logging.INFO, "haproxy: " + "x" * MAX_HAPROXY_LINE), (logging.INFO, "haproxy: " + "x" * 10)]),
    ([], []),
])
def test_relay_haproxy_output(chunks, want):
    assert relay(chunks) == want
