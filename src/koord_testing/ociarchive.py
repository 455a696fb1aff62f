"""An image archive that ``ctr images import`` and ``docker load`` both take, written offline.

The tarball is at once an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256``)
and a docker-archive (``manifest.json`` pointing at the same blobs): the machines that build
and test images have no registry and no image builder. Everything is deterministic, so the
same inputs give the same image digest: entries in sorted order, owners by number only,
modification times clamped to ``epoch``, gzip without a name or time stamp.

Used for the tests' pause image (``koord_testing.image``) and for koordlet's image
(``scripts/image.sh``: ``python3 -m koord_testing.ociarchive``, standard library only).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """A gzip-compressed layer blob on disk: ``digest`` of the blob, ``diff_id`` of its tar."""

    path: Path
    digest: str
    diff_id: str
    size: int
    unpacked_size: int


class _HashingWriter(io.RawIOBase):
    """Passes bytes through to ``target`` while hashing and counting them."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target, self.sha, self.count = target, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.count += len(data)
        self.target.write(data)
        return len(data)


def _clean(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    info.mtime = min(int(info.mtime), epoch)
    info.uname = info.gname = ""
    return info


def _tree_members(root: Path) -> Iterable[tuple[tarfile.TarInfo, str | None]]:
    """Every entry below ``root`` in sorted order with the file to read for it (regular files).
    Sockets cannot be in an image: they are refused naming the path."""
    probe = tarfile.TarFile(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT)
    for top, dirs, files in os.walk(root):
        dirs.sort()
        here = Path(top)
        for name in sorted([*dirs, *files]):
            path = here / name
            mode = path.lstat().st_mode
            if stat.S_ISSOCK(mode):
                raise ValueError(f"{path}: a socket cannot be put into an image layer")
            info = probe.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            yield info, str(path) if info.isreg() else None


def _write_layer(dest_dir: Path, members: Iterable[tuple[tarfile.TarInfo, IO[bytes] | str | None]],
                 epoch: int) -> Layer:
    """Writes one layer blob into ``dest_dir``, named by its digest."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest_dir, suffix=".tmp")
    with os.fdopen(fd, "wb") as raw:
        blob = _HashingWriter(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=6) as gz:
            diff = _HashingWriter(gz)  # type: ignore[arg-type]
            with tarfile.open(fileobj=diff, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for info, source in members:
                    info = _clean(info, epoch)
                    if isinstance(source, str):
                        with open(source, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info, source)
    digest = "sha256:" + blob.sha.hexdigest()
    path = dest_dir / digest.split(":", 1)[1]
    os.replace(tmp_name, path)
    return Layer(path, digest, "sha256:" + diff.sha.hexdigest(), blob.count, diff.count)


def layer_from_tree(root: Path, dest_dir: Path, epoch: int) -> Layer:
    """A layer holding everything below ``root`` (a root filesystem), owners and modes kept."""
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    return _write_layer(dest_dir, _tree_members(root), epoch)


def layer_from_files(files: Sequence[tuple[str, bytes, int]], dest_dir: Path, epoch: int = 0) -> Layer:
    """A layer of the given ``(name, content, mode)`` files, owned by root."""
    members = []
    for name, data, mode in sorted(files):
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, epoch
        members.append((info, io.BytesIO(data)))
    return _write_layer(dest_dir, members, epoch)


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


def _iso(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_archive(out: Path, layers: Sequence[Layer], ref: str, *, entrypoint: Sequence[str],
                  env: Sequence[str] = (), epoch: int = 0, architecture: str = "amd64",
                  created_by: str = "koord_testing.ociarchive") -> str:
    """Writes the image archive to ``out`` (atomically) and returns its manifest digest."""
    for item in env:
        if "=" not in item or item.startswith("="):
            raise ValueError(f"image environment {item!r}: want NAME=value")
    created = _iso(epoch)
    config_doc: dict[str, object] = {"Entrypoint": list(entrypoint), "WorkingDir": "/"}
    if env:
        config_doc["Env"] = list(env)
    config = _json({"architecture": architecture, "os": "linux", "created": created, "config": config_doc,
                    "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
                    "history": [{"created": created, "created_by": created_by}]})
    manifest = _json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest, "size": layer.size} for layer in layers]})
    index = _json({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
        "size": len(manifest), "platform": {"architecture": architecture, "os": "linux"},
        "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}}]})
    docker_manifest = _json([{"Config": _blob_name(_digest(config)), "RepoTags": [ref],
                              "Layers": [_blob_name(layer.digest) for layer in layers]}])

    def small(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o644, epoch
        tar.addfile(info, io.BytesIO(data))

    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        small(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        small(tar, "index.json", index)
        small(tar, "manifest.json", docker_manifest)
        for layer in layers:
            info = tarfile.TarInfo(_blob_name(layer.digest))
            info.size, info.mode, info.mtime = layer.size, 0o644, epoch
            with open(layer.path, "rb") as f:
                tar.addfile(info, f)
        for blob in (config, manifest):
            small(tar, _blob_name(_digest(blob)), blob)
    os.replace(tmp, out)
    return _digest(manifest)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m koord_testing.ociarchive ROOTFS OUT.tar --ref R --entrypoint P [--env N=V] [--epoch S]``"""
    p = argparse.ArgumentParser(prog="ociarchive", description="one-layer image archive of a root filesystem")
    p.add_argument("rootfs", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--ref", required=True, help="image name, e.g. docker.io/library/koordlet:latest")
    p.add_argument("--entrypoint", required=True, action="append", help="repeat for each argument")
    p.add_argument("--env", action="append", default=[], help="NAME=value, repeatable")
    p.add_argument("--epoch", type=int, default=0, help="modification times are clamped to this")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as blobs:
        try:
            layer = layer_from_tree(args.rootfs, Path(blobs), args.epoch)
            digest = write_archive(args.out, [layer], args.ref, entrypoint=args.entrypoint, env=args.env,
                                   epoch=args.epoch, created_by="scripts/image.sh")
        except (OSError, ValueError) as err:
            print(f"ociarchive: {err}", file=sys.stderr)
            return 1
    print(f"ociarchive: {args.out}: {digest}, layer {layer.size} bytes gzip, {layer.unpacked_size} bytes tar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
