"""Configs for the recipes: pydantic models, YAML files, `key.sub=value` overrides.

Every recipe (`seekrl sft`, `seekrl train`) reads one YAML file into one of the models in
`schema.py`; command-line overrides such as `optim.lr=1e-5 rollout.temperature=0.8` are
applied on top (`loading.py`). Unknown keys and bad values are errors that name the key
(`algo.clip_lo: unknown key; expected one of ... (did you mean clip_low?)`), never silently
ignored.

- `fields.py`: the base class `Strict` and the value types the sections share (device,
  dtype, prompt, an episode's limits and their defaults)
- `schema.py`: the sections and the recipes' configs
- `loading.py`: YAML files, dotted keys and overrides, the error text
- `printing.py`: the config as `--print-config` prints it, each key with its note

Import from here: `from seekrl.config import TrainConfig, load_config`.
"""

from seekrl.config.fields import (
    ATTENTION,
    CUDA_ONLY_ATTENTION,
    DATA_PROMPT,
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_INFO_TOKENS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_TOTAL_TOKENS,
    DEFAULT_MAX_TURNS,
    DEFAULT_TOPK,
    DTYPE_NAMES,
    PROMPT_PRESETS,
    Attention,
    Device,
    Dtype,
    EpisodeBatch,
    MaxInfoTokens,
    MaxNewTokens,
    MaxTotalTokens,
    MaxTurns,
    Prompt,
    Strict,
    TopK,
    attention_refusal,
    prompt_template,
)
from seekrl.config.loading import (
    build_config,
    dump_config,
    flat_keys,
    load_config,
    merged,
    parse_override,
    read_config_file,
    set_dotted,
    with_keys,
)
from seekrl.config.printing import annotated_yaml, field_notes
from seekrl.config.schema import (
    AlgoConfig,
    EpisodeSettings,
    EvalConfig,
    LabelConfig,
    LogConfig,
    LoRAConfig,
    MonitorConfig,
    OptimConfig,
    PRMConfig,
    ProragConfig,
    RankerSettings,
    RankerTrainConfig,
    RefineConfig,
    RewardConfig,
    RLOptimConfig,
    RolloutSettings,
    SearchSettings,
    SFTConfig,
    SimulatorSettings,
    SimulatorTrainConfig,
    TrainConfig,
    TreeSettings,
)
from seekrl.errors import ConfigError  # also imported from here by user code

__all__ = [
    "ATTENTION", "CUDA_ONLY_ATTENTION", "DATA_PROMPT", "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_INFO_TOKENS", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_MAX_TOTAL_TOKENS",
    "DEFAULT_MAX_TURNS", "DEFAULT_TOPK", "DTYPE_NAMES", "PROMPT_PRESETS",
    "AlgoConfig", "Attention", "ConfigError", "Device", "Dtype", "EpisodeBatch",
    "EpisodeSettings", "EvalConfig", "LabelConfig", "LoRAConfig", "LogConfig", "MaxInfoTokens",
    "MaxNewTokens", "MaxTotalTokens", "MaxTurns", "MonitorConfig", "OptimConfig", "PRMConfig",
    "Prompt", "ProragConfig", "RLOptimConfig", "RankerSettings", "RankerTrainConfig",
    "RefineConfig", "RewardConfig", "RolloutSettings", "SFTConfig", "SearchSettings",
    "SimulatorSettings", "SimulatorTrainConfig", "Strict", "TopK", "TrainConfig",
    "TreeSettings", "annotated_yaml", "attention_refusal", "build_config", "dump_config",
    "field_notes", "flat_keys", "load_config", "merged", "parse_override", "prompt_template",
    "read_config_file", "set_dotted", "with_keys",
]
