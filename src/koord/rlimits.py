"""Process limits a busy node needs, raised at start whoever started the process.

Every kubelet connection, plugin channel and backend channel is one open file; the default
soft limit of 1024 was reached with ~1000 open kubelet connections.  The systemd units set
``LimitNOFILE``; this covers a proxy or koordlet started any other way (a shell, a
container runtime, a test).
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

WANTED_OPEN_FILES = 1 << 20


def raise_open_file_limit(wanted: int = WANTED_OPEN_FILES) -> int:
    """Raises the soft RLIMIT_NOFILE towards ``wanted`` within the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft
