#!/usr/bin/env bash
# Installs what the demo and the tests need on a fresh Debian machine (run as root):
# containerd + runc + haproxy (the pass-through data plane) + a static libc for the test image,
# docker.io (dockerd and the docker CLI for Docker mode's tests), and the project in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "install.sh: must run as root (containerd, runc and cgroup files need it)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "install.sh: apt-get and dpkg not found: the demo and the tests need a Debian 12 (or later) machine" >&2
  exit 1
fi

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
{ command -v dockerd >/dev/null && [ -x /usr/bin/docker ]; } || missing+=(docker.io)
command -v gcc >/dev/null || missing+=(gcc)
command -v haproxy >/dev/null || missing+=(haproxy)
# koordlet's image (scripts/image.sh) is a Debian root filesystem mmdebstrap makes.
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || missing+=(libc6-dev)
if [ -n "${V2_PACKAGES:-}" ]; then
  # The cgroup v2 lane (scripts/test-v2.sh): QEMU, a v2 kernel, and the static busybox virtme-ng boots with.
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  ls /boot/vmlinuz-* >/dev/null 2>&1 || missing+=(linux-image-amd64)
  [ -x /bin/busybox ] || missing+=(busybox-static)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install.sh: installing Debian packages: ${missing[*]}"
  # Another install may hold the dpkg lock: wait for it instead of failing.
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        -o DPkg::Lock::Timeout=120 "${missing[@]}" >/dev/null; then
      break
    fi
    [ "$attempt" = 10 ] && { echo "install.sh: apt-get install ${missing[*]} failed" >&2; exit 1; }
    sleep 20
  done
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "install.sh: Python >= 3.11 is required, $PYTHON is $("$PYTHON" --version 2>&1)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "install.sh: installing Debian package python3-venv"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The runtime dependencies at the versions and hashes the package ships (requirements.lock),
# then the project and its test tools.
.venv/bin/python -m pip install -q --require-hashes -r requirements.lock
if [ -n "${V2_PACKAGES:-}" ]; then
  .venv/bin/python -m pip install -q -e '.[test,v2lane]'
else
  .venv/bin/python -m pip install -q -e '.[test]'
fi
# Test support (src/koord_testing) is not part of the installed project: the tests, demos and
# benchmarks find it through this path entry of the development environment only.
.venv/bin/python - <<'PY'
import pathlib, site
pathlib.Path(site.getsitepackages()[0], "koord_testing.pth").write_text(str(pathlib.Path("src").resolve()) + "\n")
PY
echo "install.sh: ready ($(containerd --version | cut -d' ' -f1-3), $(runc --version | head -1), $(.venv/bin/python --version))"
