"""The recipes: one file per training stage, read top to bottom like a paper's algorithm box.

- `sft.py`: supervised warm-up on whole episodes (`seekrl sft`).
- `mcts.py`: step labels by Monte-Carlo tree search or Monte-Carlo rollouts (`seekrl mcts`).
- `prm.py`: the process reward model, trained on those labels (`seekrl prm train`).
- `refine.py`: PRM-filtered rejection sampling or step-level DPO (`seekrl refine`).
- `train.py`: RL (`seekrl train`), the `Trainer`.

What they share: `setup.py` (seeding, trainable layers, LoRA, optimizer and schedule, the
metrics log), `checkpoint.py` (run folders, saving a policy, atomic swaps), `labels.py` (the
label format, writer and reader), `pipeline.py` (the small pipeline's settings that the
demo, `seekrl prorag` and the benchmarks start from). The algorithm pieces they call live
in `seekrl.rl`.
"""
