"""koord_testing.ociarchive: the image archive is deterministic, keeps a root filesystem's
file types, numeric owners and modes, clamps times, and its blobs are what its manifests say."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import tarfile
from pathlib import Path

import pytest

from koord_testing import ociarchive

EPOCH = 1_700_000_000


def make_tree(root: Path) -> None:
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "usr/bin/tool").write_bytes(b"#!/bin/sh\n")
    (root / "usr/bin/tool").chmod(0o4755)
    os.link(root / "usr/bin/tool", root / "usr/bin/tool-link")
    (root / "bin").symlink_to("usr/bin")
    (root / "etc/owned").write_text("x")
    os.utime(root / "etc/owned", (1, 1))


def build(root: Path, out_dir: Path, **kwargs) -> tuple[Path, str]:
    out_dir.mkdir()
    layer = ociarchive.layer_from_tree(root, out_dir / "blobs", EPOCH)
    archive = out_dir / "image.tar"
    digest = ociarchive.write_archive(archive, [layer], "docker.io/library/x:1", entrypoint=["/x"],
                                      epoch=EPOCH, **kwargs)
    return archive, digest


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    make_tree(root)
    return root


def test_same_tree_same_digest_and_a_change_changes_it(tree: Path, tmp_path: Path) -> None:
    first, digest = build(tree, tmp_path / "a")
    os.utime(tree / "usr/bin/tool")  # now: after EPOCH, so clamped, same image
    second, again = build(tree, tmp_path / "b")
    assert digest == again and first.read_bytes() == second.read_bytes()
    (tree / "etc/owned").write_text("y")
    _, changed = build(tree, tmp_path / "c")
    assert changed != digest


def test_layer_keeps_types_owners_modes_and_clamps_times(tree: Path, tmp_path: Path) -> None:
    archive, _ = build(tree, tmp_path / "a")
    with tarfile.open(archive) as outer:
        [entry] = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        layer_bytes = outer.extractfile(entry["Layers"][0]).read()  # type: ignore[union-attr]
    members = {m.name: m for m in tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer_bytes)))}
    cases = [  # (name, check)
        ("bin", lambda m: m.issym() and m.linkname == "usr/bin"),
        ("usr/bin/tool", lambda m: m.isreg() and m.mode == 0o4755),
        ("usr/bin/tool-link", lambda m: m.islnk() and m.linkname == "usr/bin/tool"),
        ("etc/owned", lambda m: (m.uid, m.gid, m.uname, m.gname, m.mtime) == (os.getuid(), os.getgid(), "", "", 1)),
        ("usr", lambda m: m.isdir() and m.mtime == EPOCH),
    ]
    for name, check in cases:
        assert check(members[name]), (name, members[name].get_info())
    # level by level, each directory's entries sorted by name
    assert list(members) == ["bin", "etc", "usr", "etc/owned", "usr/bin", "usr/bin/tool", "usr/bin/tool-link"]


def test_manifests_name_the_blobs_they_hold(tree: Path, tmp_path: Path) -> None:
    archive, digest = build(tree, tmp_path / "a", env=["agent_mode=dsMode"])
    with tarfile.open(archive) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar if m.name.startswith("blobs/")}  # type: ignore[union-attr]
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        [docker] = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    for name, data in blobs.items():
        assert name == "blobs/sha256/" + hashlib.sha256(data).hexdigest()
    [entry] = index["manifests"]
    assert entry["digest"] == digest
    manifest = json.loads(blobs["blobs/sha256/" + digest.split(":")[1]])
    config = json.loads(blobs[docker["Config"]])
    assert docker["Config"] == "blobs/sha256/" + manifest["config"]["digest"].split(":")[1]
    [layer] = manifest["layers"]
    assert docker["Layers"] == ["blobs/sha256/" + layer["digest"].split(":")[1]]
    unpacked = gzip.decompress(blobs[docker["Layers"][0]])
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(unpacked).hexdigest()]
    assert config["config"] == {"Entrypoint": ["/x"], "Env": ["agent_mode=dsMode"], "WorkingDir": "/"}
    assert entry["annotations"]["io.containerd.image.name"] == docker["RepoTags"][0] == "docker.io/library/x:1"


@pytest.mark.parametrize("env", [["novalue"], ["=x"]])
def test_malformed_environment_is_refused(tree: Path, tmp_path: Path, env: list[str]) -> None:
    with pytest.raises(ValueError, match="want NAME=value"):
        build(tree, tmp_path / "a", env=env)


def test_socket_in_the_tree_is_refused_naming_it(tree: Path, tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tree / "etc/sock"))
        with pytest.raises(ValueError, match="etc/sock: a socket"):
            build(tree, tmp_path / "a")
