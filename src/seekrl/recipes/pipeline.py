"""The small pipeline's settings, shared by `seekrl demo`, `seekrl prorag` and the
benchmarks that start from them: a stage's config from its YAML preset (src/seekrl/presets/demo,
src/seekrl/presets/prorag), the demo's settings and stages, and greedy evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, Field
from rich.console import Console

from seekrl.config import (
    EpisodeSettings,
    SFTConfig,
    Strict,
    TrainConfig,
    build_config,
    merged,
    read_config_file,
    with_keys,
)

# the stage presets, YAML a user copies and edits: configs/ at the repository's root
PRESETS = Path(__file__).resolve().parents[1] / "presets"   # package data: a wheel has them

C = TypeVar("C", bound=BaseModel)


def stage_config(schema: type[C], preset: str | Path, *, keys: dict[str, Any],
                 episode: EpisodeSettings | None = None, own: dict[str, Any] | None = None,
                 then: dict[str, Any] | None = None, source: str) -> C:
    """A pipeline stage's config, each layer over the one before: the pipeline's `episode`
    settings (the stage's `rollout:` section), the preset file (a stage's own keys, e.g.
    labelling's sampling temperature), the pipeline's `keys` (the stage's inputs and
    outputs, its seed), the user's keys for the stage (`own`, a nested section), and `then`
    (keys the pipeline derives from the stage's settings, e.g. a process method's). `keys`
    and `then` are dotted; errors name `source`."""
    tree = read_config_file(preset)
    if not Path(preset).resolve().is_relative_to(PRESETS):   # a user's copy: name the file
        source = f"{source} (preset {preset})"
    if episode is not None:
        tree = merged({"rollout": episode.episode_settings().model_dump()}, tree)
    # the user's keys as a config file's over the recipe's: sections merge, a mapping such
    # as reward.process is replaced (prorag's rl.reward.process could not drop the PRM)
    tree = merged(with_keys(tree, keys, schema, where=source), own or {}, schema)
    if then:
        tree = with_keys(tree, then, schema, where=source)
    return build_config(schema, tree, source=source)


class DemoConfig(Strict):
    """`seekrl demo`'s settings: its world, the episodes every stage plays, its evaluations,
    and keys of its two stages over their presets (`presets`/sft.yaml and rl.yaml)."""
    seed: int = 0                      # the world's and every stage's
    model: str = "smollm2-135m"        # the policy the SFT warm-up starts from
    # every stage's dtype; auto: bf16-mixed on a CPU that multiplies bfloat16 natively
    # (0.72x the float32 RL step, no loss in greedy EM: bench/RESULTS.md), float32 elsewhere
    # (`seekrl demo` says auto; the benchmarks and `seekrl prorag` keep float32 unless told)
    dtype: str = "float32"
    # the world
    difficulty: str = "medium"
    doc_words: tuple[int, int] = (12, 30)
    hop_mix: dict[int, float] = {1: 0.3, 2: 0.45, 3: 0.25}
    # the episodes: the oracle searches topk documents, SFT lays its episodes out with them,
    # RL plays them, every evaluation plays them greedily. 2 documents a search, 256-token
    # information blocks; 128 tokens a turn hold every oracle turn (longest 103; a test)
    rollout: EpisodeSettings = EpisodeSettings(topk=2, max_info_tokens=256)
    n_test: int = Field(40, ge=1)      # test questions, the same at every evaluation
    n_show: int = Field(2, ge=0)       # test questions whose retrieval is printed
    process: str | None = None         # a process method (rl/methods.py) run next to outcome RL
    presets: Path | None = None        # a folder with sft.yaml and rl.yaml; None: src/seekrl/presets/demo
    # episodes per SFT optimizer step (--sft-batch), as micro-batches of sft.yaml's
    # batch_size; None: sft.yaml's batch_size x grad_accum
    sft_batch: int | None = Field(None, ge=1)
    sft: dict[str, Any] = {}           # SFTConfig keys over sft.yaml (--sft-steps: max_steps)
    rl: dict[str, Any] = {}            # TrainConfig keys over rl.yaml (--rl-steps: steps)
    stage_schemas: ClassVar[dict[str, type]] = {"sft": SFTConfig, "rl": TrainConfig}


def demo_dtype(cfg: DemoConfig) -> str:
    """The dtype `cfg.dtype` means on this machine (`auto` resolved)."""
    if cfg.dtype != "auto":
        return cfg.dtype
    from seekrl.models import cpu_multiplies_bf16

    return "bf16-mixed" if cpu_multiplies_bf16() else "float32"


def _preset(cfg: DemoConfig, name: str) -> Path:
    return (Path(cfg.presets) if cfg.presets is not None else PRESETS / "demo") / name


def demo_world(cfg: DemoConfig):
    """The demo's synthetic world (`seekrl prorag` builds the same)."""
    from seekrl.data.world import WorldConfig

    return WorldConfig(seed=cfg.seed, difficulty=cfg.difficulty, doc_words=cfg.doc_words,
                       hop_mix=cfg.hop_mix)


def sft_config(cfg: DemoConfig, data: str | Path, out: str | Path, **keys: Any) -> SFTConfig:
    """The demo's SFT warm-up (the benchmarks start from it too): sft.yaml playing the
    demo's episodes, with its model, seed and dtype, `data` and `out`, `cfg.sft` and then
    `keys` on top. `cfg.sft_batch` episodes a step are micro-batches of the resolved
    `batch_size` (the same gradient: the loss is normalised over the step's tokens)."""
    def build(then: dict[str, Any]) -> SFTConfig:
        return stage_config(SFTConfig, _preset(cfg, "sft.yaml"), episode=cfg.rollout,
                            keys={"model": cfg.model, "data": str(data), "out": str(out),
                                  "seed": cfg.seed, "dtype": demo_dtype(cfg)},
                            own=merged(cfg.sft, keys), then=then, source="demo sft")

    sft = build({})
    if cfg.sft_batch is None:
        return sft
    # the fewest micro-batches of at most batch_size (the preset's memory bound) that split
    # the step exactly (7 at batch_size 2 is 7 of 1, not 3 of 2: a step is the episodes
    # asked for; 3 at batch_size 2 was 1 of 3, over the bound)
    n = cfg.sft_batch
    accum = next(a for a in range(-(-n // sft.batch_size), n + 1) if n % a == 0)
    return build({"batch_size": n // accum, "grad_accum": accum})


def rl_config(cfg: DemoConfig, *, model: str | Path, train_file: str | Path,
              index_dir: str | Path, out: str | Path, keys: dict[str, Any] | None = None,
              budget_tokens: int | None = None) -> TrainConfig:
    """The demo's RL stage (the benchmarks start from it too): rl.yaml playing the demo's
    episodes, with its seed and dtype and these inputs, `cfg.rl` on top, then `keys` (a
    process method's, dotted). One update a step: `algo.mini_batch_size` is
    questions_per_step x group_size unless `cfg.rl` sets it. With `budget_tokens`, the run
    stops at that many generated rollout tokens, within 10x its steps."""
    inputs = {"model": str(model), "data": str(train_file), "index": str(index_dir),
              "out": str(out), "seed": cfg.seed, "dtype": demo_dtype(cfg)}

    def build(then: dict[str, Any]) -> TrainConfig:
        return stage_config(TrainConfig, _preset(cfg, "rl.yaml"), episode=cfg.rollout,
                            keys=inputs, own=cfg.rl, then=then, source="demo rl")

    first = build({})
    then: dict[str, Any] = {}
    # one update a step unless the preset (a user's copy) or `cfg.rl` says otherwise
    preset = read_config_file(_preset(cfg, "rl.yaml")).get("algo") or {}
    if "mini_batch_size" not in {**preset, **(cfg.rl.get("algo") or {})}:
        then["algo.mini_batch_size"] = first.questions_per_step * first.group_size
    if budget_tokens is not None:
        then.update(max_rollout_tokens=budget_tokens, steps=10 * first.steps)
    return build({**then, **(keys or {})})


def evaluate_greedy(model_name: str, run_dir: Path, *, index, test_file: Path,
                    episode: EpisodeSettings, n: int, dtype: str, console: Console) -> dict:
    """Greedy agent evaluation of the first `n` questions of `test_file`, playing
    `episode` in one batch (a tail batch of a few episodes would decode as many steps for
    a fraction of the tokens); the average metrics row."""
    from seekrl.config import EvalConfig
    from seekrl.eval.evaluate import eval_policy
    from seekrl.models import load_policy

    policy, tokenizer = load_policy(model_name, dtype=dtype)
    metrics = eval_policy(policy, tokenizer, index,
                          EvalConfig(data=str(test_file), n=n, batch_size=min(n, 64)),
                          run_dir, episode=episode, console=console,
                          run_info={"model": model_name})
    avg = metrics["average"]
    console.print(f"EM {avg['em']:.3f}  F1 {avg['f1']:.3f}  valid format "
                  f"{avg['valid_format']:.2f}  searches {avg['searches']:.2f}  -> "
                  f"{run_dir / 'viewer.html'}")
    return avg
