#!/usr/bin/env bash
# Builds the node package: scripts/package.sh OUTDIR -> OUTDIR/koord-runtime_<version>_<arch>.deb
#
# The package holds a self-contained Python environment (the project, its dependencies and the
# kubernetes client) under /opt/koord-runtime on Debian's own python3, launchers in /usr/bin,
# both systemd units (installed, not enabled or started), and example koordlet input files in
# /etc/koordlet. Build it on the Debian release and architecture of the nodes: the environment
# is tied to that release's python3 minor version and to the architecture of its wheels.
# Runs as any user; needs python3-venv, dpkg-deb (Debian package dpkg) and pip's package index.
# The dependencies are the exact versions and hashes of requirements.lock and the byte-code
# carries no timestamp, so two builds of the same sources ship the same files; every file and
# archive member carries the time of the sources (SOURCE_DATE_EPOCH, by default the last
# commit's), so two builds of the same sources and version are the same bytes.
# KOORD_PACKAGE_VERSION=V builds version V instead of pyproject's (a changelog entry says so):
# a second build to test an upgrade with.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 1 ]; then
  echo "usage: scripts/package.sh OUTDIR" >&2
  exit 2
fi
OUTDIR=$1
PREFIX=/opt/koord-runtime
# Debian's interpreter, not whatever python3 comes first on PATH: the environment must run
# on a node that has only the Debian package python3.
PYTHON=/usr/bin/python3

for tool in dpkg-deb dpkg "$PYTHON"; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing (Debian packages dpkg, python3)" >&2; exit 1; }
done
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null \
  || { echo "package.sh: $PYTHON has no venv module (Debian package python3-venv)" >&2; exit 1; }

NAME=koord-runtime
VERSION=${KOORD_PACKAGE_VERSION:-$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')}
dpkg --validate-version "$VERSION" || { echo "package.sh: $VERSION is not a Debian version" >&2; exit 1; }
ARCH=$(dpkg --print-architecture)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || stat -c %Y pyproject.toml)}
export SOURCE_DATE_EPOCH
PYVER=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYNEXT=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1] + 1}")')

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
ROOT=$STAGE/root
ENV=$ROOT$PREFIX

# A venv is not relocatable: its scripts name their interpreter by absolute path. Build it in
# the staging tree, then rewrite the staging prefix to the installed one.
"$PYTHON" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q --no-compile --upgrade pip >/dev/null
# From a clean copy of the sources: a build/ left in the checkout by an earlier build would
# put stale modules into the package.
SOURCE=$STAGE/source
mkdir -p "$SOURCE"
cp -r pyproject.toml README.md LICENSE src "$SOURCE/"
find "$SOURCE" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
"$ENV/bin/python" -m pip install -q --no-compile --no-warn-script-location --require-hashes -r requirements.lock
# The project as a wheel installed by name from a local index: installed from a path, pip
# would record the staging path (direct_url.json) and two builds would differ.
"$ENV/bin/python" -m pip wheel -q --no-deps --wheel-dir "$STAGE/wheel" "$SOURCE"
"$ENV/bin/python" -m pip install -q --no-compile --no-warn-script-location --no-deps --no-index \
  --find-links "$STAGE/wheel" koord-runtime
# The lock must satisfy what pyproject asks for: pip check names any requirement it does not.
"$ENV/bin/python" -m pip check >&2 || { echo "package.sh: requirements.lock does not satisfy pyproject.toml" >&2; exit 1; }
# pip and setuptools came with the venv, from the build machine's python3, not from the lock;
# nothing imports them at run time.
"$ENV/bin/python" -m pip uninstall -q -y pip setuptools >/dev/null
rm -f "$ENV"/bin/activate* "$ENV"/bin/Activate.ps1 "$ENV"/bin/pip*
grep -rlI --null -F "$ENV" "$ENV" | xargs -0 -r sed -i "s#$ENV#$PREFIX#g"
# The rewritten launchers' hashes in their distribution's RECORD, recomputed: they would name
# the staging path's bytes, and differ between two builds.
"$ENV/bin/python" -I -B - "$ENV" <<'PY'
import base64, csv, hashlib, io, pathlib, sys
for record in pathlib.Path(sys.argv[1]).glob("lib/python*/site-packages/*.dist-info/RECORD"):
    site = record.parent.parent
    rows = list(csv.reader(io.StringIO(record.read_text())))
    for row in rows:
        if row[0].startswith("../") and row[1]:
            data = (site / row[0]).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            row[1:3] = [f"sha256={digest}", str(len(data))]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    record.write_text(out.getvalue())
