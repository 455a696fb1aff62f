"""The e2e test image: one static ``/pause`` binary in a one-layer tarball.

The tarball is at once an OCI image layout (``oci-layout``, ``index.json``,
``blobs/sha256``) and a docker-archive (``manifest.json`` pointing at the same
blobs), so ``ctr -n k8s.io images import`` and ``docker load`` both accept it
offline: the machines that run these tests have no registry access.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from importlib import resources
from pathlib import Path

DEFAULT_REF = "docker.io/koord/pause:test"

# Fixed mtime: identical inputs give a byte-identical tarball and image id.
_EPOCH = 0


def _pause_source() -> bytes:
    return resources.files("koord.testing").joinpath("pause.c").read_bytes()


def compile_pause(workdir: Path) -> Path:
    """Builds the static pause binary once per source content and returns its path."""
    source = _pause_source()
    key = hashlib.sha256(source).hexdigest()[:16]
    binary = workdir / f"pause-{key}"
    if binary.exists():
        return binary
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / f"pause-{key}.c"
    src.write_bytes(source)
    tmp = binary.with_suffix(".tmp")
    proc = subprocess.run(
        ["gcc", "-static", "-O2", "-o", str(tmp), str(src)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {src} with gcc -static failed:\n{proc.stderr}")
    tmp.rename(binary)
    return binary


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = _EPOCH
    info.uid = info.gid = 0
    tar.addfile(info, io.BytesIO(data))


def _layer_tar(binary: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, "pause", binary, mode=0o755)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob_path(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def image_archive_bytes(binary: bytes, ref: str) -> bytes:
    """Returns the dual OCI-layout/docker-archive tarball for ``binary`` named ``ref``."""
    layer = _layer_tar(binary)
    layer_digest = _digest(layer)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "koord.testing.image"}],
        }
    )
    config_digest = _digest(config)
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer),
                }
            ],
        }
    )
    manifest_digest = _digest(manifest)
    index = _json(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref,
                    },
                }
            ],
        }
    )
    docker_manifest = _json(
        [
            {
                "Config": _blob_path(config_digest),
                "RepoTags": [ref],
                "Layers": [_blob_path(layer_digest)],
            }
        ]
    )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _tar_member(tar, "index.json", index)
        _tar_member(tar, "manifest.json", docker_manifest)
        for blob in (layer, config, manifest):
            _tar_member(tar, _blob_path(_digest(blob)), blob)
    return out.getvalue()


def build_pause_image(workdir: Path, ref: str = DEFAULT_REF) -> Path:
    """Returns a cached image tarball for ``ref``; rebuilt only when pause.c changes."""
    workdir = Path(workdir)
    binary = compile_pause(workdir)
    ref_key = hashlib.sha256(ref.encode()).hexdigest()[:8]
    archive = workdir / f"{binary.name}-{ref_key}.tar"
    if not archive.exists():
        tmp = archive.with_suffix(".tmp")
        tmp.write_bytes(image_archive_bytes(binary.read_bytes(), ref))
        tmp.rename(archive)
    return archive
