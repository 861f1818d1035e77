"""The configs of the recipes: one pydantic model per command (`SFTConfig`, `TrainConfig`,
...) and the sections they share (`EpisodeSettings`, `OptimConfig`, ...).

The comment beside a field is its description: `--print-config` and the generated
configuration reference (tools/gen_config_docs.py) print it (`printing.field_notes`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from seekrl.config.fields import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_INFO_TOKENS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_TOTAL_TOKENS,
    DEFAULT_MAX_TURNS,
    DEFAULT_TOPK,
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
)


class LoRAConfig(Strict):
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj",
                                 "gate_proj", "up_proj", "down_proj"]


# checked when the config is read (AdamW refused others only after the model loaded)
Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimConfig(Strict):
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Beta, Beta] = (0.9, 0.999)   # AdamW's (beta1, beta2), each in [0, 1)
    warmup_steps: int = Field(0, ge=0)
    # cosine decays over `steps`, or over `max_rollout_tokens` while that budget's share spent leads
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.0, ge=0, le=1)   # cosine decays to lr * min_lr_ratio
    max_grad_norm: float | None = Field(1.0, gt=0)



class EpisodeSettings(Strict):
    """How an episode is played: the method, the limits, the decoding. The one type of
    these settings: every config's `rollout:` section (RolloutSettings adds tree rollouts
    and the backend), the evaluations, `seekrl eval`'s options and the rollout engine
    (RolloutConfig adds one run's choices) take it."""
    method: Literal["agent", "rag", "direct"] = "agent"   # direct: one turn, no retriever
    prompt: Prompt = "seekrl"      # the agent's instruction: seekrl, search_r1, data, file:PATH, ...
    # tools beyond <search> (agent/tools.py): "open" (a shown document in full) or import
    # paths of your own
    tools: list[str] = []
    snippet_words: int | None = Field(None, ge=1)   # a search shows each document's first N words
    # parallel sub-queries (ParallelSearch): a search turn may hold up to this many queries
    # separated by ##, run in one batched retriever call (agent/protocol.py); 1: one query.
    # max_info_tokens is per query: a block of n sub-queries may hold n times as many
    max_queries: int = Field(1, ge=1, le=8)
    # self-search (SSRL): after a search the policy writes the <information> block itself
    # (the environment opens and closes the tags); those tokens are masked out of the loss
    # like retrieved ones, and evaluation searches the real index (sim-to-real)
    self_search: bool = False
    max_turns: MaxTurns = DEFAULT_MAX_TURNS
    max_new_tokens: MaxNewTokens = DEFAULT_MAX_NEW_TOKENS
    max_total_tokens: MaxTotalTokens = DEFAULT_MAX_TOTAL_TOKENS
    max_info_tokens: MaxInfoTokens = DEFAULT_MAX_INFO_TOKENS
    topk: TopK = DEFAULT_TOPK
    batch_size: EpisodeBatch = DEFAULT_BATCH_SIZE
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # how seekrl's decoding loop computes attention: default (the model's own), eager, or
    # sdpa_math / sdpa_efficient / sdpa_flash / sdpa_cudnn (PyTorch's SDPA held to that
    # backend); bench/decode_step.py measures which is fastest on a machine
    attention: Attention = "default"
    # continuous batching (backend static): an episode whose turn ended takes its tool call
    # and rejoins the decoding rows while the others go on, not at the next turn boundary.
    # Greedy episodes are the same; sampled ones draw in another order. Self-search plays
    # turn by turn
    continuous: bool = False

    def episode_settings(self) -> EpisodeSettings:
        """These settings alone: a `rollout:` section's without its tree and backend."""
        return EpisodeSettings(**{k: getattr(self, k) for k in EpisodeSettings.model_fields})


def _episode_keys_into_rollout(cls, data: Any, names: dict[str, str]) -> Any:
    """Episode settings given at the top level of a config, where they were before the
    config had a `rollout:` section (`max_queries=3`, ProRAG's `k: 2`), read into that
    section (`names`: old key -> its name there); one given in both places is refused."""
    if not isinstance(data, dict) or not any(old in data for old in names):
        return data
    data = dict(data)
    section = data.get("rollout")
    if section is None:   # the section's own default settings stay (ProRAG's topk 2)
        default = cls.model_fields["rollout"].default
        section = default.model_dump(include=default.model_fields_set)
    if not isinstance(section, dict):
        return data       # the schema says what is wrong with it
    section = dict(section)
    for old, new in names.items():
        if old not in data:
            continue
        value = data.pop(old)
        if new in section and isinstance(data.get("rollout"), dict):
            raise ValueError(f"{old}: the same setting as rollout.{new}; give it once, as "
                             f"rollout.{new}")
        # SFT's `max_new_tokens: null` meant "the rollouts' own"; any other null is a
        # value the section checks (`topk=null` had been dropped unsaid)
        if value is not None or old != "max_new_tokens":
            section[new] = value
    data["rollout"] = section
    return data


class EvalConfig(Strict):
    """Greedy evaluation of the policy as a search agent during and after training: it plays
    the run's episode settings (its `rollout:` section), with the limits below on top."""
    data: str | None = None        # QA file (JSONL / parquet); None: no evaluation
    # null: the run's own `index`; set: evaluations search this one (a folder or a server
    # url), e.g. dev questions of another corpus than the training questions'
    index: str | None = None
    n: int = Field(32, ge=1)       # first n questions of it
    # every N steps (0: only at the end): SFT's optimizer steps, RL's steps (each of
    # algo.epochs x mini-batch updates)
    every: int = Field(0, ge=0)
    at_start: bool = True          # also the starting policy (eval/start), unless resuming
    # K > 0: each evaluation also samples K episodes a question at the rollout temperature
    # (eval/NAME/sampled): pass@1 and pass@K, what sampling finds beside the greedy answer
    samples: int = Field(0, ge=0)
    # null: the run's own (rollout.max_turns); set: evaluations play this many turns instead
    max_turns: MaxTurns | None = None
    max_new_tokens: MaxNewTokens | None = None   # null: the run's own (rollout.max_new_tokens)
    batch_size: EpisodeBatch | None = None       # null: the run's own (rollout.batch_size)
    # also save the policy whose evaluation EM is the highest so far (the start too, with
    # at_start; a tie keeps the earlier) as RUN/best, with that evaluation's figures:
    # early stopping on the dev curve, since a run that moves the policy can overshoot
    # (the summary names its step)
    keep_best: bool = False


class SFTConfig(Strict):
    model: str = "smollm2-135m"
    data: str                      # trajectory JSONL: oracle episodes or Trajectory records
    out: str = "runs/sft"
    index: str | None = None       # for the dev evaluation
    dtype: Dtype = "float32"
    device: Device = "cpu"
    seed: int = 0
    limit: int | None = Field(None, ge=1)      # first N usable episodes
    only_complete: bool = True     # skip oracle episodes that never found a gold document
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)  # optimizer steps; overrides epochs
    # episodes per micro-batch, and micro-batches per optimizer step: 8 episodes a step as
    # 2 x 4 (the same gradient: the loss is normalised over the step's tokens); one
    # forward of 8 peaked at 10.4 GB on the 135M model, 2 x 4 at 3.4 GB
    batch_size: int = Field(2, ge=1)
    grad_accum: int = Field(4, ge=1)
    max_len: int = Field(2048, ge=16)          # longer episodes are cut (the tail is lost)
    # the loss weight of the first thought's lookup plan ("N lookups" of "To answer this I
    # need N lookups"), the loss a weighted mean over policy tokens; 1: every token alike
    plan_weight: float = Field(1.0, ge=0)
    # draw each epoch's episodes evenly over question groups of the data's metadata: hops
    # (1, 2, 3), type (single, bridge, comparison) or kind (bridge-2); null: each once
    balance_types: Literal["hops", "type", "kind"] | None = None
    # with balance_types: each group's share, by label ({1: 2, 2: 1, 3: 1}); null: equal
    type_weights: dict[str, float] | None = None
    # the episodes as the trained policy will play them (the RL run's rollout:): laid out
    # with their prompt, max_info_tokens and max_queries (seekrl oracle --max-queries),
    # turns over max_new_tokens warned about (rollouts cut them), played by the dev
    # evaluation. topk, prompt, max_info_tokens, max_queries, max_new_tokens at the top
    # level are read into it
    rollout: EpisodeSettings = EpisodeSettings()
    train_layers: int | None = Field(None, ge=1)   # train only the top N blocks (None: all)
    lora: LoRAConfig = LoRAConfig()
    optim: OptimConfig = OptimConfig(lr=5e-5, warmup_steps=5)
    eval: EvalConfig = EvalConfig()
    # checkpoint every N steps (0: final only): weights, optimizer, schedule, random
    # states and the data position; --resume continues from the latest. A checkpoint holds
    # the model, the trained weights and Adam's two moments (~2 GB for 135M trained whole)
    save_every: int = Field(50, ge=0)
    keep_last: int = Field(2, ge=1)            # checkpoints kept on disk
    log_every: int = Field(1, ge=1)

    # the old top-level keys read into rollout: (their errors name the key as written)
    moved_keys: ClassVar[dict[str, str]] = {
        k: k for k in ("topk", "prompt", "max_info_tokens", "max_queries", "max_new_tokens")}

    @model_validator(mode="before")
    @classmethod
    def _flat_episode_keys(cls, data: Any) -> Any:
        return _episode_keys_into_rollout(cls, data, cls.moved_keys)

    @field_validator("type_weights", mode="before")
    @classmethod
    def _labels_are_text(cls, value: Any) -> Any:
        # YAML reads `{1: 2}` with int keys; the hops labels are text ("1")
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("type_weights")
    @classmethod
    def _weights_not_negative(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and any(w < 0 for w in value.values()):
            raise ValueError("a weight is negative (0 leaves a group out)")
        return value

    @model_validator(mode="after")
    def _attention_here(self):
        if self.type_weights is not None and self.balance_types is None:
            raise ValueError("type_weights weighs the groups of balance_types: set "
                             "balance_types (hops, type or kind)")
        return _attention_runs_here(self)

    @field_validator("rollout")
    @classmethod
    def _no_rows(cls, value: EpisodeSettings) -> EpisodeSettings:
        if value.continuous:   # SFT's dev evaluations decode with hf, by batches
            raise ValueError("continuous: batching by rows is the static backend's, which "
                             "SFT's evaluations do not use; leave it out here")
        return value


class TreeSettings(Strict):
    """Tree rollouts (Tree-GRPO style): per question, `trees` chains, then `rounds` rounds in
    which each tree grows `branches` new leaves, each continuing a prefix of one of its
    leaves cut at a random step boundary. Leaves share their prefix's tokens, which are
    generated once. A question's group has trees x (1 + branches x rounds) leaves."""
    trees: int = Field(2, ge=1)
    branches: int = Field(1, ge=1)
    rounds: int = Field(1, ge=1)

    @property
    def leaves(self) -> int:
        return self.trees * (1 + self.branches * self.rounds)


def _attention_runs_here(cfg):
    """A config's `rollout.attention` against its `device` (the configs whose episodes
    decode with seekrl's loop: SFTConfig's dev evaluation, TrainConfig, LabelConfig,
    RefineConfig)."""
    why = attention_refusal(cfg.rollout.attention, cfg.device)
    if why:
        raise ValueError(f"rollout.attention: {why}")
    return cfg


class RolloutSettings(EpisodeSettings):
    """The `rollout:` section of a config: the episode settings (above), then tree rollouts
    and the generation backend."""
    tree: TreeSettings | None = None   # tree rollouts instead of group_size chains
    # hf: seekrl's decoding loop on the policy itself; vllm: a colocated vLLM engine that
    # gets the policy's weights before each rollout (agent/vllm_backend.py; needs vllm);
    # static: a fixed-shape loop for GPUs (CUDA graphs; agent/static_backend.py)
    backend: Literal["hf", "vllm", "static"] = "hf"
    vllm_gpu_memory: float = Field(0.4, gt=0, lt=1)   # the share of GPU memory vLLM takes
    # free vLLM's GPU memory during each update: 1 offloads its weights to CPU memory and
    # drops its KV cache, 2 drops both (the next sync pushes the weights anyway); 0: never
    vllm_sleep: Literal[0, 1, 2] = 0

    @model_validator(mode="after")
    def _backend_options(self):
        if self.attention != "default" and self.backend != "hf":
            raise ValueError(f"attention: {self.attention!r} sets seekrl's decoding loop "
                             f"(backend hf); {self.backend} chooses its own attention")
        if self.continuous and self.backend != "static":
            raise ValueError(f"continuous: batching by rows is the static backend's "
                             f"(rollout.backend: static), not {self.backend}'s")
        return self


class SearchSettings(Strict):
    """Step labelling (`seekrl mcts`, recipes/mcts.py)."""
    method: Literal["mcts", "mc"] = "mcts"
    simulations: int = Field(16, ge=1)      # mcts: rollouts per question (the budget)
    expansions: int = Field(4, ge=1)        # mcts: continuations sampled per expansion (K)
    c_puct: float = Field(2.5, ge=0)
    gamma: float = Field(0.99, ge=0, le=1)  # discount per step in the backup
    samples: int = Field(4, ge=1)           # mc: episodes per question
    mc_samples: int = Field(4, ge=1)        # mc: continuations per step
    min_visits: int = Field(2, ge=1)        # pair rule: both siblings visited this often
    min_gap: float = Field(0.2, ge=0)       # pair rule: Q(better) - Q(worse) at least this
    trees_per_batch: int = Field(16, ge=1)  # questions searched together (one chunk)
    # stop at about this many generated tokens (both methods): MC and MCTS labels compared at
    # equal compute (at equal simulations MC labels cost 35-41% more tokens); the last chunk
    # labels only the questions the budget has left, at the tokens per question so far
    max_tokens: int | None = Field(None, ge=1)


class LabelConfig(Strict):
    model: str = "smollm2-135m"        # the policy that plays (usually the SFT checkpoint)
    data: str                          # questions (QA JSONL / parquet)
    index: str | None = None
    retriever: str | None = None       # your own by import path (TrainConfig.retriever)
    out: str = "runs/labels"
    questions: int | None = Field(None, ge=1)   # first N questions of `data`
    reward: str = "f1"                 # outcome reward of an episode: em | f1 | cover_em
    dtype: Dtype = "float32"
    device: Device = "cpu"
    seed: int = 0
    search: SearchSettings = SearchSettings()
    rollout: RolloutSettings = RolloutSettings(temperature=0.9)   # ProRAG samples at 0.9

    @model_validator(mode="after")
    def _attention_here(self):
        return _attention_runs_here(self)


class PRMConfig(Strict):
    """`seekrl prm train` (recipes/prm.py)."""
    # the backbone to start from; default: the policy that wrote the labels (their
    # config.yaml's model, usually the SFT checkpoint). Any HF id or path with the same
    # tokenizer: the labels are token ids
    model: str | None = None
    labels: list[str]                  # label folders written by `seekrl mcts`
    out: str = "runs/prm"
    loss: Literal["pointwise", "pairwise", "both"] = "both"
    steps: int = Field(100, ge=1)
    batch_size: int = Field(8, ge=1)   # labelled steps and pairs per step (each)
    dev_share: float = Field(0.1, ge=0, lt=1)   # questions held out for the quality figures
    threshold: float = Field(0.5, gt=0, lt=1)   # Q at or above it counts as a good step
    head_lr_factor: float = Field(10.0, gt=0)   # the scalar head learns this much faster
    train_layers: int | None = Field(None, ge=1)
    lora: LoRAConfig = LoRAConfig()
    optim: OptimConfig = OptimConfig(lr=2e-5, warmup_steps=2)
    dtype: Dtype = "float32"
    device: Device = "cpu"
    seed: int = 0
    eval_every: int = Field(0, ge=0)
    eval_at_start: bool = True
    log_every: int = Field(10, ge=1)
    save_every: int = Field(0, ge=0)   # a loadable PRM in out/checkpoints/step-N (0: final only)
    keep_last: int = Field(2, ge=1)    # checkpoints kept on disk

    @field_validator("labels", mode="before")
    @classmethod
    def _one_or_many(cls, value):
        return [value] if isinstance(value, str) else value


class RefineConfig(Strict):
    """`seekrl refine` (recipes/refine.py): RFT filtered by a PRM, or step-level DPO on pairs."""
    model: str = "smollm2-135m"        # the policy to refine (usually the SFT checkpoint)
    method: Literal["rft", "step_dpo"] = "rft"
    out: str = "runs/refine"
    # rft: sample, keep, fine-tune
    data: str | None = None            # questions to sample on
    index: str | None = None
    retriever: str | None = None       # your own by import path (TrainConfig.retriever)
    prm: str | None = None             # a `seekrl prm train` folder (None: right answers only)
    # rft: the policy that samples the episodes, a path or hub id (None: model itself); model
    # is the one fine-tuned. With another tokenizer than model's, the kept episodes are
    # written as text turns (docs/trajectory-format.md)
    teacher: str | None = None
    questions: int | None = Field(None, ge=1)
    samples: int = Field(4, ge=1)      # episodes per question
    reward: str = "em"
    min_outcome: float = 1.0           # keep episodes whose outcome reaches this
    threshold: float = Field(0.5, ge=0, le=1)   # ... and whose every step scores this
    # or: a threshold per step count, this quantile of the lowest step scores of the right
    # episodes with as many steps (PRMs trained on soft Q score a weak policy far below 0.5
    # everywhere; minima of like length keep ~1 - q of each, see recipes/refine.py)
    threshold_quantile: float | None = Field(None, ge=0, lt=1)
    max_per_question: int = Field(2, ge=1)
    rollout: RolloutSettings = RolloutSettings(temperature=0.9)
    # step_dpo
    pairs: list[str] = []              # label folders with pairs.jsonl
    beta: float = Field(0.1, gt=0)
    # training (both)
    # rft with 0: sample and filter only; rft_data.jsonl is rejection-sampled SFT data for
    # real questions (`seekrl sft data=OUT/rft_data.jsonl`)
    steps: int = Field(20, ge=0)
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)   # micro-batches of batch_size per optimizer step
    save_every: int = Field(10, ge=0)  # rft: a checkpoint of the fine-tuning every N steps,
                                       # for --resume (0: the final policy only)
    train_layers: int | None = Field(None, ge=1)
    lora: LoRAConfig = LoRAConfig()
    optim: OptimConfig = OptimConfig(lr=2e-5, warmup_steps=2)
    dtype: Dtype = "float32"
    device: Device = "cpu"
    seed: int = 0

    @model_validator(mode="after")
    def _dpo_trains(self):
        if self.method == "step_dpo" and self.steps == 0:
            raise ValueError("steps: step_dpo needs at least 1 step (steps: 0 is for rft: "
                             "sample and filter only)")
        return _attention_runs_here(self)

    @field_validator("pairs", mode="before")
    @classmethod
    def _one_or_many(cls, value):
        return [value] if isinstance(value, str) else value


