"""Short private directories for unix sockets.

A unix socket path must fit in 107 bytes, and pytest's ``tmp_path`` is often longer, so
tests put their sockets in a fresh directory directly under /tmp instead (never a fixed
path: other test runs use the same machine at the same time).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def make_short_socket_dir(prefix: str = "ks-") -> Path:
    """A new private directory under /tmp; the caller removes it (``shutil.rmtree``)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@contextmanager
def short_socket_dir(prefix: str = "ks-") -> Iterator[Path]:
    """A new private directory under /tmp, removed with everything in it on exit."""
    path = make_short_socket_dir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
