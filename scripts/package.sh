#!/usr/bin/env bash
# Builds the node package: scripts/package.sh OUTDIR -> OUTDIR/koord-runtime_<version>_<arch>.deb
#
# The package holds a self-contained Python environment (the project, its dependencies and the
# kubernetes client) under /opt/koord-runtime on Debian's own python3, launchers in /usr/bin,
# both systemd units (installed, not enabled or started), and example koordlet input files in
# /etc/koordlet. Build it on the Debian release and architecture of the nodes: the environment
# is tied to that release's python3 minor version and to the architecture of its wheels.
# Runs as any user; needs python3-venv, dpkg-deb (Debian package dpkg) and pip's package index.
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
VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ARCH=$(dpkg --print-architecture)
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
"$ENV/bin/python" -m pip install -q --no-compile --no-warn-script-location "$SOURCE[kubernetes]"
"$ENV/bin/python" -m pip uninstall -q -y pip >/dev/null
rm -f "$ENV"/bin/activate* "$ENV"/bin/Activate.ps1 "$ENV"/bin/pip*
grep -rlI --null -F "$ENV" "$ENV" | xargs -0 -r sed -i "s#$ENV#$PREFIX#g"
# Byte-code compiled now, with the installed paths in it, so nothing is written under /opt at
# run time and dpkg knows every file it must remove.
# (ensurepip's own byte-code, written when the venv was made, names the staging tree: drop it;
# -f because the interpreter running compileall may have just written byte-code of its own
# start-up, e.g. setuptools' _distutils_hack, naming the staging tree too.)
find "$ENV" -name __pycache__ -prune -exec rm -rf {} +
PYTHONDONTWRITEBYTECODE=1 "$ENV/bin/python" -m compileall -f -q -j 0 -s "$ROOT" -p / "$ENV/lib" >/dev/null

install -d "$ROOT/usr/bin" "$ROOT/lib/systemd/system" "$ROOT/etc/koordlet" \
  "$ROOT/usr/share/$NAME/examples" "$ROOT/usr/share/doc/$NAME"
for binary in koord-runtime-proxy koordlet; do
  ln -s "$PREFIX/bin/$binary" "$ROOT/usr/bin/$binary"
done
install -m 0644 deploy/koord-runtime-proxy.service deploy/koordlet.service "$ROOT/lib/systemd/system/"
install -m 0644 examples/koordlet/node.yaml examples/koordlet/nodeslo.yaml "$ROOT/etc/koordlet/"
install -m 0644 examples/koordlet/*.yaml "$ROOT/usr/share/$NAME/examples/"
install -m 0644 LICENSE "$ROOT/usr/share/doc/$NAME/copyright"
install -m 0644 README.md "$ROOT/usr/share/doc/$NAME/README.md"

install -d "$ROOT/DEBIAN"
cat > "$ROOT/DEBIAN/control" <<EOF
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: ${DEBFULLNAME:-koord-runtime builder} <${DEBEMAIL:-root@localhost}>
Installed-Size: $(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
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
# koordlet rewrites the NodeMetric file's status, so it is not a conffile: the maintainer
# script puts the example in place once and leaves it alone afterwards.
printf '%s\n' /etc/koordlet/node.yaml /etc/koordlet/nodeslo.yaml > "$ROOT/DEBIAN/conffiles"
cat > "$ROOT/DEBIAN/postinst" <<EOF
#!/bin/sh
# Honours DPKG_ROOT, so the package also installs into a directory (dpkg --root).
set -e
if [ "\$1" = configure ] && [ ! -e "\$DPKG_ROOT/etc/koordlet/nodemetric.yaml" ]; then
  cp "\$DPKG_ROOT/usr/share/$NAME/examples/nodemetric.yaml" "\$DPKG_ROOT/etc/koordlet/nodemetric.yaml"
fi
if [ -z "\$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
exit 0
EOF
cat > "$ROOT/DEBIAN/postrm" <<EOF
#!/bin/sh
set -e
if [ "\$1" = purge ]; then
  rm -f "\$DPKG_ROOT/etc/koordlet/nodemetric.yaml"
  rmdir --ignore-fail-on-non-empty "\$DPKG_ROOT/etc/koordlet" 2>/dev/null || true
fi
if [ -z "\$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
exit 0
EOF
chmod 0755 "$ROOT/DEBIAN/postinst" "$ROOT/DEBIAN/postrm"

mkdir -p "$OUTDIR"
DEB=$OUTDIR/${NAME}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "package.sh: built $DEB ($(du -h "$DEB" | cut -f1))"