class RewardConfig(Strict):
    outcome: str = "em"                 # a registered outcome reward: em | f1 | cover_em
    # your own episode reward by import path, `mypkg.rewards:judge`: f(trajectory) ->
    # RewardParts, as Trainer(reward_fn=...); it replaces outcome, format_reward and the
    # penalties below (None: those make the reward)
    fn: str | None = None
    # added for a valid protocol trace (an invalid turn costs invalid_penalty). Not 0 by
    # default: with outcome alone, an episode that broke the protocol (a turn ended on EOS
    # with no tag, was corrected, then answered right) scored as much as a clean one, and
    # the demo's RL lost the format (valid 0.85 -> 0.53) while EM held; 0.1 / 0.1 kept it
    format_reward: float = 0.1
    # penalties are subtracted, so below 0 they pay: -0.1 would reward invalid turns
    invalid_penalty: float = Field(0.1, ge=0)
    max_turns_penalty: float = Field(0.0, ge=0)   # subtracted when the episode ran out of turns / tokens
    # subtracted per model turn (ParallelSearch's cost of LLM calls: with rollout.max_queries > 1,
    # one turn of several sub-queries costs less than as many turns of one)
    turn_cost: float = Field(0.0, ge=0)
    # added: this x the share of the episode's gold documents its searches found (evidence
    # recall), so that in a group where every episode answered wrong the one that made
    # every hop still ranks above the one that stopped early (the `recall` method: 0.5)
    recall_bonus: float = Field(0.0, ge=0)
    # added: this x how well the episode's number of lookups (retriever queries) fits its
    # question's hop count (metadata.hops): 1 - |lookups - hops| / hops, at least 0 (the
    # `hops` method: 0.5)
    hop_bonus: float = Field(0.0, ge=0)
    # added: this x how well the episode's number of lookups keeps the plan its first
    # thought states ("To answer this I need N lookups", the oracle's warm-up):
    # 1 - |lookups - N| / N, at least 0; none for an episode that states no plan (the
    # `plan` method: 0.5). Needs no hop count from the data
    plan_bonus: float = Field(0.0, ge=0)
    # process (step) rewards: source name -> weight, e.g. {evidence: 1.0, redundancy: 0.1};
    # sources: evidence, gold_found, redundancy, step_format, decomposition, mc_value, prm
    # (rewards/process.py), or your
    # own by import path, {mypkg.steps:novelty: 0.5}
    process: dict[str, float] = {}
    mc_samples: int = Field(4, ge=1)    # mc_value: continuations per step prefix
    prm: str | None = None              # prm: a `seekrl prm train` folder (its final/)

    @field_validator("process")
    @classmethod
    def _finite_weights(cls, value: dict[str, float]) -> dict[str, float]:
        import math

        for name, weight in value.items():
            if not math.isfinite(weight):
                raise ValueError(f"weight of {name!r} must be a finite number")
        return value


