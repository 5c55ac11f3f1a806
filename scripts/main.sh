#!/usr/bin/env bash
# The main job on the embedded defaults: set up, start the local stack, run the quick start on a small
# real repository with a failing test (pytest fails, a patch fixes it, pytest passes), then run the embedded
# model on the bundled ToyRepair tasks (k = 2 samples each), store every rollout in the experience service,
# print the SWE-bench-style report, and read the run back from the experience service into the same report.
# Then one short SFT round on those stored rollouts (the trainer service), the new weights pushed to the
# inference service, the same rollouts again on them, and the report of both runs before/after. Last, the
# best-of-N rerank: a value model trained on history from three reference policies of different quality (on 6
# tasks), served by the value service, picks among 8 fresh candidates of the 2 held-out tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

log=$(mktemp -t orchard-up.XXXXXX.log)
port=${ORCHARD_ENV_PORT:-50051}
nats_port=${ORCHARD_NATS_PORT:-4222}
.venv/bin/orchard up --env-port "$port" --nats-port "$nats_port" >"$log" 2>&1 &
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

# 8 tasks x 2 samples with budgets small enough for a laptop CPU (about 2 minutes on 2 cores): the small
# embedded model resolves none, but every rollout is graded, published, stored and counted in the report.
run="main-$(date +%s)"
.venv/bin/orchard rollout --tasks toyrepair -n 2 --max-steps 2 --max-step-tokens 64 --concurrency 16 \
  --env-address "127.0.0.1:$port" --nats-url "nats://127.0.0.1:$nats_port" --run-id "$run" --out .state/runs
echo "main: run $run as stored in the experience service:"
.venv/bin/orchard eval --run "$run" --tasks toyrepair

# One short SFT step on the stored rollouts (4 of them, their last 512 tokens: a minute or two on 2 cores for
# the 135M model), its checkpoint pushed to the inference service, which then serves the trained weights.
.venv/bin/orchard train --run "$run" --epochs 1 --max-steps 1 --batch 4 --max-seq-len 512 --lr 1e-5 --push
# The same rollouts on the trained weights, and both runs side by side.
.venv/bin/orchard rollout --tasks toyrepair -n 2 --max-steps 2 --max-step-tokens 64 --concurrency 16 \
  --env-address "127.0.0.1:$port" --nats-url "nats://127.0.0.1:$nats_port" --run-id "$run-after" --out .state/runs
echo "main: run $run-after (trained weights) against run $run:"
.venv/bin/orchard eval --run "$run-after" --tasks toyrepair --compare "$run"

# History for the value model: three synthetic reference policies (each rollout submits the gold patch with
# probability Q, else a flawed one; real sandboxes, real grading) on 6 of the 8 tasks, 4 samples each. The small
# embedded model resolves nothing, so it cannot provide the resolved examples a value model needs.
mapfile -t tasks < <(.venv/bin/python -c "from orchard.tasks import load_instances
print('\n'.join(i.instance_id for i in load_instances('toyrepair')))")
held_out=("${tasks[@]: -2}")
history=()
for q in 2 5 8; do
  .venv/bin/orchard rollout --tasks toyrepair --ids "${tasks[@]:0:6}" --policy "reference:0.$q" -n 4 --seed 1 \
    --concurrency 8 --env-address "127.0.0.1:$port" --nats-url "nats://127.0.0.1:$nats_port" \
    --run-id "$run-ref-q$q" --out .state/runs >/dev/null
  history+=(--run "$run-ref-q$q")
done
echo "main: history runs ${history[*]} (reference policies, 6 tasks x 4 samples each) stored"
# The value job (all-MiniLM-L6-v2 with a scalar head, BCE + within-task pairwise loss; 20 steps of 8 candidates)
# on that history, refused if it held a held-out task (decontamination); its checkpoint loaded into the value
# service.
printf '%s\n' "${held_out[@]}" >.state/runs/"$run"-held-out.txt
.venv/bin/orchard train --kind value "${history[@]}" --eval-tasks "$PWD/.state/runs/$run-held-out.txt" \
  --max-steps 20 --batch 8 --push
# Best-of-8 on the held-out tasks: 8 candidates each from a middling reference policy, reranked, the picks graded.
.venv/bin/orchard eval --best-of 8 --tasks toyrepair --ids "${held_out[@]}" --policy reference:0.4 --seed 2 \
  --concurrency 8 --env-address "127.0.0.1:$port" --nats-url "nats://127.0.0.1:$nats_port" \
  --run-id "$run-best-of-8" --out .state/runs
