#!/bin/bash
# The learning issue's long runs on the demo's world (runs folder `longdemo`), as named in
# bench/RESULTS.md ("The demo"), resumable: each run goes on from its last checkpoint and a
# finished one is skipped; what a fresh machine lacks (the world of seed 0 and the demo's
# 50-step plan-weighted warm-up) the bench builds first. In order: seed 0's two arms and the
# start on the test questions, then seeds 1 and 2. One heavy job at a time on two cores.
#
#   git worktree add --detach /work/snap-longdemo COMMIT      # the commit that named them
#   SNAP=/work/snap-longdemo nohup bench/long_runs_demo.sh /work/runs/dev13 > longdemo.log 2>&1 &
#
# It runs with this checkout's venv (`make setup`; PYTHON= another); SNAP is the code the runs
# use (default: this checkout); SEEDS the seeds still to run (default "0 1 2": a machine that
# lost its runs but kept seed 0's records goes on with SEEDS="1 2"; the start's test
# evaluation runs with seed 0 only; a seed whose hops run is kept in bench/records/longdemo
# but missing from WORK runs its outcome arm alone, at that run's budget). The report and
# the records:
#   .venv/bin/python bench/process_ablation.py --stage report --work-dir WORK --runs-dir longdemo --named hops
#   .venv/bin/python bench/process_ablation.py --stage keep --work-dir WORK --runs-dir longdemo --keep-to bench/records
#   .venv/bin/python bench/pack_run.py WORK/longdemo/hops-s0 WORK/longdemo/hops-s0/eval/start bench/records/longdemo/hops-s0.tar.gz
#   .venv/bin/python bench/fold_episodes.py bench/records/longdemo
# (pack_run: each run with its training steps' episodes, for bench/probe_records.py;
# fold_episodes: the probes' episodes that keep wrote, into one small archive)
set -euo pipefail
W=${1:-/work/runs/dev13}
S=${SNAP:-$(cd "$(dirname "$0")/.." && pwd)}
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}   # this checkout's venv
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
run() {
  PYTHONPATH=$S/src $PY "$S/bench/process_ablation.py" --work-dir "$W" --dtype bf16-mixed \
    --n-test 200 --steps 50 --eval-every 10 --take best --baseline grpo \
    --set algo.mini_batch_size=8 --set algo.old_logprobs=rollout --set log.save_rollouts=1 \
    --budget-by hops --named hops --runs-dir longdemo "$@"
}
KEPT=$(cd "$(dirname "$0")" && pwd)/records/longdemo   # the runs already kept in git
for seed in ${SEEDS:-0 1 2}; do
  extra=(); [ "$seed" = 0 ] || extra=(--skip-sft-eval)
  kept=$KEPT/hops-s$seed/result.json
  if [ ! -f "$W/longdemo/hops-s$seed/result.json" ] && [ -f "$kept" ]; then
    # a machine that lost this seed's finished hops run but kept its records: the outcome
    # arm alone, at the budget that run set (its rollout tokens), not both again
    budget=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["rollout_tokens"])' "$kept")
    run --seeds "$seed" "${extra[@]}" --methods outcome --budget "$budget"
  else
    # the process arm (the hop-count bonus with the KL anchor at 1.0) makes its 50 steps
    # first and sets the seed's budget of rollout tokens; the outcome reward alone spends
    # the same
    run --seeds "$seed" "${extra[@]}" --methods hops,outcome --set-for hops:algo.kl_coef=1.0
  fi
done
