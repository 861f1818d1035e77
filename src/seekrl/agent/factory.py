"""The one place a command gets its generation backend: `backend_refusal` says why a
command cannot use a backend here (asked by each recipe's config check, before anything
loads), `make_backend` builds it."""

from __future__ import annotations

from seekrl.agent.backends import Backend, HFBackend

BACKENDS = ("hf", "vllm", "static")
# the commands that continue episodes from prefixes (MCTS, MC values, RFT) step by step
# with seekrl's own decoding loop
_HF_ONLY = {"labelling": "labelling continues prefixes with seekrl's own decoding loop",
            "refine": "refine samples with seekrl's own decoding loop"}


def backend_refusal(kind: str, command: str, *, processes: int = 1,
                    device: str | None = None) -> str | None:
    """Why `command` (train, eval, labelling, refine) cannot generate with backend `kind`
    here, or None when it can. Each command asks before anything loads."""
    if kind not in BACKENDS:
        return f"expected one of {', '.join(BACKENDS)}, got {kind!r}"
    if kind == "hf":
        return None
    if command in _HF_ONLY:   # they build HFBackend themselves
        return (f"{_HF_ONLY[command]} (hf); {kind!r} is for seekrl train and seekrl eval")
    if kind == "static":   # seekrl's own loop on the policy, one per process
        return None
    if command == "train" and processes > 1:
        return ("one colocated engine per training process is not supported yet; train "
                "data-parallel with the hf backend, or vllm in one process")
    if device is not None and device not in ("cuda", "cuda:0"):
        return (f"vllm uses the first GPU it sees, not {device!r}: choose it with "
                "CUDA_VISIBLE_DEVICES and device cuda")
    return None


def make_backend(kind: str, tokenizer, *, model=None, model_name: str | None = None,
                 dtype: str = "bfloat16", seed: int = 0, max_model_len: int = 4096,
                 gpu_memory: float = 0.4, sleep_level: int = 0,
                 attention: str = "default") -> Backend:
    """The generation backend every command builds: `hf`, seekrl's decoding loop on
    `model` (the policy itself); `vllm`, a colocated vLLM engine loaded from `model_name`
    (the trainer pushes its weights before each rollout); `static`, the fixed-shape loop
    of agent/static_backend.py on `model` (rows of `max_model_len` tokens; HFBackend with a
    warning where its lean forward does not hold). Ask `backend_refusal` first.
    `attention` is hf's (models.ATTENTION)."""
    if kind == "hf":
        return HFBackend(model, tokenizer, attention=attention)
    if kind == "static":
        from seekrl.agent.static_backend import static_backend

        return static_backend(model, tokenizer, max_len=max_model_len, attention=attention)
    if kind != "vllm":
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {kind!r}")
    from seekrl.agent.vllm_backend import VLLMBackend
    from seekrl.models import MIXED

    if dtype in MIXED:   # the engine keeps one copy of the weights: in the products' dtype
        dtype = str(MIXED[dtype]).removeprefix("torch.")
    return VLLMBackend(model_name, tokenizer, dtype=dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory, max_model_len=max_model_len,
                       sleep_level=sleep_level)