class AlgoConfig(Strict):
    advantage: str = "dr_grpo"          # a registered estimator (or your own by import path,
                                        # mypkg.credit:median_baseline); gae: PPO with a critic
                                        # (dr_grpo: GRPO without the std, which collapsed
                                        # one of two long runs in bench/RESULTS.md)
    policy_loss: str = "ppo_clip"       # a registered policy loss (rl/loss.py POLICY_LOSSES):
                                        # ppo_clip, PPO's clipped surrogate with dual clip
    epochs: int = Field(1, ge=1)        # passes over each batch (K)
    mini_batch_size: int = Field(32, ge=1)   # episodes per optimizer step (at most; split evenly)
    micro_batch_size: int = Field(8, ge=1)   # episodes per forward/backward (at most)
    # ... and at most this many padded tokens (episodes x the longest one) per forward, so
    # memory follows the batch's tokens, not its episode count; None: episodes only
    micro_batch_tokens: int | None = Field(None, ge=1)
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.28, ge=0)
    clip_ratio_c: float | None = Field(3.0, gt=1)   # dual clip: cap -A x c on negative A
    # truncated importance sampling between the rollout backend and the trainer: each
    # token's policy gradient x min(pi_trainer / pi_rollout, tis_cap) (None: off; 2 is
    # the usual cap). Needs the backend's log-probs (sampled rollouts, both backends)
    tis_cap: float | None = Field(None, gt=0)
    # the PPO ratio's denominator when a step makes several updates: recompute (a forward
    # pass over the batch, the trainer's own numbers: the first ratio is 1 to the last bit)
    # or rollout (the sampler's log-probs, kept with each episode: no extra pass; the first
    # ratio is 1 up to the two computations' difference: rounding in float32 with seekrl's
    # backends, more in bfloat16 or with vLLM, where the clip then centres on the sampler;
    # rollout_logp_gap shows it). Needs top_p 1
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    loss_agg: str = "token-mean"       # seq-mean-token-sum-norm is Dr. GRPO's (sum per episode
                                       # / rollout.max_turns x rollout.max_new_tokens)
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k3"] = "k3"
    kl_in_reward: bool = False          # subtract kl_coef x KL per token from the rewards
                                        # (reinforce_pp / gae) instead of a loss term
    entropy_coef: float = Field(0.0, ge=0)
    dynamic_sampling: bool = False      # drop zero-variance groups and refill
    max_refills: int = Field(2, ge=0)
    balance_types: bool = True          # draw questions round-robin over metadata["type"]
    # false: an invalid turn's tokens (a turn without a protocol tag, an unclosed tag, its
    # EOS) never get a positive advantage: the episode succeeded in spite of them, and an
    # outcome advantage would teach them with the rest of a right episode
    credit_invalid_turns: bool = False
    # true: the estimator's advantage is split into the outcome's part (EM's, or a reward
    # function's `RewardParts.outcome`), which reaches only the tokens of the answer itself
    # (the answer turn's tokens after its <answer> tag), and the part the rest of the reward
    # makes (bonuses, format, penalties), which reaches every policy token; so whether to
    # search again is taught by the bonuses alone
    answer_credit: bool = False
    value_coef: float = Field(0.5, ge=0)
    value_clip: float | None = Field(0.2, gt=0)
    value_lr: float | None = Field(None, gt=0)   # critic head lr (default: optim.lr * 10)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    # step-level estimators (rl/advantages.py)
    std_norm: bool = False              # episode-level part of the step estimators: / std
    beta: float = Field(0.3, ge=0)      # dual_granularity: weight of the normalised step score
    # dual_granularity: group: each process source standardised over the group's steps it
    # judges (ProRAG); none: its raw value on the step's tokens (StepSearch-like step rewards,
    # not propagated to earlier steps). Standardised, a search that finds nothing gets a
    # negative term where an episode that stopped instead gets nothing, which marks extra
    # searches down; raw, only redundancy does (not for prm / mc_value: every step, in [0, 1])
    process_norm: Literal["group", "none"] = "group"
    step_weight: float = Field(1.0, ge=0)    # gigpo: weight of the step-level advantage
    step_gamma: float = Field(0.95, ge=0, le=1)   # gigpo: discount per step
    anchor: Literal["queries", "docs"] = "queries"  # gigpo: what makes two states equal
    anchor_similarity: float | None = Field(None, gt=0, lt=1)  # gigpo: fuzzy query match
    alpha: float = Field(0.5, ge=0, le=1)    # stratified_grpo: within-stratum weight
    # LLDS (Deng et al., 2025): a term that keeps non-negative-advantage actions whose
    # likelihood fell from falling further, on the tokens that fell (0: off); it acts
    # once an update has moved the policy, so it needs several mini-batches or epochs
    llds_coef: float = Field(0.0, ge=0)
    llds_gate: Literal["action", "response"] = "action"   # whose likelihood decides
    epsilon: float = Field(1e-6, ge=0)       # added to a std before dividing by it
    whiten: bool = True                      # gae: whiten advantages over the batch's tokens
    logprob_chunk: int = Field(8, ge=1)  # episodes per no-grad forward for old / ref log-probs
    share_prompts: bool = True           # one prompt pass per group in the update (same math)


