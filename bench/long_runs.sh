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
# runs with seed 0 only; a seed whose recall_cost run is kept in bench/records/long200w but
# missing from WORK runs its outcome arm alone, at that run's budget). Keep their records:
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
KEPT=$(cd "$(dirname "$0")" && pwd)/records/long200w   # the runs already kept in git
for seed in ${SEEDS:-0 1 2}; do
  extra=(); [ "$seed" = 0 ] || extra=(--skip-sft-eval)
  kept=$KEPT/recall_cost-s$seed/result.json
  if [ ! -f "$W/long200w/recall_cost-s$seed/result.json" ] && [ -f "$kept" ]; then
    # a machine that lost this seed's finished recall_cost run but kept its records: the
    # outcome arm alone, at the budget that run set (its rollout tokens), not both again
    budget=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["rollout_tokens"])' "$kept")
    run --seeds "$seed" "${extra[@]}" --methods outcome --budget "$budget"
  else
    run --seeds "$seed" "${extra[@]}"
  fi
done
