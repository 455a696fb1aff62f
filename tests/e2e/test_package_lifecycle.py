"""The package's lifecycle with dpkg: install, upgrade between two builds, remove, purge.

Two roots, because maintainer scripts behave two ways:

- An image root (``dpkg --root --force-script-chrootless``): the scripts run on this machine
  with ``$DPKG_ROOT`` set, as when an image is built from the package. They must put files
  under the root and leave this machine's services alone: a ``systemctl`` and a
  ``deb-systemd-invoke`` on PATH record any call, and none may come.
- A node root (``dpkg --root`` with its default chroot): a busybox root with
  ``/run/systemd/system``, so the scripts see a running systemd, as on a node. Its
  ``systemctl`` and ``deb-systemd-invoke`` record the calls: which services the scripts ask to
  restart or stop is what can be checked without systemd running.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

CHECKOUT = Path(__file__).resolve().parents[2]
OLD, NEW = "0.1.0", "0.1.1"
UNITS = "koordlet.service koord-runtime-proxy.service"
PROXY_ENDPOINT = "unix:///var/run/koord-runtimeproxy/runtimeproxy.sock"
RECORDER = '#!/bin/sh\necho "{name} $*" >> "{log}"\n'


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two builds of the same sources, the second with a higher version."""
    if os.geteuid() != 0:
        pytest.fail("the package lifecycle test needs root: dpkg --root, chroot, mknod", pytrace=False)
    out = tmp_path_factory.mktemp("debs")
    for version in (OLD, NEW):
        subprocess.run([str(CHECKOUT / "scripts" / "package.sh"), str(out)], check=True, timeout=1200,
                       env={**os.environ, "KOORD_PACKAGE_VERSION": version},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return {version: next(out.glob(f"koord-runtime_{version}_*.deb")) for version in (OLD, NEW)}


def empty_dpkg_root(root: Path) -> Path:
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates"):
        (root / d).mkdir(parents=True)
    for f in ("var/lib/dpkg/status", "var/lib/dpkg/available"):
        (root / f).touch()
    return root


def recorders(bin_dir: Path, log: Path | str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("systemctl", "deb-systemd-invoke"):
        (bin_dir / name).write_text(RECORDER.format(name=name, log=log))
        (bin_dir / name).chmod(0o755)


class Root:
    """A dpkg root and how dpkg runs the package's scripts in it."""

    def __init__(self, path: Path, chrootless: bool, calls: Path, path_env: str) -> None:
        self.path, self.chrootless, self.calls, self.path_env = path, chrootless, calls, path_env

    def dpkg(self, *args: str) -> subprocess.CompletedProcess[str]:
        extra = ["--force-script-chrootless"] if self.chrootless else []
        done = subprocess.run(["dpkg", f"--root={self.path}", *extra, "--force-depends", "--log=/dev/null", *args],
                              capture_output=True, text=True, timeout=300,
                              env={"PATH": self.path_env, "LANG": "C.UTF-8"})
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def take_calls(self) -> list[str]:
        """The recorded systemctl/deb-systemd-invoke calls since the last take."""
        if not self.calls.exists():
            return []
        lines = self.calls.read_text().splitlines()
        self.calls.unlink()
        return lines

    def status(self) -> str:
        done = subprocess.run(["dpkg-query", f"--root={self.path}", "-W", "-f=${db:Status-Abbrev} ${Version}",
                               "koord-runtime"], capture_output=True, text=True)
        return " ".join(done.stdout.split()) or "absent"


@pytest.fixture
def image_root(tmp_path: Path) -> Root:
    recorders(tmp_path / "bin", tmp_path / "calls.log")
    return Root(empty_dpkg_root(tmp_path / "root"), True, tmp_path / "calls.log",
                f"{tmp_path / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin")


@pytest.fixture
def node_root(tmp_path: Path) -> Iterator[Root]:
    root = empty_dpkg_root(tmp_path / "node")
    (root / "bin").mkdir()
    (root / "bin/busybox").write_bytes(Path("/bin/busybox").read_bytes())
    (root / "bin/busybox").chmod(0o755)
    for applet in ("sh", "cp", "rm", "rmdir", "mkdir", "cat", "echo", "test", "[", "ln"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "dev").mkdir()
    subprocess.run(["mknod", "-m", "666", str(root / "dev/null"), "c", "1", "3"], check=True)
    (root / "run/systemd/system").mkdir(parents=True)
    (root / "tmp").mkdir()
    recorders(root / "usr/bin", "/calls.log")
    yield Root(root, False, root / "calls.log", "/usr/sbin:/usr/bin:/sbin:/bin")


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir() or p.is_symlink()}


def test_image_root_lifecycle(debs: dict[str, Path], image_root: Root) -> None:
    root = image_root.path
    image_root.dpkg("-i", str(debs[OLD]))
    assert image_root.status() == f"ii {OLD}"
    conffiles = subprocess.run(["dpkg-query", f"--root={root}", "-W", "-f=${Conffiles}", "koord-runtime"],
                               capture_output=True, text=True, check=True).stdout
    assert sorted(re.findall(r"^ (\S+) [0-9a-f]{32}$", conffiles, re.M)) == [
        "/etc/default/koordlet", "/etc/koordlet/node.yaml", "/etc/koordlet/nodeslo.yaml"]
    assert 'KOORDLET_OPTS=""' in (root / "etc/default/koordlet").read_text()
    assert (root / "etc/koordlet/nodemetric.yaml").is_file(), "the postinst puts the NodeMetric file in place"
    # md5sums names every shipped file but the conffiles, and every sum matches.
    verify = subprocess.run(["dpkg", f"--root={root}", "--verify", "koord-runtime"], capture_output=True, text=True)
    assert (verify.returncode, verify.stdout) == (0, "")
    sums = (root / "var/lib/dpkg/info/koord-runtime.md5sums").read_text().splitlines()
    shipped = {p for p in files_under(root) if not p.startswith(("var/", "etc/")) and not (root / p).is_symlink()}
    assert {line.split("  ", 1)[1] for line in sums} == shipped
    assert image_root.take_calls() == [], "scripts under DPKG_ROOT touched this machine's services"

    # The administrator's edits, koordlet's state and registration, and enable links.
    (root / "etc/default/koordlet").write_text('KOORDLET_OPTS="--addr=:9400"\n')
    (root / "var/lib/koordlet/metric-data").mkdir(parents=True)
    (root / "var/lib/koordlet/metric-data/tsdb").write_text("x")
    (root / "etc/runtime/hookserver.d").mkdir(parents=True)
    (root / "etc/runtime/hookserver.d/koordlet.json").write_text("{}")
    (root / "etc/runtime/hookserver.d/other-plugin.json").write_text("{}")
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
    for unit in UNITS.split():
        (root / "etc/systemd/system/multi-user.target.wants" / unit).symlink_to(f"/lib/systemd/system/{unit}")

    upgrade = image_root.dpkg("-i", str(debs[NEW]))
    assert f"Unpacking koord-runtime ({NEW}) over ({OLD})" in upgrade.stdout
    assert image_root.status() == f"ii {NEW}"
    assert (root / "etc/default/koordlet").read_text() == 'KOORDLET_OPTS="--addr=:9400"\n', "conffile edit lost"
    changelog = gzip.decompress((root / "usr/share/doc/koord-runtime/changelog.gz").read_bytes()).decode()
    assert changelog.startswith(f"koord-runtime ({NEW}) ") and f"koord-runtime ({OLD}) " in changelog
    assert image_root.take_calls() == []

    # kubelet still on the proxy's socket: removal goes on and says how to point kubelet back.
    (root / "var/lib/kubelet").mkdir(parents=True)
    (root / "var/lib/kubelet/kubeadm-flags.env").write_text(
        f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint={PROXY_ENDPOINT} --pod-infra-container-image=x"\n')
    removed = image_root.dpkg("-r", "koord-runtime")
    said = removed.stdout + removed.stderr
    assert f"/var/lib/kubelet/kubeadm-flags.env: {PROXY_ENDPOINT}" in said, said
    assert "systemctl restart kubelet" in said
    assert image_root.status().startswith("rc "), "removed, configuration kept"
    assert not (root / "opt/koord-runtime").exists() and not (root / "usr/bin/koordlet").is_symlink()
    for kept in ("etc/default/koordlet", "etc/koordlet/node.yaml", "etc/koordlet/nodemetric.yaml",
                 "var/lib/koordlet/metric-data/tsdb", "etc/runtime/hookserver.d/koordlet.json"):
        assert (root / kept).exists(), f"{kept} went on remove"
    assert image_root.take_calls() == []

    image_root.dpkg("-P", "koord-runtime")
    assert image_root.status() == "absent"
    left = {p for p in files_under(root) if not p.startswith("var/lib/dpkg/")}
    assert left == {"var/lib/kubelet/kubeadm-flags.env", "etc/runtime/hookserver.d/other-plugin.json"}
    assert image_root.take_calls() == []


def test_kubelet_on_the_runtime_removes_silently(debs: dict[str, Path], image_root: Root) -> None:
    image_root.dpkg("-i", str(debs[OLD]))
    (image_root.path / "var/lib/kubelet").mkdir(parents=True)
    (image_root.path / "var/lib/kubelet/config.yaml").write_text(
        "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
    removed = image_root.dpkg("-r", "koord-runtime")
    assert "kubelet" not in removed.stdout + removed.stderr


def test_node_root_asks_systemd_to_restart_on_upgrade_and_stop_on_remove(debs: dict[str, Path],
                                                                          node_root: Root) -> None:
    steps = [
        (("-i", str(debs[OLD])), f"ii {OLD}", ["systemctl --system daemon-reload"]),
        (("-i", str(debs[NEW])), f"ii {NEW}",
         ["systemctl --system daemon-reload", f"deb-systemd-invoke try-restart {UNITS}"]),
        (("-i", str(debs[OLD])), f"ii {OLD}",  # a downgrade, as a roll-back does
         ["systemctl --system daemon-reload", f"deb-systemd-invoke try-restart {UNITS}"]),
        (("-r", "koord-runtime"), f"rc {OLD}",
         [f"deb-systemd-invoke stop {UNITS}", "systemctl --system daemon-reload"]),
        (("-P", "koord-runtime"), "absent", []),
    ]
    for args, status, calls in steps:
        if args[0] == "-P":
            (node_root.path / "var/lib/koordlet/prediction-checkpoints").mkdir(parents=True)
        node_root.dpkg(*args)
        assert node_root.status() == status, args
        assert node_root.take_calls() == calls, args
    assert not (node_root.path / "var/lib/koordlet").exists()
    assert not (node_root.path / "etc/koordlet").exists()
    assert not (node_root.path / "etc/default/koordlet").exists()


def test_copyright_names_every_bundled_distribution(debs: dict[str, Path], tmp_path: Path) -> None:
    """One DEP-5 stanza per dist-info directory the package ships, each with a licence."""
    tree = tmp_path / "tree"
    subprocess.run(["dpkg-deb", "-x", str(debs[OLD]), str(tree)], check=True)
    site = next(tree.glob("opt/koord-runtime/lib/python3*/site-packages"))
    shipped = {p.name for p in site.glob("*.dist-info")}
    text = (tree / "usr/share/doc/koord-runtime/copyright").read_text()
    stanzas = text.split("\n\n")
    assert stanzas[0].startswith("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/")
    named = set(re.findall(r"/site-packages/([^/\s]+\.dist-info)/\*", text))
    assert named == shipped - {next(n for n in shipped if n.startswith("koord_runtime-"))}
    assert len(stanzas) - 1 == len(shipped)
    for stanza in stanzas[1:]:
        assert re.search(r"^Files: \S", stanza, re.M) and re.search(r"^License: \S", stanza, re.M), stanza
        assert re.search(r"^Copyright: \S", stanza, re.M), stanza
    # The lock's versions, not whatever the index had newest.
    lock = (CHECKOUT / "requirements.lock").read_text()
    for dist_info in shipped:
        name, version = dist_info.removesuffix(".dist-info").rsplit("-", 1)
        if not name.startswith("koord_runtime"):
            pinned = re.search(rf"^{re.escape(name).replace('_', '[-_.]')}=={re.escape(version)} ", lock, re.M | re.I)
            assert pinned, f"{dist_info} is not the lock's version"


def test_two_builds_ship_the_same_files_but_the_changelog(debs: dict[str, Path]) -> None:
    """The lock's pins, hash-checked byte-code and no staging path in any file: two builds of
    the same sources differ only in the version they were asked to carry."""

    def sums(deb: Path) -> dict[str, str]:
        text = subprocess.run(["dpkg-deb", "--info", str(deb), "md5sums"], capture_output=True, text=True,
                              check=True).stdout
        return {path: digest for digest, path in (line.split("  ", 1) for line in text.splitlines())}

    old, new = sums(debs[OLD]), sums(debs[NEW])
    assert old.keys() == new.keys()
    assert [path for path in old if old[path] != new[path]] == ["usr/share/doc/koord-runtime/changelog.gz"]


def member_times(deb: Path) -> set[int]:
    """The modification time of every ar member of ``deb`` and of every file in its control
    and data archives."""
    data = deb.read_bytes()
    assert data[:8] == b"!<arch>\n"
    times, offset = set(), 8
    while offset < len(data):
        header = data[offset:offset + 60]
        times.add(int(header[16:28]))
        offset += 60 + int(header[48:58])
        offset += offset % 2  # members are 2-byte aligned
    for what in ("--ctrl-tarfile", "--fsys-tarfile"):
        archive = subprocess.run(["dpkg-deb", what, str(deb)], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            times |= {member.mtime for member in tar}
    return times


def test_every_member_of_both_builds_carries_the_last_commits_time(debs: dict[str, Path]) -> None:
    """Not the moment of the build: two builds of the same sources and version are the same
    bytes (SOURCE_DATE_EPOCH, the last commit's time by default)."""
    commit = int(subprocess.run(["git", "-C", str(CHECKOUT), "log", "-1", "--format=%ct"], capture_output=True,
                                text=True, check=True).stdout)
    for deb in debs.values():
        assert member_times(deb) == {commit}, deb.name
