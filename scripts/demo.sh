#!/usr/bin/env bash
# The main job, locally: a private containerd, koordlet, koord-runtime-proxy, pods started
# through the proxy like kubelet would, and koordlet's effect read from the real cgroup files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
exec .venv/bin/python -m koord.demo
