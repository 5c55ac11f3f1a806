#!/usr/bin/env bash
# The main job on the embedded defaults: set up, start the local stack, run the quick start on a small
# real repository with a failing test (pytest fails, a patch fixes it, pytest passes), stop the stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

log=$(mktemp -t orchard-up.XXXXXX.log)
port=${ORCHARD_ENV_PORT:-50051}
.venv/bin/orchard up --env-port "$port" --nats-port "${ORCHARD_NATS_PORT:-4222}" >"$log" 2>&1 &
stack=$!
trap 'kill -TERM $stack 2>/dev/null; wait $stack 2>/dev/null || true' EXIT
# Up to 10 minutes: the first start converts the embedded model (about 25 s, longer on a busy machine).
for _ in $(seq 1 3000); do
  grep -q "stack is ready" "$log" && break
  if ! kill -0 $stack 2>/dev/null; then cat "$log" >&2; echo "main: orchard up failed" >&2; exit 1; fi
  sleep 0.2
done
grep -q "stack is ready" "$log" || { cat "$log" >&2; echo "main: the stack did not start" >&2; exit 1; }
ORCHARD_ENV_ADDRESS="127.0.0.1:$port" .venv/bin/python examples/quickstart.py
