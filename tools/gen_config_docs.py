"""Write docs/reference/configuration.md from the pydantic schema in src/seekrl/config/.

Every key of every recipe's config, with its type, default, range and description. The
description is the comment written beside the field in schema.py (`seekrl.config.field_notes`,
the same text `--print-config` prints), else the comment of the type alias it is declared
with (`MaxTurns = ...  # model turns per episode`, in fields.py), else a short note kept here
for the keys schema.py leaves without one. The schema is only read, never changed.

    .venv/bin/python tools/gen_config_docs.py           # rewrite the page
    .venv/bin/python tools/gen_config_docs.py --check   # exit 1 if the page is stale

tests/test_docs.py checks that the committed page is what this script writes.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "configuration.md"

# (command, config class name, what it is): the page's sections, in order
RECIPES = [
    ("seekrl sft", "SFTConfig", "Supervised warm-up on trajectory JSONL (oracle episodes, or "
     "kept rollouts): the loss on the policy's tokens only."),
    ("seekrl train", "TrainConfig", "RL from outcome and process rewards: rollouts, rewards, "
     "advantages, the PPO-style update."),
    ("seekrl mcts", "LabelConfig", "Step labels for a process reward model: MCTS (or "
     "Monte-Carlo rollouts) over search steps."),
    ("seekrl prm train", "PRMConfig", "A process reward model: a causal LM with a scalar head "
     "read at each step's last token."),
    ("seekrl refine", "RefineConfig", "PRM-guided refinement: rejection-sampling fine-tuning "
     "(RFT) or step-level DPO."),
    ("seekrl simulator train", "SimulatorTrainConfig", "Fine-tune a search simulator "
     "(ZeroSearch) on the documents a real index returns."),
    ("seekrl ranker train", "RankerTrainConfig", "A ranker over first-stage candidates, "
     "trained on logged searches and hop queries."),
    ("seekrl prorag", "ProragConfig", "The ProRAG pipeline end to end; each stage section "
     "holds keys of that stage's own config."),
]

# Notes for the keys schema.py leaves without a comment: (class, key), then the key alone.
NOTES: dict[tuple[str, str] | str, str] = {
    "model": "the policy to start from: a Hugging Face id or local path, or the bundled "
             "`smollm2-135m`",
    "out": "the run folder to write",
    "dtype": "`float32`; `bfloat16` / `float16` weights; or `bf16-mixed`: float32 weights, "
             "matrix products in bfloat16 under autocast",
    "device": "`cpu`, `cuda`, `cuda:N` or `mps`; checked when the config loads",
    "seed": "random seed (sampling, data order, initialisation): same seed, same run",
    "lora": "LoRA adapters instead of training the weights (merged when saved)",
    "optim": "the AdamW optimiser and its learning-rate schedule",
    "eval": "greedy evaluation of the policy during and after training",
    "train_layers": "train only the top N transformer blocks (null: every block)",
    "log_every": "print a progress line every N optimizer steps",
    "index": "an index folder (`seekrl index`) or a retrieval server url (`seekrl serve`)",
    "questions": "only the first N questions of `data`",
    "search": "the search that labels steps: MCTS or Monte-Carlo rollouts",
    ("LoRAConfig", "enabled"): "train LoRA adapters instead of the weights (with "
                               "`train_layers`, in the top blocks only)",
    ("LoRAConfig", "r"): "the adapters' rank",
    ("LoRAConfig", "alpha"): "the adapters' scale: their update is multiplied by alpha / r",
    ("LoRAConfig", "dropout"): "dropout on the adapters' input",
    ("LoRAConfig", "target_modules"): "the linear layers that get adapters, by name",
    ("OptimConfig", "lr"): "peak learning rate",
    ("OptimConfig", "weight_decay"): "AdamW's decoupled weight decay",
    ("OptimConfig", "betas"): "AdamW's (beta1, beta2)",
    ("OptimConfig", "warmup_steps"): "linear warm-up to lr over this many schedule steps (the "
                                     "first at lr / warmup_steps): optimizer steps, but RL "
                                     "steps in seekrl train (each algo.epochs x its "
                                     "mini-batches of updates)",
    ("OptimConfig", "max_grad_norm"): "clip the gradient's global norm to this (null: no "
                                      "clipping)",
    ("SFTConfig", "epochs"): "passes over the data (`max_steps` overrides)",
    ("SFTConfig", "grad_accum"): "micro-batches per optimizer step",
    ("TrainConfig", "steps"): "RL steps; each samples questions, plays `group_size` rollouts "
                              "of each, scores them and updates",
    ("TrainConfig", "questions_per_step"): "questions sampled per RL step",
    ("TrainConfig", "rollout"): "how episodes are played: the episode settings, tree "
                                "rollouts, the generation backend",
    ("TrainConfig", "reward"): "the episode reward and the process (step) rewards",
    ("TrainConfig", "algo"): "the advantage estimator and the PPO-style update",
    ("TrainConfig", "monitor"): "the training-health monitor's thresholds",
    ("TrainConfig", "log"): "logging backends and kept training episodes",
    ("TreeSettings", "trees"): "chains started per question",
    ("TreeSettings", "branches"): "new leaves each tree grows per round",
    ("TreeSettings", "rounds"): "rounds of branching",
    ("AlgoConfig", "clip_low"): "PPO's clip below: the ratio's floor is 1 - clip_low",
    ("AlgoConfig", "clip_high"): "PPO's clip above: the ratio's ceiling is 1 + clip_high "
                                 "(clip-higher, as DAPO)",
    ("AlgoConfig", "kl_coef"): "weight of the KL to the frozen starting policy (0: no "
                               "reference model is kept)",
    ("AlgoConfig", "kl_estimator"): "k3 as a loss term, or k1 in the reward "
                                    "(`kl_in_reward`); k1 as a loss term is refused",
    ("AlgoConfig", "entropy_coef"): "weight of the entropy bonus",
    ("AlgoConfig", "max_refills"): "dynamic sampling: draws of new questions to replace "
                                   "the dropped groups",
    ("AlgoConfig", "value_coef"): "gae: weight of the critic's loss",
    ("AlgoConfig", "value_clip"): "gae: the critic's value clipping range (null: off)",
    ("AlgoConfig", "gamma"): "discount per policy token (reinforce_pp, gae)",
    ("AlgoConfig", "lam"): "gae: GAE's lambda",
    ("MonitorConfig", "enabled"): "run the training-health monitor",
    ("MonitorConfig", "stop_on_collapse"): "stop the run at a collapse and keep the last "
                                           "healthy checkpoint as `final`",
    ("LogConfig", "tensorboard"): "write TensorBoard events to the run folder (needs "
                                  "tensorboard)",
    ("LogConfig", "wandb"): "log to Weights & Biases (needs wandb)",
    ("LogConfig", "wandb_project"): "the Weights & Biases project",
    ("SimulatorSettings", "noise_end"): "the noisy share at the run's end",
    ("SimulatorSettings", "noise_base"): "the curriculum's curve: (base^p - 1) / (base - 1) "
                                         "at progress p",
    ("RankerSettings", "lr"): "the ranker's learning rate",
    ("SearchSettings", "method"): "mcts: tree search over steps; mc: Monte-Carlo rollouts "
                                  "from each step (Math-Shepherd style)",
    ("SearchSettings", "c_puct"): "PUCT's exploration weight",
    ("PRMConfig", "loss"): "pointwise: BCE on each step's soft Q; pairwise: Bradley-Terry on "
                           "sibling pairs; both",
    ("PRMConfig", "steps"): "optimizer steps",
    ("PRMConfig", "eval_every"): "held-out figures every N steps (0: at the end only)",
    ("PRMConfig", "eval_at_start"): "also measure the untrained PRM",
    ("RefineConfig", "method"): "rft: rejection-sampling fine-tuning; step_dpo: DPO on "
                                "sibling step pairs",
    ("RefineConfig", "reward"): "an episode's outcome: em, f1 or cover_em",
    ("RefineConfig", "max_per_question"): "rft: at most this many distinct episodes kept "
                                          "per question",
    ("RefineConfig", "rollout"): "how rft samples its episodes",
    ("RefineConfig", "beta"): "step_dpo: DPO's beta",
    ("RefineConfig", "batch_size"): "episodes (rft) or pairs (step_dpo) per micro-batch",
    ("SimulatorTrainConfig", "steps"): "optimizer steps",
    ("SimulatorTrainConfig", "grad_accum"): "micro-batches per optimizer step",
    ("SimulatorTrainConfig", "max_len"): "longer examples are cut (tokens)",
    ("RankerTrainConfig", "kind"): "a fresh ranker's kind: bi (bi-encoder), cross "
                                   "(cross-encoder) or query (a dense index's query "
                                   "encoder); null: bi",
    ("RankerTrainConfig", "candidates"): "first-stage documents per query that the ranker "
                                         "orders",
    ("RankerTrainConfig", "steps"): "optimizer steps",
    ("RankerTrainConfig", "batch_size"): "queries per step",
    ("RankerTrainConfig", "lr"): "learning rate",
    ("RankerTrainConfig", "temperature"): "a bi-encoder's cosine over this (null: a trained "
                                          "ranker's own, 0.05 for a fresh one)",
    ("ProragConfig", "model"): "the policy the pipeline starts from",
    ("ProragConfig", "n_test"): "test questions in each evaluation",
    ("ProragConfig", "refine_method"): "the refinement stage: rft, step_dpo, or none to skip it",
}

# What an Annotated string's validator accepts, by the validator's name
VALIDATED = {
    "_known_dtype": None,   # filled from config.DTYPE_NAMES
    "_usable_device": "`cpu`, `cuda`, `cuda:N`, `mps`: one that exists on this machine",
    "_check_prompt": "`seekrl`, `search_r1`, `data`, `file:PATH`, or a template holding "
                     "`{question}` once",
}


def _alias_notes(src: str) -> dict[str, str]:
    """Module-level `Name = Annotated[...]  # note` lines: the note of each alias."""
    comments = {t.start[0]: t.string.lstrip("#").strip()
                for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT}
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.lineno in comments:
            out[node.targets[0].id] = comments[node.lineno]
    return out


def _field_aliases(src: str) -> dict[tuple[str, str], str]:
    """(class, field) -> the name its annotation is written with, where it is a plain name."""
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    ann = item.annotation
                    if isinstance(ann, ast.BinOp):   # `MaxNewTokens | None`
                        ann = ann.left
                    if isinstance(ann, ast.Name):
                        out[(node.name, item.target.id)] = ann.id
    return out


def _registries() -> dict[tuple[str, str], str]:
    """The names a registry-named key takes: (class, key) -> the range column's text."""
    from seekrl.rewards.outcome import OUTCOMES
    from seekrl.rewards.process import PROCESS_REWARDS
    from seekrl.rl.advantages import ESTIMATORS
    from seekrl.rl.loss import AGGREGATIONS

    def names(xs) -> str:
        return ", ".join(f"`{x}`" for x in sorted(xs))

    outcomes = names(OUTCOMES)
    return {
        ("AlgoConfig", "advantage"): names(ESTIMATORS) + ", or an import path",
        ("AlgoConfig", "loss_agg"): ", ".join(f"`{x}`" for x in AGGREGATIONS),
        ("RewardConfig", "outcome"): outcomes,
        ("RewardConfig", "process"): "sources: " + names(PROCESS_REWARDS) +
                                     ", or import paths",
        ("LabelConfig", "reward"): outcomes,
        ("RefineConfig", "reward"): outcomes,
    }


