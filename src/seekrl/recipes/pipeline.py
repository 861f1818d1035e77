"""The small pipeline's settings, shared by `seekrl demo`, `seekrl prorag` and the
benchmarks that start from them: the world, greedy evaluation, the SFT warm-up's batching
and the RL run's config tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console


@dataclass
class DemoConfig:
    seed: int = 0
    model: str = "smollm2-135m"
    # every stage's dtype; auto: bf16-mixed on a CPU that multiplies bfloat16 natively
    # (0.72x the float32 RL step, no loss in greedy EM: bench/RESULTS.md), float32 elsewhere
    # (`seekrl demo` says auto; the benchmarks and `seekrl prorag` keep float32 unless told)
    dtype: str = "float32"
    # the world
    difficulty: str = "medium"
    doc_words: tuple[int, int] = (12, 30)
    hop_mix: dict = field(default_factory=lambda: {1: 0.3, 2: 0.45, 3: 0.25})
    k: int = 2                       # documents per search
    max_info_tokens: int = 256
    # evaluation (greedy, the same test questions before and after every stage)
    n_test: int = 40
    eval_max_turns: int = 4
    eval_max_new_tokens: int = 128   # holds every oracle turn (longest 103 tokens; a test)
    # SFT warm-up
    sft_steps: int = 20
    sft_batch: int = 8               # episodes per optimizer step
    sft_micro_batch: int = 2         # episodes per forward / backward (memory: 8 at once
                                     # peaked at 10.4 GB, 2 x 4 accumulated at 3.4 GB, and
                                     # ran faster with less padding)
    sft_lr: float = 2e-4
    train_layers: int | None = 16    # top blocks trained (None: all)
    # RL
    rl_steps: int = 3                # a fixed number of steps: the same run on every machine
    rl_minutes: float | None = None  # or stop RL after the step that passes this budget
    advantage: str = "grpo"          # 3 steps: GRPO's larger steps bought more here than
                                     # dr_grpo's (0.225 vs 0.125); for long runs use dr_grpo
    questions_per_step: int = 8
    group_size: int = 4
    rl_lr: float = 3e-5
    rl_micro_batch: int = 2          # episodes per forward / backward in the update: each
                                     # costs ~0.8 GB of activations (8 at once peaked at
                                     # 8.5 GB, 4 at 5.2 GB); 2 halves a group's shared
                                     # prompt pass
    temperature: float = 1.0
    kl_coef: float = 0.0
    process: str | None = None       # a process method (rl/methods.py) run next to outcome RL
    n_show: int = 2                  # test questions whose retrieval is printed


def demo_dtype(cfg: DemoConfig) -> str:
    """The dtype `cfg.dtype` means on this machine (`auto` resolved)."""
    if cfg.dtype != "auto":
        return cfg.dtype
    from seekrl.models import cpu_multiplies_bf16

    return "bf16-mixed" if cpu_multiplies_bf16() else "float32"


def sft_batching(cfg: DemoConfig) -> dict[str, int]:
    """`sft_batch` episodes per optimizer step as micro-batches of `sft_micro_batch`
    (the same gradient: the loss is normalised over the step's tokens)."""
    accum = max(1, cfg.sft_batch // max(1, cfg.sft_micro_batch))
    return {"batch_size": max(1, cfg.sft_batch // accum), "grad_accum": accum}


def sft_config(cfg: DemoConfig, data: str | Path, out: str | Path, **overrides):
    """The demo's SFT warm-up as an `SFTConfig` (the benchmarks start from it too):
    `sft_steps` steps of `sft_batch` episodes, the top `train_layers` blocks, the turn limit
    of the demo's rollouts; `overrides` replace any key."""
    from seekrl.config import SFTConfig

    settings = {"model": cfg.model, "data": str(data), "out": str(out), "seed": cfg.seed,
                "max_steps": cfg.sft_steps, **sft_batching(cfg),
                "max_info_tokens": cfg.max_info_tokens, "topk": cfg.k,
                "train_layers": cfg.train_layers, "max_new_tokens": cfg.eval_max_new_tokens,
                "dtype": demo_dtype(cfg),
                "optim": {"lr": cfg.sft_lr, "warmup_steps": 2, "min_lr_ratio": 0.1}}
    return SFTConfig(**{**settings, **overrides})


def rl_config_tree(cfg: DemoConfig, *, model: str, train_file: str | Path,
                   index_dir: str | Path, out: str | Path, steps: int,
                   budget_tokens: int | None = None) -> dict:
    """The demo's RL settings as a `TrainConfig` tree (the benchmarks start from it too)."""
    return {
        "model": str(model), "data": str(train_file), "index": str(index_dir),
        "out": str(out), "seed": cfg.seed, "save_every": 0, "steps": steps,
        "dtype": demo_dtype(cfg),
        "max_minutes": cfg.rl_minutes, "max_rollout_tokens": budget_tokens,
        "questions_per_step": cfg.questions_per_step, "group_size": cfg.group_size,
        "train_layers": cfg.train_layers,
        "rollout": {"max_turns": cfg.eval_max_turns, "max_new_tokens": cfg.eval_max_new_tokens,
                    "topk": cfg.k, "max_info_tokens": cfg.max_info_tokens,
                    "temperature": cfg.temperature},
        "algo": {"advantage": cfg.advantage, "kl_coef": cfg.kl_coef,
                 "mini_batch_size": cfg.questions_per_step * cfg.group_size,
                 "micro_batch_size": cfg.rl_micro_batch},
        "optim": {"lr": cfg.rl_lr, "schedule": "constant"}}


def evaluate_greedy(model_name: str, run_dir: Path, *, index, test_file: Path, cfg: DemoConfig,
              console: Console) -> dict:
    """Greedy agent evaluation with the demo's settings; the average metrics row."""
    from seekrl.config import EvalConfig
    from seekrl.eval.evaluate import eval_policy
    from seekrl.models import load_policy

    policy, tokenizer = load_policy(model_name, dtype=demo_dtype(cfg))
    metrics = eval_policy(policy, tokenizer, index,
                          EvalConfig(data=str(test_file), n=cfg.n_test,
                                     max_turns=cfg.eval_max_turns,
                                     max_new_tokens=cfg.eval_max_new_tokens,
                                     # one batch: a tail batch of a few episodes would
                                     # decode as many steps for a fraction of the tokens
                                     batch_size=min(cfg.n_test, 64)),
                          run_dir, topk=cfg.k, max_info_tokens=cfg.max_info_tokens,
                          console=console, run_info={"model": model_name})
    avg = metrics["average"]
    console.print(f"EM {avg['em']:.3f}  F1 {avg['f1']:.3f}  valid format "
                  f"{avg['valid_format']:.2f}  searches {avg['searches']:.2f}  -> "
                  f"{run_dir / 'viewer.html'}")
    return avg
