"""koordlet as a subprocess for end-to-end tests: started, stopped, killed and restarted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from koord_testing.processes import stop_process
from koord_testing.sockets import make_short_socket_dir
from koord_testing.wait import scaled


class KoordletProcess:
    """``python -m koord.koordlet`` registered in ``workdir/hookserver.d``, with its own
    metric cache dir and no Prometheus port unless ``args`` name one."""

    def __init__(self, workdir: Path, args: Sequence[str], *, own_flags: bool = True,
                 env: dict[str, str] | None = None) -> None:
        """``own_flags=False``: ``args`` are the whole command line (upstream's manifest); they
        must then name ``workdir/hookserver.d`` as ``-runtime-hooks-config-path``. ``env`` is
        added to this process's environment."""
        self.workdir = workdir
        self.sockdir = make_short_socket_dir("kl-e2e-")
        self.socket = self.sockdir / "koordlet.sock"
        self.config_dir = workdir / "hookserver.d"
        self.log_path = workdir / "koordlet.log"
        own = ["--log-level", "DEBUG", "--runtime-hooks-addr", str(self.socket),
               "--runtime-hooks-config-path", str(self.config_dir), "--tsdb-path", str(workdir / "tsdb"),
               "--prediction-checkpoint-filepath", str(workdir / "prediction"), "--addr", ""] if own_flags else []
        self.command = [sys.executable, "-m", "koord.koordlet", *own, *args]
        self.env = {**os.environ, **(env or {})}
        self._log: BinaryIO | None = None
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> KoordletProcess:
        """Starts and waits for the registration file (written once the modules started)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        registration = self.config_dir / "koordlet.json"
        registration.unlink(missing_ok=True)  # left behind by a kill -9
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=self._log, start_new_session=True, env=self.env)
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while not registration.exists() and self._proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"koordlet did not register within {timeout}s:\n{self.logs()}")
            time.sleep(0.05)
        assert self._proc.poll() is None, f"koordlet exited:\n{self.logs()}"
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None, "koordlet was not started"
        return self._proc.pid

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill: nothing is cleaned up."""
        assert self._proc is not None
        stop_process(self._proc, sig=signal.SIGKILL)
        self._close_log()

    def stop(self) -> int | None:
        if self._proc is None:
            return None
        rc = stop_process(self._proc)
        self._close_log()
        shutil.rmtree(self.sockdir, ignore_errors=True)
        return rc

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def logs(self, tail: int = 120) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])
        except OSError:
            return ""
