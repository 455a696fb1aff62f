#!/usr/bin/env bash
# Docker mode, locally: a private dockerd, koord-runtime-proxy in Docker mode, koordlet's hooks,
# and cri-dockerd (kubelet's side) pointed at the proxy; what koordlet did shown in docker inspect
# and the cgroup files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
exec .venv/bin/python -m koord_testing.demo_docker
