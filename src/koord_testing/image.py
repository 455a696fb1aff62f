"""The e2e test image: one static ``/pause`` binary in a one-layer image archive that
``ctr -n k8s.io images import`` and ``docker load`` both accept offline
(``koord_testing.ociarchive``): the machines that run these tests have no registry access.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from koord_testing import ociarchive

DEFAULT_REF = "docker.io/koord/pause:test"

# Fixed mtime: identical inputs give a byte-identical tarball and image id.
_EPOCH = 0


def _pause_source() -> bytes:
    return resources.files("koord_testing").joinpath("pause.c").read_bytes()


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


def image_archive_bytes(binary: bytes, ref: str) -> bytes:
    """Returns the image archive (``koord_testing.ociarchive``) of ``binary`` as ``/pause``, named ``ref``."""
    with tempfile.TemporaryDirectory() as tmp:
        layer = ociarchive.layer_from_files([("pause", binary, 0o755)], Path(tmp), _EPOCH)
        out = Path(tmp) / "image.tar"
        ociarchive.write_archive(out, [layer], ref, entrypoint=["/pause"], epoch=_EPOCH,
                                 created_by="koord_testing.image")
        return out.read_bytes()


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