PY
# Byte-code compiled now, with the installed paths in it, so nothing is written under /opt at
# run time and dpkg knows every file it must remove.
# (ensurepip's own byte-code, written when the venv was made, names the staging tree: drop it;
# -f because the interpreter running compileall may have just written byte-code of its own
# start-up, e.g. setuptools' _distutils_hack, naming the staging tree too.)
find "$ENV" -name __pycache__ -prune -exec rm -rf {} +
# unchecked-hash: no source timestamp in the byte-code, so two builds of the same sources ship
# the same files, and the interpreter never re-validates files only dpkg changes.
PYTHONDONTWRITEBYTECODE=1 "$ENV/bin/python" -m compileall -f -q -j 0 -s "$ROOT" -p / \
  --invalidation-mode unchecked-hash "$ENV/lib" >/dev/null

install -d "$ROOT/usr/bin" "$ROOT/lib/systemd/system" "$ROOT/etc/koordlet" "$ROOT/etc/default" \
  "$ROOT/usr/share/$NAME/examples" "$ROOT/usr/share/doc/$NAME"
for binary in koord-runtime-proxy koordlet; do
  ln -s "$PREFIX/bin/$binary" "$ROOT/usr/bin/$binary"
done
install -m 0644 deploy/koord-runtime-proxy.service deploy/koordlet.service "$ROOT/lib/systemd/system/"
install -m 0644 examples/koordlet/node.yaml examples/koordlet/nodeslo.yaml "$ROOT/etc/koordlet/"
install -m 0644 examples/koordlet/*.yaml "$ROOT/usr/share/$NAME/examples/"
install -m 0644 deploy/debian/koordlet.default "$ROOT/etc/default/koordlet"
install -m 0644 README.md "$ROOT/usr/share/doc/$NAME/README.md"
# One DEP-5 stanza per distribution in the environment, licences from their metadata; the
# build stops naming any distribution whose licence cannot be found.
"$ENV/bin/python" -I -B -m koord.debian.copyright --prefix "$PREFIX" > "$ROOT/usr/share/doc/$NAME/copyright"
chmod 0644 "$ROOT/usr/share/doc/$NAME/copyright"
# A native package's changelog, with an entry for an overridden version on top.
CHANGELOG=$STAGE/changelog
if [ "$(sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' deploy/debian/changelog)" != "$VERSION" ]; then
  printf '%s\n\n%s\n\n%s\n\n' "$NAME ($VERSION) UNRELEASED; urgency=medium" \
    "  * Built with KOORD_PACKAGE_VERSION=$VERSION from the sources of $(sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' deploy/debian/changelog)." \
    " -- ${DEBFULLNAME:-koord-runtime builder} <${DEBEMAIL:-root@localhost}>  $(date -R -d "@$SOURCE_DATE_EPOCH")" > "$CHANGELOG"
fi
cat deploy/debian/changelog >> "$CHANGELOG"
gzip -9n < "$CHANGELOG" > "$ROOT/usr/share/doc/$NAME/changelog.gz"

install -d "$ROOT/DEBIAN"
cat > "$ROOT/DEBIAN/control" <<EOF
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: ${DEBFULLNAME:-koord-runtime builder} <${DEBEMAIL:-root@localhost}>
Installed-Size: $(find "$ROOT" -path "$ROOT/DEBIAN" -prune -o -printf '%y %s\n' \
  | awk '$1 == "f" { kib += int(($2 + 1023) / 1024); next } { kib += 1 } END { print kib }')
Depends: python3 (>= $PYVER), python3 (<< $PYNEXT), haproxy, util-linux
Recommends: containerd (>= 1.6~) | containerd.io (>= 1.6~) | docker.io
Breaks: containerd (<< 1.6~), containerd (>= 3~)
Section: admin
Priority: optional
Homepage: https://koordinator.sh
Description: koord-runtime-proxy and koordlet, in Python
 koord-runtime-proxy sits between kubelet and containerd (or dockerd) and calls
 runtime plugins around pod and container lifecycle calls; HAProxy carries the
 pass-through calls. koordlet is Koordinator's node agent: runtime hooks that set
 cgroups by QoS class, usage collection, NodeMetric reports, and suppression or
 eviction of best-effort pods. Both units are installed, not enabled.
EOF
# /etc/default/koordlet and the example inputs are the administrator's to edit: conffiles,
# kept on upgrade and removal. koordlet rewrites the NodeMetric file's status, so it is not a
# conffile: the postinst puts the example in place once and the postrm removes it on purge.
printf '%s\n' /etc/default/koordlet /etc/koordlet/node.yaml /etc/koordlet/nodeslo.yaml > "$ROOT/DEBIAN/conffiles"
install -m 0755 deploy/debian/postinst deploy/debian/prerm deploy/debian/postrm "$ROOT/DEBIAN/"
# md5sums of every shipped file but the conffiles (dpkg keeps their sums itself), for dpkg --verify.
(cd "$ROOT" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z \
  | grep -zvxF -f <(sed 's#^/##' DEBIAN/conffiles) | xargs -0 md5sum) > "$ROOT/DEBIAN/md5sums"
chmod 0644 "$ROOT/DEBIAN/md5sums"

find "$ROOT" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$OUTDIR"
DEB=$OUTDIR/${NAME}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "package.sh: built $DEB ($(du -h "$DEB" | cut -f1))"
