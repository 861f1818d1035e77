"""What the recipes share at set-up: config name checks, the index,
seeding, resuming and stopping (`Interrupted`), trainable layers and LoRA, optimizer and
schedule, a token budget's share, and the metrics log (checkpoint I/O is in `checkpoint.py`)."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seekrl.config import LoRAConfig, OptimConfig
from seekrl.errors import ConfigError
from seekrl.plugins import Registry


def check_name(key: str, value: str, known) -> None:
    """A registry name from a config key (a `Registry` also takes the import paths it
    takes): unknown ones name the key and the known names."""
    if isinstance(known, Registry):
        known.lookup(value, key)
    elif value not in known:
        raise ConfigError(f"{key}: expected one of {', '.join(sorted(known))}, got {value!r}")


def check_episode_recipe(cfg, command: str) -> None:
    """What the recipes that play episodes with an outcome reward (labelling, refine)
    check alike: the `reward` name, the tools, and that `rollout.backend` can serve
    `command`."""
    from seekrl.agent.factory import backend_refusal
    from seekrl.rewards.outcome import OUTCOMES

    check_name("reward", cfg.reward, OUTCOMES)
    if cfg.rollout.tools:   # before the policy loads
        from seekrl.agent.tools import check_tool_names
        check_tool_names(cfg.rollout.tools)
    if cfg.retriever:
        from seekrl.plugins import check_retriever

        check_retriever("retriever", cfg.retriever, cfg.index)
    why = backend_refusal(cfg.rollout.backend, command)
    if why:
        raise ConfigError(f"rollout.backend: {why}")
    if cfg.rollout.tree is not None:   # read by RL's rollouts alone: here it would do nothing
        raise ConfigError(f"rollout.tree: tree rollouts are seekrl train's; {command} plays "
                          "its own episodes (leave tree out)")


def open_index(index: str | None, what: str, retriever: str | None = None):
    """The retriever the `retriever` key names by import path (made with `index` when that
    is set), else the one the `index` key names (a folder or a server url); `what` says
    who needs one when neither is set. A server is asked one query now, so an address that
    does not answer fails before a model loads or an old run is replaced, not at the first
    step."""
    if retriever:
        from seekrl.plugins import make_retriever

        return make_retriever("retriever", retriever, index)
    from seekrl.retrieval.base import RetrievalError
    from seekrl.retrieval.open import open_retriever

    if not index:
        raise ValueError(f"index: {what}; it needs an index folder or a retrieval server url "
                         "(or `retriever`: your own by import path)")
    opened = open_retriever(index)
    if index.startswith(("http://", "https://")):
        try:
            opened.search(["seekrl connection check"], 1)
        except (RetrievalError, OSError) as err:
            raise RetrievalError(f"index: {index} does not answer a search ({err}); start "
                                 "the server (`seekrl serve`) or fix the url") from None
    return opened


def check_world_index(index: str | None, *data: str | None) -> None:
    """Where questions from a `seekrl world` folder meet an index folder, the index must be
    the one built from that world's corpus (its manifest's corpus_sha256): a world
    regenerated after its index was built has other gold documents, and every episode
    would search the wrong corpus without a word. Servers and data from elsewhere pass."""
    from seekrl.data.world import world_corpus
    from seekrl.retrieval.index import MANIFEST, check_index_corpus

    if not index or not (Path(index) / MANIFEST).is_file():
        return                    # a server, or no index folder (named where it is opened)
    for corpus in dict.fromkeys(c for c in map(world_corpus, data) if c is not None):
        check_index_corpus(index, corpus)


def check_eval_index(index: str | None, data: str | None, eval_cfg) -> None:
    """The evaluation's questions (`eval.data`) meet the index they search: `eval.index`,
    else the run's `index` (`check_world_index`), with the fix named when the run's index
    serves `data`, another world's questions. `eval.index` without `eval.data` is refused:
    nothing would search it."""
    from seekrl.data.world import world_corpus
    from seekrl.retrieval.base import RetrievalError

    if eval_cfg.index and not eval_cfg.data:
        raise ConfigError("eval.index: nothing searches it without eval.data; set eval.data "
                          "(the questions to evaluate on) or leave eval.index out")
    try:
        check_world_index(eval_cfg.index or index, eval_cfg.data)
    except RetrievalError as err:
        if eval_cfg.index:
            raise RetrievalError(f"eval.index: {err}") from None
        theirs, ours = world_corpus(eval_cfg.data), world_corpus(data)
        if ours is not None and ours != theirs:   # `index` passed data's own check
            raise RetrievalError(
                f"eval.data {eval_cfg.data} holds another world's questions than data "
                f"{data}, and index {index} searches data's world: set eval.index to an index "
                f"built from {theirs}") from None
        raise RetrievalError(f"index and eval.data: {err}; or, for questions of another "
                             "corpus than the run's, set eval.index to that corpus's index"
                             ) from None


def check_eval_data(eval_cfg, key: str = "eval.data") -> None:
    """Read `eval.data` as the evaluation will (its first `eval.n` questions), before a
    model loads: a typo fails in seconds, naming the key, not after training."""
    if not eval_cfg.data:
        if eval_cfg.keep_best:
            raise ConfigError(f"{key.rsplit('.', 1)[0]}.keep_best: needs evaluations to "
                              f"choose from; set {key} (a QA file, e.g. the world's dev.jsonl)")
        return
    from seekrl.errors import SeekrlError
    from seekrl.eval.evaluate import load_eval_data

    try:
        load_eval_data([eval_cfg.data], limit=eval_cfg.n)
    except (SeekrlError, FileNotFoundError, ValueError) as err:
        raise ConfigError(f"{key}: {err}") from None


def sample_queries(records: list, seed: int, limit: int | None) -> list:
    """Search-query records in a seeded order, at most `limit` of them; none is an error
    (the simulator's and the ranker's training read the same sources)."""
    records = list(records)
    random.Random(seed).shuffle(records)
    if limit is not None:
        records = records[:limit]
    if not records:
        raise ValueError("trajectories / data: no search queries found (give an evaluation's "
                         "trajectories.jsonl, rollouts, or synthetic-world questions, whose "
                         "metadata.chain holds the hop queries; for other QA files set "
                         "question_queries: true to search each question itself)")
    return records


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The global random states; the CUDA generators too (dropout on a GPU draws there)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    # torch takes byte tensors on the CPU: a checkpoint loaded onto a GPU moved them there
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
        else:
            import warnings
            warnings.warn(f"resume: the checkpoint holds the random states of {len(cuda)} "
                          f"GPUs and {torch.cuda.device_count()} are visible: the GPUs' "
                          "draws (dropout) start afresh", stacklevel=2)


def training_state(module, step: int, optimizer, scheduler, **extra) -> dict:
    """What a resumed run needs to go on exactly (a checkpoint's state.pt): the trained
    weights, the optimizer and schedule, the global random states, and a recipe's own
    entries (`extra`: its sampler's state, its remaining batches)."""
    return {"step": step,
            "trainable": {n: p.detach().cpu() for n, p in module.named_parameters()
                          if p.requires_grad},
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": rng_state(), **extra}


def resume_training(checkpoint: Path, module, optimizer, scheduler, *, out: Path, cfg,
                    total_steps: int, say) -> dict:
    """Load `checkpoint/state.pt` (`training_state`) into a freshly built run: the trained
    weights (refused when this config trains others), the optimizer, the schedule and the
    random states. Says which settings differ from the run's config.yaml and where it goes
    on, and drops the metrics lines of the steps after the checkpoint (they are redone).
    Returns the state, for the recipe's own entries."""
    from seekrl.recipes.checkpoint import config_changes, refuse_optimizer_changes

    changed = config_changes(out / "config.yaml", cfg)
    refuse_optimizer_changes(changed, out / "config.yaml")
    if changed:
        say("[yellow]--resume with settings that differ from the run's config.yaml:[/] "
            + "; ".join(changed))
    state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
    trained = dict(module.named_parameters())
    differ = sorted(set(state["trainable"]) ^ {n for n, p in trained.items() if p.requires_grad})
    if differ:
        raise ConfigError(f"--resume: {checkpoint} trained other weights than this config "
                          f"does (train_layers, lora): {', '.join(differ[:3])} ...")
    with torch.no_grad():
        for name, value in state["trainable"].items():
            trained[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    done = int(state["step"])
    say(f"resuming from {checkpoint}: {done} of {total_steps} steps done")
    keep_log_until(out / "metrics.jsonl", done)
    return state


def keep_log_until(path: Path, step: int, drop=None) -> None:
    """On resume: a step log's lines up to `step` (those after are about to be redone and
    come back), less those `drop(record)` names. A line that does not parse (the tail a
    kill or a full disk cut off) goes too; the file is replaced whole (written beside it,
    then renamed), never half."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step and \
                not (drop is not None and drop(record)):
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(ln + "\n" for ln in kept))
        fh.flush()
        os.fsync(fh.fileno())   # renamed over the log unflushed, a power cut could empty it
    os.replace(tmp, path)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a recipe's training loop (SFT, the PRM, the ranker): how many steps were
    done and the checkpoint to resume from. `steps` (the run's) and `saves_last` (whether
    the last step is checkpointed too) say when the first checkpoint comes."""

    def __init__(self, done: int, checkpoint: Path | None, save_every: int,
                 steps: int | None = None, *, saves_last: bool = False):
        super().__init__(done)
        self.done, self.checkpoint, self.save_every = done, checkpoint, save_every
        self.steps, self.saves_last = steps, saves_last

    def message(self, command: str) -> str:
        where = f"after step {self.done}" if self.done else "before the first step"
        if self.checkpoint is not None:
            return (f"interrupted {where}; the latest checkpoint is {self.checkpoint}; "
                    f"continue from it with: {command} --resume")
        first = self.save_every
        if self.steps is not None and first >= self.steps:
            first = self.steps if self.saves_last else None
        why = "save_every is 0" if not self.save_every else \
            f"the first checkpoint comes at step {first}" if first else \
            f"save_every {self.save_every} is not below the run's {self.steps} steps"
        return f"interrupted {where}, with no checkpoint ({why}); start again with: " \
               f"{command} --overwrite"


def train_top_layers(model, n: int | None):
    """Freeze everything but the last `n` transformer blocks (and the final norm); None
    trains all. Backpropagation then stops at the lowest trainable block, so an update
    costs about `1 + 2 n / n_layers` forward passes instead of 3: on a CPU this is the
    knob that buys the most training per minute."""
    if n is None:
        return model
    blocks = _blocks(model)
    model.requires_grad_(False)
    for i in _top_blocks(model, n):
        blocks[i].requires_grad_(True)
    base = getattr(model, model.base_model_prefix, model)
    # the final norm by each family's name (Llama/Qwen `norm`, GPT-2 `ln_f`, Phi
    # `final_layernorm`): GPT-2's stayed frozen
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        norm = getattr(base, name, None)
        if isinstance(norm, torch.nn.Module):
            norm.requires_grad_(True)
            break
    return model


def _top_blocks(model, n: int) -> list[int]:
    """The indices of the model's top `n` transformer blocks (`train_layers`), checked."""
    count = len(_blocks(model))
    if not 1 <= n <= count:
        raise ValueError(f"train_layers: expected 1..{count} for this model, got {n}")
    return list(range(count - n, count))


def _blocks(model) -> torch.nn.ModuleList:
    return getattr(getattr(model, model.base_model_prefix, model), _blocks_name(model))


def _blocks_name(model) -> str:
    """The attribute of the backbone that holds its transformer blocks."""
    backbone = getattr(model, model.base_model_prefix, model)
    for name in ("layers", "h", "blocks"):
        if isinstance(getattr(backbone, name, None), torch.nn.ModuleList):
            return name
    raise ValueError("train_layers: cannot find this model's list of transformer blocks")


def prepare_trainable(model, train_layers: int | None, lora: LoRAConfig):
    """The one policy set-up of SFT, RL, the PRM and step-DPO: freeze all but the top
    `train_layers` blocks, add LoRA adapters when enabled, and turn off the generation KV
    cache (training forwards never reuse it; keeping it costs memory)."""
    if lora.enabled and train_layers is not None:
        # adapters in the top `train_layers` blocks only: LoRA over every block froze the
        # model again and undid `train_layers` without a word (and backpropagated through
        # all of them)
        model = apply_lora(model, lora, layers=_top_blocks(model, train_layers))
    else:
        model = apply_lora(train_top_layers(model, train_layers), lora)
    if hasattr(model, "config"):
        model.config.use_cache = False
    return model


def enable_activation_checkpointing(model) -> None:
    """Activation (gradient) checkpointing of the model's blocks, non-reentrant (which needs
    no input that requires grad, so it works with LoRA and frozen lower blocks). It acts in
    train mode only: rollouts (eval mode) keep their KV cache."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):     # transformers >= 5.18
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"gradient_checkpointing: {type(model).__name__} does not support "
                         "activation checkpointing")
    # transformers also makes the embeddings' output require grad (for the reentrant kind):
    # with frozen lower blocks the backward pass would then run through all of them
    undo = getattr(model, "disable_input_require_grads", None)
    if callable(undo):
        try:
            undo()
        except (AttributeError, RuntimeError):   # no hook was registered
            pass


def units_within_budget(budget: int, spent: float, done: int, most: int) -> int:
    """How many more units (questions) a token budget pays for, at the tokens per unit so
    far, rounded, so that a run's total lands within half a unit of the budget: between 0
    and `most`, and `most` before any unit is done (no rate to go by yet). The RL recipe
    sizes its last step by it, labelling its last chunk."""
    if not done or not spent:
        return most
    return max(0, min(most, round((budget - spent) / (spent / done))))


def apply_lora(model, cfg: LoRAConfig, layers: list[int] | None = None):
    """Wrap `model` with LoRA adapters (peft) when enabled, in the blocks numbered `layers`
    (None: every block); else return it unchanged."""
    if not cfg.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [m for m in cfg.target_modules if m in present]
    if not targets:
        raise ValueError(f"lora.target_modules: none of {cfg.target_modules} is a module of "
                         f"this model (it has e.g. {sorted(present)[:12]})")
    where = {} if layers is None else {"layers_to_transform": layers,
                                       "layers_pattern": _blocks_name(model)}
    return get_peft_model(model, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha,
                                            lora_dropout=cfg.dropout, target_modules=targets,
                                            task_type="CAUSAL_LM", **where))


def trainable_parameters(*modules) -> list[torch.nn.Parameter]:
    return [p for m in modules if m is not None for p in m.parameters() if p.requires_grad]


def clip_and_step(params, optimizer, max_norm: float | None) -> float:
    """Clip the gradient to `max_norm` (None or 0: measure only), take the optimizer step
    only when the norm is finite, clear the gradient; returns the norm (nan / inf when the
    step was skipped). Every recipe (SFT, RL, PRM, step-DPO) steps through here, so a
    non-finite gradient never reaches the weights in any of them."""
    from seekrl.rl.distributed import clip_grad_norm  # sharded gradients too

    norm = clip_grad_norm(params, max_norm if max_norm else float("inf"))
    if torch.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def make_optimizer(params, cfg: OptimConfig, *, extra_groups: list[dict] = ()):
    groups = [{"params": list(params)}, *extra_groups]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas),
                             weight_decay=cfg.weight_decay)


def make_scheduler(optimizer, cfg: OptimConfig, total_steps: int,
                   budget_share: Callable[[], float] | None = None):
    """Linear warm-up, then cosine decay to `lr * min_lr_ratio` (or constant).

    `budget_share`, when given, is the share (0 to 1) of a compute budget spent so far, read
    at each step: the decay follows it when it is ahead of the steps' share, so a run that its
    budget stops after 11 of a nominal 100 steps still decays to its floor by the end instead
    of training at nearly the peak rate throughout. Warm-up counts steps either way; the
    budget's decay starts where warm-up ends, taking each step as costing the same tokens
    (the share s after k steps puts warm-up's w steps at w·s/k of the budget)."""
    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        if budget_share is not None and step > cfg.warmup_steps:
            share, w = min(1.0, budget_share()), cfg.warmup_steps
            progress = max(progress, share * (step - w) / (step - w * share))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class MetricsLog:
    """One JSON object per line in `RUN_DIR/metrics.jsonl`, flushed at every write; also
    TensorBoard / Weights & Biases when asked for and installed."""

    def __init__(self, path: str | Path, *, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "seekrl", config: dict | None = None, resume: bool = False,
                 resume_step: int | None = None):
        """`resume_step`: the checkpoint's step a resumed run goes on from; the steps after
        it are redone, so TensorBoard drops what it holds of them. W&B goes on in the same
        run (its id is kept in RUN_DIR/wandb_id); it takes no step twice, so it keeps the
        values it had of the redone steps (metrics.jsonl holds the new ones)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a" if resume else "w", encoding="utf-8")
        self._tb = self._wandb = None
        self._wandb_step: int | None = None   # the last step logged to W&B by this process
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ConfigError("log.tensorboard: needs the tensorboard package "
                                  "(pip install tensorboard)") from err
            self._tb = SummaryWriter(str(self.path.parent / "tensorboard"),
                                     purge_step=resume_step + 1
                                     if resume and resume_step is not None else None)
        if wandb:
            try:
                import wandb as wb
            except ImportError as err:
                raise ConfigError("log.wandb: needs the wandb package (pip install wandb)") \
                    from err
            id_file = self.path.parent / "wandb_id"
            run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
            self._wandb = wb.init(project=wandb_project, config=config or {},
                                  dir=str(self.path.parent), id=run_id,
                                  resume="allow" if run_id else None)
            id_file.write_text(str(self._wandb.id) + "\n")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=float) + "\n")
        self._file.flush()
        step = record.get("step")
        scalars = {k: v for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            # W&B drops what is logged below its last step: a collapse-stopped run's final
            # evaluation (logged under the restored step) goes at the last step, its own
            # step in the `step` field
            if step is not None and self._wandb_step is not None and step < self._wandb_step:
                step = self._wandb_step
            self._wandb.log(scalars, step=step)
            self._wandb_step = step if step is not None else self._wandb_step

    def close(self) -> None:
        """Idempotent: a run closes its log when it ends, and again from `Trainer.close`."""
        if self._file.closed:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class NoLog:
    """The metrics log of a rank other than 0: rank 0 writes the run's."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