class Schema:
    def __init__(self):
        from seekrl import config
        from seekrl.config import fields, schema

        self.config = config
        self.registries = _registries()
        self.notes = config.field_notes()
        # the aliases are declared in fields.py, the fields written with them in schema.py
        self.alias_notes = _alias_notes(Path(fields.__file__).read_text(encoding="utf-8"))
        self.aliases = _field_aliases(Path(schema.__file__).read_text(encoding="utf-8"))
        VALIDATED["_known_dtype"] = ", ".join(f"`{d}`" for d in config.DTYPE_NAMES)

    def note(self, klass: type[BaseModel], name: str) -> str:
        for k in klass.__mro__:
            if (k.__name__, name) in self.notes:
                return self.notes[(k.__name__, name)]
        for k in klass.__mro__:
            alias = self.aliases.get((k.__name__, name))
            if alias in self.alias_notes:
                return self.alias_notes[alias]
        for k in klass.__mro__:
            if (k.__name__, name) in NOTES:
                return NOTES[(k.__name__, name)]
        return NOTES.get(name, "")


def _type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, types.UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        text = " or ".join(dict.fromkeys(parts))
        return text + " or null" if type(None) in args else text
    if origin is Literal:
        return " or ".join(dict.fromkeys(type(v).__name__ for v in args))
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in args) + "]"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}" if args else "map"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _literals(annotation: Any) -> list:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return list(args)
    if origin in (Union, types.UnionType, Annotated):
        return [v for a in args for v in _literals(a)]
    return []


