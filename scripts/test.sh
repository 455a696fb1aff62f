#!/usr/bin/env bash
# The test command: installs everything, checks style and types (ruff, mypy: a finding fails
# the run), then runs unit and end-to-end tests against a private, real containerd.
# Extra arguments go to pytest (e.g. tests/unit -k merge).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
.venv/bin/ruff check src tests bench examples
.venv/bin/mypy
exec .venv/bin/python -m pytest -ra "$@"
