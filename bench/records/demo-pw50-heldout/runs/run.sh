#!/bin/bash
# the demo with the 50-step plan-weighted warm-up, three seeds, on snapshot 3901fd6; then the held-out evaluations
cd /work/snap-pw50
export PYTHONPATH=/work/snap-pw50/src
# two threads whatever the load at start (a test running then had given s1 one)
export OMP_NUM_THREADS=2
for s in 0 1 2; do
  if [ -f /work/runs/demo-pw50/s$s/done ]; then continue; fi
  rm -rf /work/runs/demo-pw50/s$s
  /usr/bin/time -v /work/main/.venv/bin/seekrl demo --presets /work/runs/demo-pw50/presets --out /work/runs/demo-pw50/s$s --seed $s > /work/runs/demo-pw50/s$s.log 2>&1 && touch /work/runs/demo-pw50/s$s/done
done
/work/main/.venv/bin/python bench/demo_heldout.py /work/runs/demo-pw50/s0 /work/runs/demo-pw50/s1 /work/runs/demo-pw50/s2 --n 200 --records /work/runs/demo-pw50/records > /work/runs/demo-pw50/heldout.log 2>&1
echo finished > /work/runs/demo-pw50/all_done