def _validators(annotation: Any, metadata: list) -> list[str]:
    found = [getattr(getattr(m, "func", None), "__name__", "") for m in metadata]
    for a in get_args(annotation):
        if get_origin(a) is Annotated:
            found += _validators(a, list(get_args(a)[1:]))
        elif hasattr(a, "func"):
            found.append(getattr(a.func, "__name__", ""))
    return [VALIDATED[f] for f in found if f in VALIDATED]


def _metadata(annotation: Any) -> list:
    """Constraints declared inside the annotation (`MaxNewTokens | None`)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return [*args[1:], *_metadata(args[0])]
    if origin in (Union, types.UnionType):
        return [m for a in args for m in _metadata(a)]
    return []


def _bounds(metadata: list) -> str:
    lo = hi = None
    for m in metadata:
        if hasattr(m, "metadata"):   # a FieldInfo inside Annotated
            m = next(iter(m.metadata), None)
        for attr, side, sym in (("ge", "lo", "["), ("gt", "lo", "("), ("le", "hi", "]"),
                                ("lt", "hi", ")")):
            value = getattr(m, attr, None)
            if value is not None:
                if side == "lo":
                    lo = (value, sym)
                else:
                    hi = (value, sym)
    if lo and hi:
        return f"{lo[1]}{lo[0]}, {hi[0]}{hi[1]}"
    if lo:
        return f"{'≥' if lo[1] == '[' else '>'} {lo[0]}"
    if hi:
        return f"{'≤' if hi[1] == ']' else '<'} {hi[0]}"
    return ""


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(schema: Schema, klass: type[BaseModel], default: BaseModel | None, prefix: str,
          out: list[str]) -> None:
    section_class = schema.config.loading._section_class
    for name, field in klass.model_fields.items():
        key = prefix + name
        sub = section_class(field.annotation)
        if default is not None:
            value = getattr(default, name)
        else:
            value = None if field.is_required() else field.get_default(call_default_factory=True)
        note = _cell(schema.note(klass, name))
        if sub is not None:
            optional = type(None) in get_args(field.annotation)
            kind = "section or null" if optional else "section"
            shown = "null (off)" if value is None else "(below)"
            doc = (sub.__doc__ or "").strip()
            if doc and sub.__doc__ != BaseModel.__doc__ and sub is not klass:
                doc = " ".join(doc.split())
                note = f"{note}. {doc}" if note and not note.endswith(".") else \
                    f"{note} {doc}".strip()
            out.append(f"| `{key}` | {kind} | {shown} | | {_cell(note)} |")
            _rows(schema, sub, value, key + ".", out)
            continue
        default_text = "**required**" if default is None and field.is_required() \
            else f"`{_cell(_value(value))}`"
        ranges = []
        literals = _literals(field.annotation)
        if literals:
            ranges.append(", ".join(f"`{_value(v)}`" for v in literals))
        bounds = _bounds(field.metadata or _metadata(field.annotation))
        if bounds:
            ranges.append(bounds)
        ranges += _validators(field.annotation, field.metadata)
        for k in klass.__mro__:
            if (k.__name__, name) in schema.registries:
                ranges.append(schema.registries[(k.__name__, name)])
                break
        out.append(f"| `{key}` | {_cell(_type_name(field.annotation))} | {default_text} | "
                   f"{_cell('; '.join(ranges))} | {note} |")


HEADER = """\
# Configuration reference

