"""The value types the config sections share, and the base class every section builds on.

`Strict` refuses unknown keys, inf / nan, and true / false for a number. The types (a device,
a dtype, a prompt, an episode's limits) carry their range and check once, for every section
that takes them.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from seekrl.runtime import (  # noqa: F401  (the attention names, with the schema's other types)
    ATTENTION,
    CUDA_ONLY_ATTENTION,
    Attention,
    attention_refusal,
)

# An episode's limits by default: `EpisodeSettings`'s (schema.py), the one type of the episode
# settings; the recipes' helpers that take one of them alone (SFT's tokenisation) default
# to the same.
DEFAULT_MAX_TURNS = 4          # model turns per episode
DEFAULT_MAX_NEW_TOKENS = 128   # generated tokens per turn
DEFAULT_MAX_TOTAL_TOKENS = 2048
DEFAULT_MAX_INFO_TOKENS = 384  # token cap of one <information> block
DEFAULT_TOPK = 3               # documents per search
DEFAULT_BATCH_SIZE = 32        # episodes generating together


def _leaf_types(annotation: Any) -> set:
    """The types a value of `annotation` may have: through Annotated, unions and Literal."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_leaf_types(a) for a in get_args(annotation)))
    if origin is Literal:
        return {type(v) for v in get_args(annotation)}
    return {annotation}


def _yes_for_a_number(annotation: Any, value: Any) -> bool | None:
    """The true / false given where `annotation` wants a number (at the top, or as an item
    of a list, tuple or mapping it holds), else None."""
    if isinstance(value, bool):
        kinds = _leaf_types(annotation)
        return value if bool not in kinds and kinds & {int, float} else None
    for kind in _leaf_types(annotation):
        origin, args = get_origin(kind), get_args(kind)
        if origin in (list, tuple) and isinstance(value, (list, tuple)) and args:
            items = args[:-1] if len(args) == 2 and args[1] is Ellipsis else args
            for i, item in enumerate(value):
                bad = _yes_for_a_number(items[min(i, len(items) - 1)], item)
                if bad is not None:
                    return bad
        elif origin is dict and isinstance(value, dict) and len(args) == 2:
            for item in value.values():
                bad = _yes_for_a_number(args[1], item)
                if bad is not None:
                    return bad
    return None


# fields that name a file, folder, model or server: never the empty string
_PATH_FIELDS = frozenset({"model", "data", "out", "index", "prm", "sft_model", "sft_data",
                          "train", "test", "presets", "teacher", "retriever"})


class Strict(BaseModel):
    # inf and nan are refused everywhere: no setting means "unbounded" by them, and a
    # nan weight or schedule poisons a run silently
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yes_for_numbers(cls, value: Any, info) -> Any:
        """`steps: true` is a slip, not 1: a number field takes no true / false (nor does a
        number inside one: `optim.betas: [true, 0.9]`, `reward.process: {evidence: yes}`)."""
        if info.field_name in cls.model_fields:
            bad = _yes_for_a_number(cls.model_fields[info.field_name].annotation, value)
            if bad is not None:
                raise ValueError(f"expected a number, got {bad}")
        if info.field_name in _PATH_FIELDS and isinstance(value, str) and not value.strip() \
                and type(None) not in get_args(cls.model_fields[info.field_name].annotation):
            # `out=` is the current folder, `model=` no model: a slip, not a setting (where
            # None is a setting, `eval.data=` stays the way to say none)
            raise ValueError("expected a path or name, got an empty string (leave the key "
                             "out for its default)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _sections_over_the_recipes_defaults(cls, data: Any) -> Any:
        """A section given in part (`optim: {lr: 2e-6}`, `--set optim.lr=2e-6`) keeps what
        the recipe's own default for it sets (RL's `schedule: constant`, labelling's
        `temperature: 0.9`) for the keys it does not give, instead of falling back to the
        section class's defaults (cosine, 1.0) unsaid."""
        if not isinstance(data, dict):
            return data
        merged = None
        for name, field in cls.model_fields.items():
            default, given = field.default, data.get(name)
            if not (isinstance(default, BaseModel) and isinstance(given, dict)):
                continue
            keep = {k: v for k, v in default.model_dump(include=default.model_fields_set).items()
                    if k not in given}
            if keep:
                merged = merged if merged is not None else dict(data)
                merged[name] = {**keep, **given}
        return merged if merged is not None else data



def _usable_device(value: str) -> str:
    """Configs name a device that exists here, checked when the config loads (seconds),
    not when the model does (minutes)."""
    if value == "cpu":
        return value
    from seekrl.runtime import device_problem  # imports torch: only for other devices

    problem = device_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Device = Annotated[str, AfterValidator(_usable_device)]

# the names `dtype` takes (models.DTYPES and models.MIXED, without importing torch here)
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "bf16-mixed")


def _known_dtype(value: str) -> str:
    if value not in DTYPE_NAMES:
        raise ValueError(f"expected one of {', '.join(DTYPE_NAMES)}, got {value!r}")
    return value


# checked when the config loads (and by --print-config), not when the model does
Dtype = Annotated[str, AfterValidator(_known_dtype)]


# An episode's limits, each range written once: `EpisodeSettings` and the `eval:` section
# (which may set a few of them apart for evaluation) take these types.
MaxTurns = Annotated[int, Field(ge=1)]          # model turns per episode
MaxNewTokens = Annotated[int, Field(ge=1)]      # generated tokens per turn
MaxTotalTokens = Annotated[int, Field(ge=16)]   # prompt + everything after it
MaxInfoTokens = Annotated[int, Field(ge=8)]     # token cap of one <information> block
TopK = Annotated[int, Field(ge=1)]              # documents per search
EpisodeBatch = Annotated[int, Field(ge=1)]      # episodes generating together


# The agent's prompt (`prompt:` of the rollout, SFT and eval settings): a preset of
# agent/protocol.py's PROMPTS, `data` (each question's own prompt, e.g. a Search-R1
# parquet's `prompt` column), `file:PATH` (an instruction template in a UTF-8 file) or an
# instruction template itself; a template holds `{question}` exactly once.
PROMPT_PRESETS = ("seekrl", "search_r1")
DATA_PROMPT = "data"


def prompt_template(spec: str) -> str | None:
    """The instruction template a `prompt` setting gives (a file's text, or the setting
    itself); None for a preset or `data`. A bad setting is a ValueError saying why."""
    if spec in PROMPT_PRESETS or spec == DATA_PROMPT:
        return None
    template, source = spec, ""
    if spec.startswith("file:"):
        path = Path(spec[len("file:"):]).expanduser()
        try:
            template = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the prompt file {path} ({e})") from None
        source = f" (the text of {path})"
    if template.count("{question}") != 1:
        raise ValueError(f"expected a preset ({', '.join(PROMPT_PRESETS)}), {DATA_PROMPT!r}, "
                         f"file:PATH or a template holding {{question}} exactly once; got "
                         f"{template[:60]!r}{source}")
    return template


def _check_prompt(value: str) -> str:
    prompt_template(value)
    return value


Prompt = Annotated[str, AfterValidator(_check_prompt)]
