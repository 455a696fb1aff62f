"""Runs ``python -m koord.runtimeproxy`` as a real subprocess for e2e tests.

A subprocess (not an in-process server) so tests see exactly what kubelet sees:
the real flag parsing, the socket file, signal handling and restarts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from koord.runtimeproxy.config import DEFAULT_DATA_PLANE_START_TIMEOUT, DEFAULT_HOOK_TIMEOUT
from koord_testing.containerd import wait_cri_ready
from koord_testing.docker import wait_docker_ready
from koord_testing.processes import stop_process
from koord_testing.wait import scaled, wait_for

START_TIMEOUT = 20.0
SERVING_LINES = ("serving CRI on ", "serving the Docker API on ")
"""What the proxy logs once its start-up is complete (every mode)."""


class RuntimeProxy:
    """One proxy process in front of ``backend_endpoint``, serving on a socket under ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        backend_endpoint: str,
        hook_config_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        metrics_bind_address: str = "",
        docker: bool = False,
        endpoint: str | None = None,
        data_plane: str = "auto",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.backend_endpoint = backend_endpoint
        self.hook_config_dir = Path(hook_config_dir) if hook_config_dir else self.workdir / "hookserver.d"
        self.hook_config_dir.mkdir(parents=True, exist_ok=True)
        self.endpoint = endpoint or str(self.workdir / "runtimeproxy.sock")
        self.extra_args = tuple(extra_args)
        self.metrics_bind_address = metrics_bind_address
        self.docker = docker
        """Docker mode: serves the Docker API in front of dockerd instead of CRI."""
        self.data_plane = data_plane
        self.env = dict(env) if env is not None else None
        self.stderr_path = self.workdir / "runtimeproxy.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: BinaryIO | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "koord.runtimeproxy",
            "--koord-runtimeproxy-endpoint",
            self.endpoint,
            "--remote-runtime-service-endpoint",
            self.backend_endpoint,
            "--runtime-hook-config-dir",
            str(self.hook_config_dir),
            "--metrics-bind-address",
            self.metrics_bind_address,
            *(["--backend-runtime-mode", "Docker"] if self.docker else []),
            "--data-plane",
            self.data_plane,
            *self._stretched_default("--hook-timeout", DEFAULT_HOOK_TIMEOUT),
            *self._stretched_default("--data-plane-start-timeout", DEFAULT_DATA_PLANE_START_TIMEOUT),
            *self.extra_args,
        ]

    def _stretched_default(self, flag: str, default: float) -> list[str]:
        """A proxy deadline (a plugin call's, HAProxy's start) stretched like every other deadline
        in a slowed-down lane, unless the test sets its own: emulated is slow, not broken."""
        if any(arg.startswith(flag) for arg in self.extra_args):
            return []
        return [flag, f"{scaled(default):g}s"]

    def start(self, timeout: float = START_TIMEOUT) -> RuntimeProxy:
        """Starts the proxy and returns once its socket answers CRI Version (Docker mode: ``/_ping``)."""
        if self.running:
            raise RuntimeError(f"proxy on {self.endpoint} is already running (pid {self.pid})")
        self._stderr = open(self.stderr_path, "ab")
        log_start = self._stderr.tell()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
            start_new_session=True,
            env=self.env,
        )
        try:
            wait = wait_docker_ready if self.docker else wait_cri_ready
            wait(self.endpoint, timeout, alive=lambda: self.running)
            # HAProxy answers on the socket a moment before its supervisor has seen it do so and
            # start-up is complete: a test that killed HAProxy then was killing a start-up.
            wait_for(lambda: not self.running or self._started_since(log_start), "the proxy's serving line", timeout)
            if not self.running:
                raise RuntimeError(f"the proxy exited with code {self.returncode} during start-up")
        except Exception as err:
            self.kill()
            raise RuntimeError(
                f"runtime proxy did not serve on {self.endpoint}: {err}\n"
                f"command: {' '.join(self.command())}\n--- proxy stderr tail ---\n{self.logs(tail=60)}"
            ) from err
        return self

    def _started_since(self, offset: int) -> bool:
        with open(self.stderr_path, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        return any(line in text for line in SERVING_LINES)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def children(self) -> list[int]:
        """PIDs of the proxy's child processes (HAProxy, when it runs one)."""
        if self._proc is None:
            return []
        try:
            text = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        if self._proc is None:
            return None
        stop_process(self._proc, timeout)
        return self._finish()

    def kill(self) -> int | None:
        """SIGKILL: a crash, leaving a stale socket behind like a real crash would."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        return self._finish()

    def _finish(self) -> int | None:
        rc = self._proc.returncode if self._proc is not None else None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        return rc

    def logs(self, tail: int | None = None) -> str:
        """The proxy's stderr (all runs of this instance), optionally only the last lines."""
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        if tail is not None:
            return "\n".join(text.splitlines()[-tail:])
        return text

    def __enter__(self) -> RuntimeProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

