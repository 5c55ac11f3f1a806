#!/usr/bin/env bash
# The whole test suite: set up (same install as the main job), then unit, integration and e2e tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ORCHARD_LLAMA_CPP=1 bash scripts/install.sh  # with llama.cpp, whose engine the suite tests (a compile, once a machine)
# Three workers (pytest-xdist) on 2 cores, a module to one worker so module fixtures (servers, models) start once:
# the tests wait on subprocesses, servers and sandboxes for much of their time (two workers kept the cores 60% busy),
# and three finished a clean-clone run in 20.9 min against 27.6 with two, the same day and machine.
# (Starting the main job first, --no-loadscope-reorder, was no faster: 17.6 min, against 16.9 and 19.4 in xdist's
# default order.)
# A test writes under its tmp_path, never into the checkout: what the run adds or changes there fails it.
checkout() { git status --porcelain --untracked-files=all 2>/dev/null | sort || true; }
before=$(checkout)
rc=0
.venv/bin/python -m pytest tests -p no:cacheprovider -q --durations=25 -n "${ORCHARD_TEST_WORKERS:-3}" --dist loadscope \
  "$@" || rc=$?
left=$(comm -13 <(echo "$before") <(checkout))
if [[ -n "$left" ]]; then
  echo "test.sh: the tests left these in the checkout (write them under tmp_path, or ignore them in .gitignore):" >&2
  echo "$left" >&2
  ((rc)) || rc=1
fi
exit "$rc"
