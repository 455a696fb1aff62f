#!/usr/bin/env bash
# The test command: installs everything, then runs unit and end-to-end tests against a
# private, real containerd.  Extra arguments go to pytest (e.g. tests/unit -k merge).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
exec .venv/bin/python -m pytest -ra "$@"
