#!/usr/bin/env bash
# The test command: installs everything, checks style and types (ruff, mypy: a finding fails
# the run), runs unit and end-to-end tests against private, real containerds on this
# machine's cgroup hierarchy (the native lane: every e2e test that starts containerd runs on
# the system's 1.6 and on the 2.x scripts/containerd2.sh unpacks), then the end-to-end tests
# that touch cgroups again in a QEMU guest booted with a cgroup v2 kernel, on containerd 2.x
# (the v2 lane, scripts/test-v2.sh).
# Extra arguments go to the native lane's pytest (e.g. tests/unit -k merge) and skip the v2 lane.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  V2_PACKAGES=1 scripts/install.sh
else
  scripts/install.sh
fi
# The e2e tests run against Debian 12's containerd and a 2.x beside it (KOORD_TEST_CONTAINERD).
scripts/containerd2.sh
.venv/bin/ruff check src tests bench examples
.venv/bin/mypy

# The v2 lane's guest is emulated and mostly waits on itself: it runs beside the native lane
# (its output is kept and shown once it ends) so the two take about as long as the slower one.
v2_log=""
v2_pid=""
if [ $# -eq 0 ]; then
  v2_log=$(mktemp /tmp/koord-v2-lane.XXXXXX)
  KOORD_V2_INSTALLED=1 scripts/test-v2.sh >"$v2_log" 2>&1 &
  v2_pid=$!
  trap 'kill -- "$v2_pid" 2>/dev/null; pkill -f "qemu-system.*path=$(pwd)" 2>/dev/null || true' EXIT
  echo "test.sh: cgroup v2 lane started in the background (pid $v2_pid, output shown when it ends)"
fi

native=0
.venv/bin/python -m pytest -ra "$@" || native=$?

# crictl and cri-dockerd are built from upstream source, not installed by install.sh: the tests
# that need them fail naming the file; this line says it once, with the way out.
missing_binaries() {
  local missing
  missing=$(.venv/bin/python -c 'from koord_testing.sharedbin import missing_shared_binaries as m
print(" ".join(m("crictl", "cri-dockerd")))')
  if [ -n "$missing" ]; then
    echo "test.sh: cannot run Docker mode's tests (tests/e2e/test_docker.py) nor crictl's lifecycle test" \
      "(tests/e2e/test_transparency.py): missing $missing; build crictl (cri-tools v1.26.1) and cri-dockerd" \
      "(Mirantis v0.3.7) from upstream source and put them in shared/bin beside the checkout or in \$KOORD_SHARED_BIN" \
      "(docs/testing.md)" >&2
  fi
}

if [ $# -gt 0 ]; then
  missing_binaries
  echo "test.sh: native lane only (arguments given); scripts/test-v2.sh runs the cgroup v2 lane"
  exit "$native"
fi

v2=0
echo "test.sh: native lane done (exit $native); waiting for the cgroup v2 lane"
wait "$v2_pid" || v2=$?
trap - EXIT
echo "=================== cgroup v2 lane (scripts/test-v2.sh) ==================="
cat "$v2_log"
rm -f "$v2_log"
missing_binaries
echo "test.sh: native lane (cgroup v$(if [ -e /sys/fs/cgroup/cgroup.controllers ]; then echo 2; else echo 1; fi)) exit $native; cgroup v2 lane exit $v2"
if [ "$native" != 0 ] || [ "$v2" != 0 ]; then
  exit 1
fi
