#!/usr/bin/env bash
# The main job, locally: a private containerd, koordlet, koord-runtime-proxy, pods started
# through the proxy like kubelet would, and koordlet's effect read from the real cgroup files;
# then the same pods on containerd 2.x through NRI, with no proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
# The NRI act needs a containerd 2.x; without one the demo says so and shows the rest.
scripts/containerd2.sh || echo "demo.sh: no containerd 2.x (see above): the NRI act will say so"
exec .venv/bin/python -m koord_testing.demo