class MonitorConfig(Strict):
    enabled: bool = True
    stop_on_collapse: bool = False
    window: int = Field(5, ge=2)                   # steps in the recent / baseline windows
    grad_norm_factor: float = Field(10.0, gt=1)    # explosion: > factor x baseline median
    entropy_floor_ratio: float = Field(0.2, gt=0, lt=1)  # collapse: < ratio x baseline
    valid_format_drop: float = Field(0.3, gt=0, le=1)    # absolute drop from baseline
    correct_logp_drop: float = Field(0.01, gt=0)   # nats/token the right episodes lose
                                                   # per update (mean over the window)
    # right episodes measured again after each update (a no-grad forward each) for
    # correct_logp_shift, the likelihood-displacement signal; 0: not measured
    displacement_episodes: int = Field(4, ge=0)
    type_reward_drop: float = Field(0.3, gt=0, le=1)     # a question type's reward falls
    searches_drift: float = Field(0.5, gt=0)             # relative change of searches/episode
    # warn when one question kind's lookups an episode (sampled, or greedy at an
    # evaluation) move this far (absolute) from that kind's own start (0: never)
    hop_drift: float = Field(0.5, ge=0)
    no_signal_steps: int = Field(3, ge=1)          # steps in a row with no group's rewards varying
    # warn when the share of groups whose rewards varied averages below this over a window
    # of steps (0: never)
    low_signal: float = Field(0.2, ge=0, le=1)
    # warn when a greedy evaluation answers all of its yes/no questions (at least this
    # many) the same way while the golds hold both (0: never)
    constant_answer_min: int = Field(8, ge=0)
    # search collapse: searches per episode fall towards one on multi-hop data (a collapse
    # once the multi-hop reward falls too)
    search_floor: float = Field(1.25, gt=0)        # searches at or below this count as "one"
    searches_drop: float = Field(0.3, gt=0)        # absolute fall from the first step
    multihop_drop: float = Field(0.05, ge=0)       # multi-hop reward below baseline by this


