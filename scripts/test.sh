#!/usr/bin/env bash
# The whole test suite: set up (same install as the main job), then unit, integration and e2e tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Two workers (pytest-xdist), a module to one worker so module fixtures (servers, models) start once. (Starting the
# main job first, --no-loadscope-reorder, was no faster: 17.6 min, against 16.9 and 19.4 in xdist's default order.)
exec .venv/bin/python -m pytest tests -p no:cacheprovider -q --durations=25 -n "${ORCHARD_TEST_WORKERS:-2}" --dist loadscope "$@"
