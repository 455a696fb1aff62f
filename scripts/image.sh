#!/usr/bin/env bash
# Builds koordlet's container image without a registry or an image builder:
#
#   scripts/image.sh OUTDIR      # -> OUTDIR/koordlet-image.tar, named docker.io/library/koordlet:latest
#
# The root filesystem is Debian 12's Essential packages and python3 (mmdebstrap, from the
# machine's own Debian mirror); koordlet and its dependencies are installed under
# /opt/koordlet/lib from requirements.lock, hashes checked, wheels only (nothing is
# compiled); /koordlet, the entry point upstream's DaemonSet names as its command, starts it.
# No test helpers, demos, apt, compilers, docs (copyright files stay), man pages or locales.
# agent_mode=dsMode is set in the image, so koordlet takes upstream's DaemonSet defaults
# (/host-cgroup/, /host-sys/, ...). The archive is an OCI layout and a docker-archive at once
# (koord_testing.ociarchive): `ctr -n k8s.io images import` and `docker load` both take it.
# Run as root on Debian 12 x86_64 (the wheels and byte-code must match the image's python3).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "image.sh: $*" >&2; exit 1; }
[ $# -eq 1 ] || { echo "usage: scripts/image.sh OUTDIR" >&2; exit 2; }
OUTDIR=$(realpath -m "$1")
REF=docker.io/library/koordlet:latest
PREFIX=/opt/koordlet/lib
PYTHON=/usr/bin/python3
START=$SECONDS
# Modification times in the image are clamped to this (same inputs, same image digest).
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

[ "$(id -u)" = 0 ] || fail "must run as root (mmdebstrap's root mode, chroot)"
command -v mmdebstrap >/dev/null || fail "mmdebstrap is missing (Debian package mmdebstrap; scripts/install.sh installs it)"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || fail "$PYTHON has no venv module (Debian package python3-venv)"
mirror=$(scripts/debian-mirror.sh) || exit 1
security=$( { sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
              sed -n 's/^deb[[:space:]]\+\([^[:space:]]\+\).*/\1/p' /etc/apt/sources.list 2>/dev/null
            } | grep -m1 '^http.*security' || true)

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
ROOTFS=$STAGE/rootfs

echo "image.sh: [1/4] Debian bookworm root filesystem with python3 from $mirror"
sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main")
[ -z "$security" ] || sources+=("deb $security bookworm-security main")
# libstdc++6: grpcio's extension links it. usrmerge (which pulls perl) satisfies init-system-helpers' dependency when apt chooses; the
# filesystem is merged already, so usr-is-merged is named and usrmerge with perl purged.
SOURCE_DATE_EPOCH=$EPOCH mmdebstrap --quiet --variant=essential --include=python3,libstdc++6,usr-is-merged \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook='chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl perl-modules-5.36 libperl5.36' \
  bookworm "$ROOTFS" "${sources[@]}" >"$STAGE/mmdebstrap.log" 2>&1 \
  || fail "mmdebstrap failed: $(tail -3 "$STAGE/mmdebstrap.log")"
image_python=$(chroot "$ROOTFS" /usr/bin/python3 -c 'import sys; print(sys.version.split()[0])')
host_python=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')
[ "${image_python%.*}" = "${host_python%.*}" ] \
  || fail "the image's python3 is $image_python, this machine's $host_python: build on the image's Debian release"

echo "image.sh: [2/4] koordlet and its dependencies from requirements.lock into $PREFIX"
"$PYTHON" -m venv "$STAGE/build"
PIP=("$STAGE/build/bin/python" -m pip -q --disable-pip-version-check)
"${PIP[@]}" install --no-deps --require-hashes --only-binary=:all: --no-compile --target "$ROOTFS$PREFIX" \
  -r requirements.lock
# The project's wheel from a clean copy (the wheel holds the koord package only: no test support).
mkdir -p "$STAGE/source"
cp -r pyproject.toml README.md LICENSE src "$STAGE/source/"
find "$STAGE/source" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
"${PIP[@]}" wheel --no-deps -w "$STAGE/wheel" "$STAGE/source"
"${PIP[@]}" install --no-deps --no-compile --target "$ROOTFS$PREFIX" "$STAGE"/wheel/koord_runtime-*.whl
# The kubernetes client's asyncio copy (kubernetes.aio, two thirds of its size) is imported by
# nothing here; the import check below holds the synchronous client koordlet uses.
# direct_url.json names the wheel's temp path; each RECORD then lists only the files kept (the
# console scripts' rows hold hashes of the build's temp paths), so two builds are the same image.
rm -rf "$ROOTFS$PREFIX/bin" "$ROOTFS$PREFIX/kubernetes/aio" "$ROOTFS$PREFIX"/*.dist-info/direct_url.json
"$PYTHON" - "$ROOTFS$PREFIX" <<'EOF'
import csv, io, pathlib, sys
site = pathlib.Path(sys.argv[1])
for record in site.glob("*.dist-info/RECORD"):
    rows = [row for row in csv.reader(io.StringIO(record.read_text())) if row and (site / row[0]).resolve().exists()]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    record.write_text(out.getvalue())
EOF
cat > "$ROOTFS/koordlet" <<EOF
#!/usr/bin/python3 -I
"""koordlet's entry point in its image: the project's packages are in $PREFIX."""
import sys

sys.path.append("$PREFIX")
from koord.koordlet.cli import main

sys.exit(main())
EOF
chmod 0755 "$ROOTFS/koordlet"

echo "image.sh: [3/4] byte-code, and what a node agent does not need removed"
# Byte-code checked by hash, never by time stamp: it stays valid whatever the layer's mtimes.
find "$ROOTFS/usr/lib/python3"* "$ROOTFS$PREFIX" -name __pycache__ -prune -exec rm -rf {} +
chroot "$ROOTFS" /usr/bin/python3 -m compileall -q -j 1 --invalidation-mode unchecked-hash \
  /usr/lib/python3.11 "$PREFIX" >/dev/null || fail "byte-compiling in the image failed"
chroot "$ROOTFS" /koordlet --version >/dev/null || fail "/koordlet --version does not run in the image"
# Every compiled extension koordlet loads, so a missing shared library fails the build, not a node.
chroot "$ROOTFS" /usr/bin/python3 -I -c "import sys; sys.path.append('$PREFIX'); import grpc._cython.cygrpc, \
  google.protobuf.internal.api_implementation, kubernetes.client, aiohttp, pydantic_core; \
  from yaml import CSafeLoader" || fail "a compiled extension does not load in the image"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/var/cache/debconf/*-old \
  "$ROOTFS"/var/log/* "$ROOTFS"/dev/* "$ROOTFS"/tmp/* "$ROOTFS"/etc/machine-id

echo "image.sh: [4/4] image archive"
mkdir -p "$OUTDIR"
PYTHONPATH=src "$PYTHON" -m koord_testing.ociarchive "$ROOTFS" "$OUTDIR/koordlet-image.tar" --ref "$REF" \
  --entrypoint /koordlet --env agent_mode=dsMode \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --epoch "$EPOCH"
echo "image.sh: built $OUTDIR/koordlet-image.tar ($(du -m "$OUTDIR/koordlet-image.tar" | cut -f1) MB," \
  "root filesystem $(du -sm "$ROOTFS" | cut -f1) MB) in $((SECONDS - START)) s"
