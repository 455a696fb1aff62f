#!/usr/bin/env bash
# The test command: installs everything, checks style and types (ruff, mypy: a finding fails
# the run), then runs unit and end-to-end tests against a private, real containerd.
# Extra arguments go to pytest (e.g. tests/unit -k merge).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
.venv/bin/ruff check src tests bench examples
.venv/bin/mypy
status=0
.venv/bin/python -m pytest -ra "$@" || status=$?
# crictl and cri-dockerd are built from upstream source, not installed by install.sh: the tests
# that need them fail naming the file; this last line says it once, with the way out.
missing=$(.venv/bin/python -c 'from koord.testing.sharedbin import missing_shared_binaries as m
print(" ".join(m("crictl", "cri-dockerd")))')
if [ -n "$missing" ]; then
  echo "test.sh: cannot run Docker mode's tests (tests/e2e/test_docker.py) nor crictl's lifecycle test" \
    "(tests/e2e/test_transparency.py): missing $missing; build crictl (cri-tools v1.26.1) and cri-dockerd" \
    "(Mirantis v0.3.7) from upstream source and put them in shared/bin beside the checkout or in \$KOORD_SHARED_BIN" \
    "(docs/testing.md)" >&2
fi
exit "$status"