class LogConfig(Strict):
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "seekrl"
    save_rollouts: int = Field(0, ge=0)   # every N steps, RUN_DIR/rollouts/step-N (0: never)


class RLOptimConfig(OptimConfig):
    """The RL update's optimiser: a few warm-up steps by default. AdamW's first steps move
    every weight by about lr x sign(gradient), signal or noise alike; with warmup 0 the
    demo's first update broke the format of a third of its episodes."""
    warmup_steps: int = Field(3, ge=0)


class SimulatorSettings(Strict):
    """Simulated search (ZeroSearch, retrieval/simulated.py): a causal LM writes each
    search's documents during training rollouts; evaluation searches the real `index`."""
    switch: ClassVar[str] = "model"    # the key that turns the section on from the command line
    model: str = "smollm2-135m"        # any HF causal LM (a `seekrl simulator train` final/)
    # the share of queries answered with noisy documents rises from noise_start to noise_end
    # over the run's steps along ZeroSearch's exponential curve with this base
    noise_start: float = Field(0.0, ge=0, le=1)
    noise_end: float = Field(0.5, ge=0, le=1)
    noise_base: float = Field(4.0, gt=0)
    temperature: float = Field(0.8, ge=0)   # 0: greedy
    max_new_tokens: int = Field(256, ge=8)  # per query
    batch_size: int = Field(16, ge=1)       # queries generated together
    words: int = Field(30, ge=5)            # asked-for length of a document
    # seekrl: the rollout engine's decoding loop; generate: Hugging Face's model.generate
    engine: Literal["seekrl", "generate"] = "seekrl"


