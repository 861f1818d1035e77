#!/bin/bash
# The learning issue's long runs as named in bench/RESULTS.md ("Process supervision", the
# 2026-12-02 entry), resumable: each run goes on from its last checkpoint, and what a fresh
# machine lacks (the world, the 200-step SFT start) is built first. In order: seed 0's two
# arms, the start on the test questions, then seeds 1 and 2.
#
#   git worktree add --detach /work/snap-long200w 14a1bd7      # the commit that named them
#   SNAP=/work/snap-long200w nohup bench/long_runs.sh /work/runs/probe32 > long200w.log 2>&1 &
#
# It runs with this checkout's venv (`make setup`; PYTHON= another); SNAP is the code the runs
# use (default: this checkout); SEEDS the seeds still to run (default "0 1 2": a machine that
# lost its runs but kept seed 0's records goes on with SEEDS="1 2"; the start's test evaluation
# runs with seed 0 only). Keep their records as they go:
#   .venv/bin/python bench/process_ablation.py --stage keep --work-dir WORK --runs-dir long200w --keep-to bench/records
set -euo pipefail
W=${1:-/work/runs/probe32}
S=${SNAP:-$(cd "$(dirname "$0")/.." && pwd)}
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}   # this checkout's venv
START=$W/sft-200-plan_weight=10-balance_types=hops/run/final
if [ ! -f "$START/config.json" ]; then   # the start: 200 plan-weighted, hop-balanced SFT steps
  PYTHONPATH=$S/src $PY "$S/bench/sft_curve.py" --work-dir "$W" --budgets 200 --on dev --n-test 100 \
    --set plan_weight=10 --set balance_types=hops
fi
run() {
  PYTHONPATH=$S/src $PY "$S/bench/process_ablation.py" --work-dir "$W" --sft "$START" \
    --rl-world-seed 1 --set rollout.temperature=1.0 --dtype float32 --n-test 200 --n-dev 100 --stage rl \
    --steps 50 --eval-every 5 --take best --set algo.mini_batch_size=8 --set algo.old_logprobs=rollout \
    --set optim.lr=3e-5 --set algo.kl_coef=0.1 --methods recall_cost,outcome --budget-by recall_cost \
    --runs-dir long200w "$@"
}
for seed in ${SEEDS:-0 1 2}; do
  if [ "$seed" = 0 ]; then run --seeds 0; else run --seeds "$seed" --skip-sft-eval; fi
done