<!-- Generated by tools/gen_config_docs.py from src/seekrl/config/: do not edit by hand.
     Rerun `.venv/bin/python tools/gen_config_docs.py` after changing the schema. -->

Every key of every recipe's config: its type, default, allowed range and what it does, as
the schema in `src/seekrl/config/schema.py` declares them. A config is a YAML file
(`--config FILE`) with `key.sub=value` overrides on top, read as YAML scalars
(`optim.lr=1e-5`, `'algo={advantage: rloo}'`, `eval.data=null`; Python's `None`, unquoted, is
null too, in a file as well). An unknown key, a value of
the wrong type or one out of range is an error naming the key, before any model loads.
`--print-config` prints the resolved config, every key with its note, and stops.

Nested keys are written with dots (`algo.clip_high`); in YAML they are sections
(`algo: {clip_high: 0.28}`). A section given in part keeps the recipe's defaults for the keys
it leaves out. A section whose default is `null (off)` is switched on by giving it
(`simulator: {model: smollm2-135m}`, or on the command line `simulator.model=...`); its keys
below show the defaults it then takes. Ranges: `[a, b]` includes both ends, `(a, b)`
neither.

"""


def render() -> str:
    schema = Schema()
    parts = [HEADER]
    parts.append("| command | config class | |\n| --- | --- | --- |\n")
    for command, name, what in RECIPES:
        anchor = command.replace(" ", "-")
        parts.append(f"| [`{command}`](#{anchor}) | `seekrl.config.{name}` | {what} |\n")
    for command, name, what in RECIPES:
        klass = getattr(schema.config, name)
        doc = " ".join((klass.__doc__ or "").split()) if klass.__doc__ != \
            BaseModel.__doc__ else ""
        parts.append(f"\n## `{command}`\n\n{what}")   # its slug is the anchor, here and on GitHub
        if doc:
            parts.append(f" {doc}")
        parts.append(f"\n\n`seekrl.config.{name}`; `{command} --help` lists the command's "
                     "own options.\n\n")
        rows = ["| key | type | default | range | description |",
                "| --- | --- | --- | --- | --- |"]
        _rows(schema, klass, None, "", rows)
        parts.append("\n".join(rows) + "\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed page differs from the schema's")
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run .venv/bin/python tools/gen_config_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
