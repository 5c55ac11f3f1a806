#!/usr/bin/env bash
# The main job on the embedded defaults: set up, start the local stack serving the student (a small model the
# project initialises itself, with the embedded model's tokenizer), run the quick start on a small real
# repository with a failing test (pytest fails, a patch fixes it, pytest passes), then run the untrained student
# on the bundled ToyRepair tasks (k = 2 samples each), store every rollout in the experience service, print the
# SWE-bench-style report, and read the run back from the experience service into the same report. Then the
# student learns: distillation from an expert, RL, and best-of-N with a value model (`orchard learn`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

log=$(mktemp -t orchard-up.XXXXXX.log)
port=${ORCHARD_ENV_PORT:-50051}
nats_port=${ORCHARD_NATS_PORT:-4222}
.venv/bin/orchard up --model student --env-port "$port" --nats-port "$nats_port" >"$log" 2>&1 &
stack=$!
trap 'kill -TERM $stack 2>/dev/null; wait $stack 2>/dev/null || true' EXIT
# Up to 10 minutes: the first start converts the embedded model (about 25 s, longer on a busy machine) for its
# tokenizer and initialises the student from it.
for _ in $(seq 1 3000); do
  grep -q "stack is ready" "$log" && break
  if ! kill -0 $stack 2>/dev/null; then cat "$log" >&2; echo "main: orchard up failed" >&2; exit 1; fi
  sleep 0.2
done
grep -q "stack is ready" "$log" || { cat "$log" >&2; echo "main: the stack did not start" >&2; exit 1; }
ORCHARD_ENV_ADDRESS="127.0.0.1:$port" .venv/bin/python examples/quickstart.py

# 8 tasks x 2 samples with small budgets: the untrained student resolves none, but every rollout is graded,
# published, stored and counted in the report.
run="main-$(date +%s)"
.venv/bin/orchard rollout --tasks toyrepair -n 2 --max-steps 2 --max-step-tokens 64 --concurrency 16 \
  --env-address "127.0.0.1:$port" --nats-url "nats://127.0.0.1:$nats_port" --run-id "$run" --out .state/runs
echo "main: run $run as stored in the experience service:"
.venv/bin/orchard eval --run "$run" --tasks toyrepair

# The learning pipeline (`orchard learn`, docs/main-job.md): the last 2 tasks held out; an expert's trajectories
# on the other 6 distilled into the student by SFT, then RL (GRPO on the tests' verdict) through real sandboxes,
# then a value model trained on the stored history reranks the final samples; pass@1 of 4 samples per task at
# every stage, on the training and the held-out tasks, ends in one table, a JSON file and a PNG.
.venv/bin/orchard learn --tasks toyrepair --held-out 2 --run-id "$run-learn" --out .state/runs \
  --env-address "127.0.0.1:$port" --nats-url "nats://127.0.0.1:$nats_port"
