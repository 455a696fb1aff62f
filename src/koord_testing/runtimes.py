"""Which containerd builds the end-to-end tests run against.

Two containerds matter: Debian 12's 1.6 on PATH (the system's), and a 2.x that
``scripts/containerd2.sh`` unpacks into a private prefix beside it (a modern node's: CRI v1
only, NRI on by default). The tests run every case that starts containerd against each
selected build; ``$KOORD_TEST_CONTAINERD`` selects them (``all``, the default, ``system`` or
``2``) and ``$KOORD_CONTAINERD2_DIR`` names the 2.x prefix's ``usr/bin`` when it is not the
checkout's ``.cache/containerd2/usr/bin``. A selected build that is missing is an error that
says how to install it, never a skipped test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_VERSION = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)")
SELECT_ENV = "KOORD_TEST_CONTAINERD"
DIR_ENV = "KOORD_CONTAINERD2_DIR"
CHOICES = ("all", "system", "2")


@dataclass(frozen=True)
class ContainerdRuntime:
    """One containerd build: where its binaries are (``None``: on PATH) and its version."""

    bin_dir: Path | None
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def has_nri(self) -> bool:
        """containerd 1.7 and later have the NRI plugin (on by default from 2.0)."""
        major, minor = (int(part) for part in self.version.split(".")[:2])
        return (major, minor) >= (1, 7)

    @property
    def id(self) -> str:
        """A test id naming the build: ``containerd1.6``, ``containerd2.1``."""
        return "containerd" + ".".join(self.version.split(".")[:2])

    def binary(self, name: str) -> str:
        """``containerd``, ``ctr`` or ``containerd-shim-runc-v2`` of this build; raises when absent."""
        if self.bin_dir is not None:
            path = self.bin_dir / name
            if os.access(path, os.X_OK):
                return str(path)
            raise RuntimeError(f"{path} is missing: run scripts/containerd2.sh")
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(f"{name} is not on PATH (Debian package containerd)")
        return found

    def env(self) -> dict[str, str]:
        """The environment containerd runs in: its own shim must come first on PATH."""
        env = dict(os.environ)
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env


def version_of(containerd: str) -> str:
    """``X.Y.Z`` from ``containerd --version``; raises naming the binary when it does not run."""
    try:
        out = subprocess.run([containerd, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"{containerd} --version failed: {err}") from err
    # "containerd github.com/containerd/containerd/v2 2.1.9+unknown": the module path's /v2 is no version.
    match = _VERSION.search(out.split(" ", 2)[-1])
    if match is None:
        raise RuntimeError(f"{containerd} --version printed no version: {out.strip()!r}")
    return ".".join(match.groups())


def system_runtime() -> ContainerdRuntime:
    """The containerd on PATH (Debian 12's 1.6 on these machines)."""
    return ContainerdRuntime(None, version_of(ContainerdRuntime(None, "0.0.0").binary("containerd")))


def private_runtime(checkout: Path) -> ContainerdRuntime:
    """The 2.x that ``scripts/containerd2.sh`` unpacked; raises saying how to get it."""
    bin_dir = Path(os.environ.get(DIR_ENV) or checkout / ".cache" / "containerd2" / "usr" / "bin")
    runtime = ContainerdRuntime(bin_dir, "0.0.0")
    version = version_of(runtime.binary("containerd"))
    if not version.startswith("2."):
        raise RuntimeError(f"{bin_dir}/containerd is {version}, not a containerd 2.x")
    return ContainerdRuntime(bin_dir, version)


def selection() -> tuple[str, ...]:
    """The builds ``$KOORD_TEST_CONTAINERD`` names: ``("system", "2")``, ``("system",)`` or ``("2",)``."""
    choice = os.environ.get(SELECT_ENV, "all") or "all"
    if choice not in CHOICES:
        raise RuntimeError(f"{SELECT_ENV}={choice!r}: want one of {', '.join(CHOICES)}")
    return ("system", "2") if choice == "all" else (choice,)


@lru_cache(maxsize=4)
def resolve(choice: str, checkout: Path) -> ContainerdRuntime:
    """``"system"`` or ``"2"`` as a checked build; raises saying how to install a missing one."""
    return system_runtime() if choice == "system" else private_runtime(checkout)
