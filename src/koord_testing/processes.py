"""Stopping the daemons tests start, the same way everywhere."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 15.0, sig: int = signal.SIGTERM) -> int:
    """Sends ``sig`` (a clean shutdown), waits ``timeout`` seconds, then SIGKILLs; returns the exit code.

    A process that already exited is only reaped.
    """
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
