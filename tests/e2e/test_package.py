"""The node package: scripts/package.sh builds a .deb that dpkg installs into a throwaway root,
whose launchers run from the packaged environment alone, and that dpkg purges without a trace.

The throwaway root is a directory with an empty dpkg database: ``dpkg --root`` unpacks into it
and runs the maintainer scripts without chroot (they honour ``$DPKG_ROOT``). Its programs name
``/opt/koord-runtime`` by absolute path, as on a node, so they run in a private mount namespace
where the root's ``/opt`` is bind-mounted over the machine's; the interpreter is the machine's
Debian ``/usr/bin/python3``, which the package depends on.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as cri

from koord_testing.containerd import Containerd
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy

# Building the environment (pip, byte-compiling) takes minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

CHECKOUT = Path(__file__).resolve().parents[2]
PREFIX = "/opt/koord-runtime"


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        pytest.fail("the package test needs root: dpkg --root and a mount namespace", pytrace=False)
    out = tmp_path_factory.mktemp("deb")
    subprocess.run([str(CHECKOUT / "scripts" / "package.sh"), str(out)], check=True, timeout=1200,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    (package,) = out.glob("koord-runtime_*.deb")
    return package


def dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends",
                           "--log=/dev/null", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("root")
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates"):
        (root / d).mkdir(parents=True)
    for f in ("var/lib/dpkg/status", "var/lib/dpkg/available"):
        (root / f).touch()
    result = dpkg(root, "-i", str(deb))
    assert result.returncode == 0, result.stdout + result.stderr
    yield root


def in_root(root: Path, *command: str) -> list[str]:
    """``command`` in a private mount namespace where ``root``'s /opt is the machine's /opt."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind "{root}/opt" /opt && exec "$0" "$@"', *command]


def run_in_root(root: Path, *command: str) -> subprocess.CompletedProcess[str]:
    # No checkout on the path and no inherited Python settings: only the packaged environment.
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run(in_root(root, *command), capture_output=True, text=True, timeout=120, cwd="/", env=env)


def test_package_metadata_and_files(deb: Path) -> None:
    info = subprocess.run(["dpkg-deb", "--field", str(deb), "Package", "Depends", "Recommends", "Breaks"],
                          capture_output=True, text=True, check=True).stdout
    assert "Package: koord-runtime" in info
    for needed in ("haproxy", "python3 (>= 3.11)"):
        assert needed in info
    # Any containerd from 1.6 to 2.x (Debian 12's 1.6.20, Debian 13's 1.7, unstable's 2.1) or Docker.
    assert "Recommends: containerd (>= 1.6~) | containerd.io (>= 1.6~) | docker.io" in info
    assert "Breaks: containerd (<< 1.6~), containerd (>= 3~)" in info
    for version, accepted in (("1.6.20~ds1-1+b1", True), ("1.7.24~ds1-6", True), ("2.1.9+ds1-5", True),
                              ("1.5.9~ds1-1", False), ("3.0.0-1", False)):
        in_range = all(subprocess.run(["dpkg", "--compare-versions", version, op, bound]).returncode == 0
                       for op, bound in (("ge", "1.6~"), ("lt", "3~")))
        assert in_range == accepted, version
    files = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True).stdout
    for path in ("./usr/bin/koordlet -> /opt/koord-runtime/bin/koordlet",
                 "./usr/bin/koord-runtime-proxy -> /opt/koord-runtime/bin/koord-runtime-proxy",
                 "./lib/systemd/system/koordlet.service", "./lib/systemd/system/koord-runtime-proxy.service",
                 "./etc/koordlet/node.yaml", "./etc/koordlet/nodeslo.yaml",
                 "./usr/share/koord-runtime/examples/nodemetric.yaml", "./usr/share/doc/koord-runtime/copyright"):
        assert path in files, f"{path} is not in the package"
    shipped = [line.split()[-1] for line in files.splitlines() if "site-packages/" in line]
    assert any("/site-packages/koord/koordlet/cli.py" in name for name in shipped)
    assert not [name for name in shipped if "koord_testing" in name or "/koord/demo" in name], "test code shipped"
    # package.sh builds the environment under <staging dir>/root/opt/koord-runtime: no file may keep that path.
    tarball = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    assert b"/root/opt/koord-runtime" not in tarball, "a file names the build's staging directory"


def test_installs_into_a_throwaway_root(installed: Path) -> None:
    status = subprocess.run(["dpkg", f"--root={installed}", "-s", "koord-runtime"], capture_output=True, text=True)
    assert "Status: install ok installed" in status.stdout
    # The postinst put the NodeMetric example in place; the unit names every file it reads.
    for name in ("node.yaml", "nodeslo.yaml", "nodemetric.yaml"):
        assert (installed / "etc/koordlet" / name).is_file()
    for unit in ("koordlet.service", "koord-runtime-proxy.service"):
        text = (installed / "lib/systemd/system" / unit).read_text()
        assert f"ExecStart=/usr/bin/{unit.removesuffix('.service')} " in text
    # Installed, not enabled: nothing links the units into a target.
    assert not (installed / "etc/systemd").exists()


@pytest.mark.parametrize("binary", ["koordlet", "koord-runtime-proxy"])
def test_both_launchers_run_from_the_package(installed: Path, binary: str) -> None:
    result = run_in_root(installed, f"{installed}/usr/bin/{binary}", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{binary} 0.1.0 "), result.stdout
    assert "follows Koordinator v" in result.stdout


def test_code_comes_from_the_packaged_environment(installed: Path) -> None:
    result = run_in_root(installed, f"{PREFIX}/bin/python", "-c",
                         "import grpc, koord, yaml; print(koord.__file__, grpc.__file__, yaml.__file__)")
    assert result.returncode == 0, result.stderr
    assert all(path.startswith(f"{PREFIX}/lib/") for path in result.stdout.split())


def test_packaged_proxy_serves_a_real_containerd(installed: Path, containerd: Containerd, tmp_path: Path) -> None:
    """The installed launcher, with HAProxy from the machine, forwards kubelet's calls."""

    class PackagedProxy(RuntimeProxy):
        def command(self) -> list[str]:
            return in_root(installed, f"{installed}/usr/bin/koord-runtime-proxy", *super().command()[3:])

    proxy = PackagedProxy(tmp_path / "proxy", containerd.endpoint, data_plane="haproxy").start()
    try:
        with KubeletClient(proxy.endpoint) as client:
            assert client.runtime.Version(cri.VersionRequest()).runtime_name == "containerd"
        assert proxy.children(), "HAProxy runs as the packaged proxy's child"
    finally:
        assert proxy.stop() == 0, proxy.logs(tail=40)


def test_purge_leaves_nothing(deb: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates"):
        (root / d).mkdir(parents=True)
    for f in ("var/lib/dpkg/status", "var/lib/dpkg/available"):
        (root / f).touch()
    assert dpkg(root, "-i", str(deb)).returncode == 0
    result = dpkg(root, "--purge", "koord-runtime")
    assert result.returncode == 0, result.stdout + result.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not str(p.relative_to(root)).startswith("var"))
    assert left == [], f"left after purge: {left[:20]}"