def _query_sources(cfg):
    """The simulator's and the ranker's training need queries from somewhere."""
    if not cfg.trajectories and not cfg.data:
        raise ValueError("trajectories: no source of search queries; give trajectories=[...] "
                         "(logged episodes) or data=[...] (QA files), or both")
    return cfg


class SimulatorTrainConfig(Strict):
    """`seekrl simulator train` (recipes/simulator.py): SFT of a search simulator on the
    documents a real index returns for logged queries."""
    model: str = "smollm2-135m"        # the simulator to fine-tune
    index: str                         # the real engine: an index folder or a server url
    trajectories: list[str] = []       # logged episodes whose searches are the queries
    data: list[str] = []               # QA files: synthetic-world questions' hop queries
    question_queries: bool = False     # ... and each question itself as a query
    out: str = "runs/simulator"
    topk: TopK = DEFAULT_TOPK          # documents per query (what the simulator writes)
    words: int = Field(30, ge=5)       # the length the prompt asks for
    limit: int | None = Field(None, ge=1)   # at most this many queries (seeded sample)
    steps: int = Field(100, ge=1)
    # 8 examples a step as 2 x 4, as SFTConfig: 8 in one forward of the 135M model under
    # full fine-tuning peaked at 11.7 GB
    batch_size: int = Field(2, ge=1)
    grad_accum: int = Field(4, ge=1)
    max_len: int = Field(1024, ge=16)
    save_every: int = Field(50, ge=0)  # a checkpoint every N steps, for --resume (0: final only)
    train_layers: int | None = Field(None, ge=1)
    dtype: Dtype = "float32"
    device: Device = "cpu"
    seed: int = 0
    optim: OptimConfig = OptimConfig(lr=5e-5, warmup_steps=5)

    @model_validator(mode="after")
    def _sources(self):
        return _query_sources(self)


