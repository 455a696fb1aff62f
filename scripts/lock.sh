#!/usr/bin/env bash
# Regenerates requirements.lock: the exact versions and sha256 hashes of the runtime
# dependencies and the kubernetes extra, for Python 3.11 (Debian 12's), which
# scripts/package.sh and scripts/install.sh install with --require-hashes.
# Run after changing [project] dependencies or the kubernetes extra in pyproject.toml;
# tests/unit/test_lock.py fails until then. Pins still allowed are kept; `scripts/lock.sh
# --upgrade` moves every pin to the newest allowed version (other arguments go to pip-compile
# too). Needs pip's package index (pip-tools is installed into a throwaway venv).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=$(mktemp -d)
trap 'rm -rf "$TOOLS"' EXIT
python3 -m venv "$TOOLS"
"$TOOLS/bin/python" -m pip install -q pip-tools
"$TOOLS/bin/pip-compile" -q --allow-unsafe --extra=kubernetes --generate-hashes --no-emit-find-links \
  --no-emit-index-url --output-file=requirements.lock --strip-extras "$@" pyproject.toml
echo "lock.sh: wrote requirements.lock ($(grep -c '^[a-zA-Z]' requirements.lock) distributions)"
