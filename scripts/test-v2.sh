#!/usr/bin/env bash
# The cgroup v2 lane: boots this machine's own filesystem under a cgroup v2 kernel in a QEMU
# guest (virtme-ng) and runs there every end-to-end test marked `cgroup` and the demo, with
# real containerd (the 2.x of scripts/containerd2.sh: a modern node's), runc and HAProxy on a
# real v2 hierarchy. Extra arguments replace the
# default pytest selection (e.g. tests/e2e/test_koordlet.py -k lsr); KOORD_V2_DEMO=1 runs the
# demo in the guest after the tests.
#
# The guest sees the host read-only except this checkout; scripts/v2-guest.sh sets it up
# (tmpfs for containerd and pytest, controllers enabled as systemd would) and its exit code
# is this script's. Emulated (TCG): a KVM guest hangs at boot on these machines.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)

# scripts/test.sh installs first and runs this beside the native lane: no second pip run then.
if [ -z "${KOORD_V2_INSTALLED:-}" ]; then
  V2_PACKAGES=1 scripts/install.sh >/dev/null
  scripts/containerd2.sh >/dev/null
fi
kernel=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$kernel" ]; then
  echo "test-v2.sh: no kernel in /boot (Debian package linux-image-amd64); cannot run the cgroup v2 lane" >&2
  exit 1
fi

# vng needs virtme-run from the same environment on PATH.
export PATH="$checkout/.venv/bin:$PATH"
memory=${KOORD_V2_MEMORY:-6G}
deadline=${KOORD_V2_TIMEOUT:-2700}
echo "test-v2.sh: booting $(basename "$kernel") (cgroup v2, TCG, 2 cpus, $memory), deadline ${deadline}s"
# The guest does not inherit this environment: pass on what v2-guest.sh reads.
guest_command="KOORD_V2_DEMO=${KOORD_V2_DEMO:-} scripts/v2-guest.sh"
if [ $# -gt 0 ]; then
  guest_command+=" $(printf '%q ' "$@")"
fi
start=$(date +%s)
set +e
timeout --kill-after=30 "$deadline" \
  vng --run "$kernel" --disable-kvm --cpus 2 --memory "$memory" \
      --rwdir "$checkout" --cwd "$checkout" --exec "$guest_command" </dev/null 2>&1 | cat
# Through a pipe: QEMU reopens a regular file given as its output and truncates it.
rc=${PIPESTATUS[0]}
set -e
echo "test-v2.sh: cgroup v2 lane finished in $(( $(date +%s) - start ))s with exit code $rc"
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "test-v2.sh: the guest did not finish within ${deadline}s (KOORD_V2_TIMEOUT)" >&2
fi
exit "$rc"