class RankerSettings(Strict):
    """A ranker over the retriever's candidates (retrieval/ranker.py), used by rollouts and
    evaluations alike; with `train`, trained with the agent: after every RL step, on the
    step's searches (their gold documents, or the documents of right episodes that hold the
    answer, as positives; the other candidates as negatives)."""
    switch: ClassVar[str] = "model"    # the key that turns the section on from the command line
    model: str | None = None           # None: the bundled all-MiniLM-L6-v2; or a ranker folder
    # a fresh ranker's kind (None: bi); query: the dense index's own query encoder,
    # fine-tuned over the vectors the index holds (searches the whole index)
    kind: Literal["bi", "cross", "query"] | None = None
    candidates: int = Field(10, ge=1)  # first-stage documents the ranker orders
    train: bool = True                 # update it on the rollouts' searches each RL step
    lr: float = Field(2e-5, gt=0)
    updates_per_step: int = Field(2, ge=1)   # gradient steps per RL step
    batch_size: int = Field(16, ge=1)  # searches per gradient step
    # None: a trained ranker's own (a different value is refused), 128 / 0.05 for a fresh one
    max_len: int | None = Field(None, ge=8)
    temperature: float | None = Field(None, gt=0)   # a bi-encoder's cosine over this


class RankerTrainConfig(Strict):
    """`seekrl ranker train` (recipes/ranker.py): a ranker trained on logged searches and
    synthetic-world hop queries, candidates from `index`."""
    model: str | None = None           # None: the bundled all-MiniLM-L6-v2
    kind: Literal["bi", "cross", "query"] | None = None
    index: str                         # the first stage: an index folder or a server url
    trajectories: list[str] = []       # logged episodes whose searches are the queries
    data: list[str] = []               # QA files: synthetic-world questions' hop queries
    question_queries: bool = False     # ... and each question itself as a query
    eval_data: list[str] = []          # held-out QA files: recall@k of hop queries, else of questions
    eval_trajectories: list[str] = []  # held-out logged episodes: gold hit rate of their searches
    out: str = "runs/ranker"
    candidates: int = Field(10, ge=1)
    topk: TopK = DEFAULT_TOPK          # k of recall@k (the documents an agent is shown)
    limit: int | None = Field(None, ge=1)   # at most this many training queries
    steps: int = Field(200, ge=1)
    save_every: int = Field(50, ge=0)  # a checkpoint every N steps, for --resume (0: none)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(2e-5, gt=0)
    # None: a trained ranker's own (a different value is refused), 128 / 0.05 for a fresh one
    max_len: int | None = Field(None, ge=8)
    temperature: float | None = Field(None, gt=0)
    device: Device = "cpu"
    seed: int = 0

    @model_validator(mode="after")
    def _sources(self):
        return _query_sources(self)


