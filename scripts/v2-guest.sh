#!/usr/bin/env bash
# Runs inside the cgroup v2 guest of scripts/test-v2.sh (never on the host: it mounts over /tmp).
# Extra arguments replace the default pytest selection.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(stat -fc %T /sys/fs/cgroup)" != "cgroup2fs" ]; then
  echo "v2-guest.sh: /sys/fs/cgroup is not cgroup2: this script runs only inside the v2 guest" >&2
  exit 1
fi
# containerd's overlayfs snapshotter cannot stack on the guest's shared root: give it, and
# pytest's temp dirs, a tmpfs of the guest's own. A checkout under /tmp would be hidden by it:
# it is set aside on /mnt, then moved back to its path on the tmpfs.
checkout=$(pwd)
case "$checkout/" in
  /tmp/*)
    mount --bind "$checkout" /mnt
    mount -t tmpfs -o size=4G,mode=1777 tmpfs /tmp
    mkdir -p "$checkout"
    mount --move /mnt "$checkout"
    cd "$checkout"
    ;;
  *) mount -t tmpfs -o size=4G,mode=1777 tmpfs /tmp ;;
esac
# No systemd runs here: enable the controllers at the root as systemd does on a node
# (runc enables them further down for the cgroups it creates).
echo "+cpuset +cpu +io +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
# Emulation makes everything about 5x slower (more on a busy host): deadlines that bound hung
# tests stretch with it.
# A modern node is cgroup v2 with containerd 2.x: the tests here run on the 2.x only.
export KOORD_TEST_CONTAINERD=2
export KOORD_TEST_LANE=v2 KOORD_TEST_SLOWDOWN=8 HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
echo "v2-guest.sh: $(uname -r), $(stat -fc %T /sys/fs/cgroup), controllers: $(cat /sys/fs/cgroup/cgroup.subtree_control), $(nproc) cpus, containerd $(.cache/containerd2/usr/bin/containerd --version 2>&1 | cut -d' ' -f3)"

rc=0
if [ $# -gt 0 ]; then
  .venv/bin/python -m pytest -p no:cacheprovider --timeout=1500 -ra "$@" || rc=$?
else
  .venv/bin/python -m pytest -p no:cacheprovider --timeout=1500 -ra --durations=0 -m cgroup tests/e2e || rc=$?
fi
# The demo adds about 5 minutes under emulation; the tests above cover each of its steps.
if [ -n "${KOORD_V2_DEMO:-}" ]; then
  echo "v2-guest.sh: the demo on cgroup v2"
  .venv/bin/python -m koord_testing.demo || { echo "v2-guest.sh: the demo FAILED on cgroup v2" >&2; rc=1; }
fi
exit "$rc"
