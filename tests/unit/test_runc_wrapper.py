"""The runc wrapper the test containerd runs under its systemd cgroup driver: every call
reaches the real runc without ``--systemd-cgroup`` and with its other arguments intact;
only create and run go through Python, which moves the bundle's cgroups path to where
systemd would have made it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from koord_testing import containerd as containerd_module
from koord_testing.containerd import Containerd

SCOPE = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice/cri-containerd-c1.scope"


@pytest.fixture
def wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the wrapper, the file where the fake real runc writes the arguments it got)."""
    got = tmp_path / "args"
    real = tmp_path / "runc"
    real.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {got}\n')
    real.chmod(0o755)
    monkeypatch.setattr(containerd_module.shutil, "which", lambda name: str(real) if name == "runc" else None)
    instance = Containerd(tmp_path / "containerd", cgroup_driver="systemd")
    instance.workdir.mkdir(parents=True)
    instance._write_runc_wrapper()
    return instance.runc_wrapper, got


@pytest.mark.parametrize("args, want", [
    (["--root", "/r", "--systemd-cgroup", "delete", "--force", "c1"], ["--root", "/r", "delete", "--force", "c1"]),
    (["--systemd-cgroup", "state", "c1"], ["state", "c1"]),
    (["kill", "--all", "c1", "9"], ["kill", "--all", "c1", "9"]),
    (["--log", "/a dir/with spaces.json", "state", ""], ["--log", "/a dir/with spaces.json", "state", ""]),
])
def test_calls_reach_runc_without_the_systemd_flag(wrapper: tuple[Path, Path], args: list[str],
                                                   want: list[str]) -> None:
    script, got = wrapper
    subprocess.run([str(script), *args], check=True, timeout=30)
    assert got.read_bytes().split(b"\0")[:-1] == [a.encode() for a in want]


def test_create_moves_the_bundle_to_the_scope_systemd_would_make(wrapper: tuple[Path, Path], tmp_path: Path) -> None:
    script, got = wrapper
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(
        {"linux": {"cgroupsPath": "kubepods-besteffort-podu1.slice:cri-containerd:c1"}}))
    subprocess.run([str(script), "--systemd-cgroup", "create", "--bundle", str(bundle), "c1"], check=True, timeout=60)
    assert got.read_bytes().split(b"\0")[:-1] == [b"create", b"--bundle", str(bundle).encode(), b"c1"]
    assert json.loads((bundle / "config.json").read_text())["linux"]["cgroupsPath"] == SCOPE