class TrainConfig(Strict):
    model: str = "smollm2-135m"        # usually the SFT checkpoint (RUN_DIR/final)
    data: str                          # training questions (QA JSONL / parquet)
    index: str | None = None           # an index folder or an http:// retrieval server
                                       # (required unless rollout.method is direct or
                                       # retriever is set)
    # your own retriever by import path, `mypkg.search:MyRetriever`: a class or function
    # called with `index` when that is set (no arguments otherwise), or an object with
    # search(queries, k); it replaces the index folder / server
    retriever: str | None = None
    # a language model as the search engine during rollouts (ZeroSearch; `index`, when set,
    # is then the real one evaluations search)
    simulator: SimulatorSettings | None = None
    # a ranker over the retriever's candidates, trained with the agent (CoSearch-style)
    ranker: RankerSettings | None = None
    out: str = "runs/train"
    dtype: Dtype = "float32"
    device: Device = "cpu"
    seed: int = 0
    steps: int = Field(20, ge=1)
    max_minutes: float | None = Field(None, gt=0)  # stop after the step that passes this
    # stop after the step that passes this many generated rollout tokens (MC continuations
    # included): runs of different methods compared at equal compute
    max_rollout_tokens: int | None = Field(None, ge=1)
    questions_per_step: int = Field(8, ge=1)
    group_size: int = Field(4, ge=1)   # rollouts per question (G)
    rollout: RolloutSettings = RolloutSettings()
    reward: RewardConfig = RewardConfig()
    algo: AlgoConfig = AlgoConfig()
    train_layers: int | None = Field(None, ge=1)   # train only the top N blocks (None: all)
    lora: LoRAConfig = LoRAConfig()
    # recompute each block's activations in the backward pass instead of keeping them:
    # less memory for long episodes and big models, about a third more update time
    gradient_checkpointing: bool = False
    # with several training processes (torchrun): none keeps the whole policy, its gradient
    # and optimizer state in every process; fsdp shards them over the processes (PyTorch
    # FSDP2, ZeRO-3's memory), gathering the full weights for rollouts (rl/distributed.py)
    shard: Literal["none", "fsdp"] = "none"
    # the rate the learning comparisons ran the default 135M policy at; a 1-7B policy
    # trains at about 1e-6 (Search-R1's)
    optim: RLOptimConfig = RLOptimConfig(lr=1e-5, schedule="constant")
    eval: EvalConfig = EvalConfig()
    save_every: int = Field(5, ge=0)   # checkpoint every N steps (0: final only)
    keep_last: int = Field(2, ge=1)    # checkpoints kept on disk
    monitor: MonitorConfig = MonitorConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _attention_here(self):
        return _attention_runs_here(self)


class ProragConfig(Strict):
    """`seekrl prorag` (seekrl/prorag.py): SFT -> MCTS labels -> PRM -> refinement -> RL with
    the PRM's step scores -> evaluation after each stage. Without `train` / `test` / `index`
    it builds the synthetic world at demo size. Each stage starts from its preset (the
    `seekrl` config in src/seekrl/presets/prorag/STAGE.yaml); a stage section holds keys of that
    stage's own config, set on top of the preset and the pipeline's (e.g. `labels: {search:
    {simulations: 32}}`, `rl: {steps: 20}`)."""
    out: str = "runs/prorag"
    seed: int = 0
    model: str = "smollm2-135m"
    sft_data: str | None = None        # trajectory JSONL for the warm-up (your own data)
    sft_model: str | None = None       # or skip the warm-up: start from this checkpoint
    train: str | None = None           # questions for labelling, refinement and RL
    test: str | None = None            # questions for the evaluations
    index: str | None = None           # an index folder or a retrieval server url
    n_test: int = Field(40, ge=1)
    # the episodes of every stage: SFT lays its episodes out with them, labelling,
    # refinement and RL play them (a stage's preset and section may set its own on top:
    # labelling and refinement sample at 0.9), each evaluation plays them greedily. The demo
    # world's: 2 documents a search, 256-token information blocks, 128 tokens a turn (every
    # oracle turn fits). k, max_info_tokens, max_turns, max_new_tokens at the top level are
    # read into it
    rollout: EpisodeSettings = EpisodeSettings(topk=2, max_info_tokens=256)
    train_layers: int | None = Field(16, ge=1)   # top blocks trained in every stage
    refine_method: Literal["rft", "step_dpo", "none"] = "rft"
    # the policies evaluated on the test questions (each evaluation of 200 questions is
    # minutes on a CPU; the SFT checkpoint's is the same for every seed of a benchmark)
    evaluate: list[Literal["sft", "refine", "rl"]] = ["sft", "refine", "rl"]
    sft: dict[str, Any] = {}           # SFTConfig keys
    labels: dict[str, Any] = {}        # LabelConfig keys
    prm: dict[str, Any] = {}           # PRMConfig keys
    refine: dict[str, Any] = {}        # RefineConfig keys
    rl: dict[str, Any] = {}            # TrainConfig keys
    # a folder of your own stage presets (sft.yaml, labels.yaml, prm.yaml, refine.yaml,
    # rl.yaml: copies of src/seekrl/presets/prorag, edited); null: src/seekrl/presets/prorag
    presets: str | None = None

    moved_keys: ClassVar[dict[str, str]] = {
        "k": "topk", "max_info_tokens": "max_info_tokens", "max_turns": "max_turns",
        "max_new_tokens": "max_new_tokens"}
    # the config class each stage section holds keys of: an override of a section given
    # whole merges into the file's (`rl={optim: ...}` keeps its `steps`), and one of its keys
    # cannot switch an optional section on by the way (`rl.ranker.lr=...`), as in `seekrl train`
    stage_schemas: ClassVar[dict[str, type]] = {
        "sft": SFTConfig, "labels": LabelConfig, "prm": PRMConfig, "refine": RefineConfig,
        "rl": TrainConfig}

    @model_validator(mode="before")
    @classmethod
    def _flat_episode_keys(cls, data: Any) -> Any:
        return _episode_keys_into_rollout(cls, data, cls.moved_keys)
