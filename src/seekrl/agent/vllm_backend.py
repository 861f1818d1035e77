"""A vLLM generation backend (`rollout.backend: vllm`), for GPU machines that have vLLM.

The same interface as `HFBackend` (`backends.Backend`): token ids in, token ids out, with
each sampled token's log-probability.

- Prompts go to vLLM as `TokensPrompt(prompt_token_ids=...)`, exactly the ids the rollout
  engine holds; text is never re-tokenised, so what the policy is trained on is what it
  generated (re-tokenisation drift is the most reported bug of agentic RL stacks).
- Generation stops at `</search>` / `</answer>` (kept in the output, as `HFBackend` keeps
  them) or EOS; every turn is one request per episode, and vLLM's prefix caching reuses
  the episode's earlier turns, as `HFBackend`'s kept KV cache does.
- Behaviour log-probabilities: each sampled token's (`SamplingParams(logprobs=0)`, after
  temperature and top-p: `logprobs_mode="processed_logprobs"`), which the trainer compares
  with its own and corrects for (`algo.tis_cap`).
- Colocated weight sync: `sync_weights(policy)` pushes the policy's current weights into
  the engine (`load_weights`, HF parameter names; LoRA adapters merged into the base
  weights first) and resets the prefix cache, whose entries the old weights computed. The
  trainer calls it before each rollout that follows an optimizer step.

Not verified on a GPU in this project (the lent GPU machines have no vLLM, and vLLM 0.33
needs torch 2.14): the tests run this module against a stand-in `vllm` package that
records what it is asked. The engine's internals for in-process weight loading differ
between vLLM versions; `_engine_model` tries the known paths and says so when none fits.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterator, Sequence

import torch

from seekrl.agent.backends import Backend, Generated, Sampling
from seekrl.agent.protocol import STOP_STRINGS
from seekrl.models import ModelError, end_of_turn_ids

# where the engine keeps its torch model when it runs in this process, by vLLM generation
_MODEL_PATHS = ("model_executor.driver_worker.model_runner.model",            # V0 engine
                "model_executor.driver_worker.worker.model_runner.model")     # V1, in process


def import_vllm():
    try:
        import vllm
    except ImportError:
        raise ModelError("rollout.backend vllm needs the vllm package (a CUDA machine: "
                         "pip install vllm, at the version that matches your torch)") from None
    return vllm


class VLLMBackend(Backend):
    """Generation with a colocated `vllm.LLM` (or one passed in as `llm`)."""

    def __init__(self, model: str, tokenizer, *, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.4, max_model_len: int = 4096,
                 seed: int = 0, llm=None, stop_strings: tuple[str, ...] = STOP_STRINGS,
                 sleep_level: int = 0):
        if llm is None:
            # colocated weight sync loads weights into the engine's model in this process;
            # vLLM's V1 engine runs it in a worker process unless told otherwise
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = import_vllm()
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.stop_strings = list(stop_strings)
        # the chat template's end-of-turn token stops a turn as EOS does (vLLM stops at the
        # model's generation EOS ids by itself); the rollout reads these as a turn's end
        self.stop_ids = end_of_turn_ids(tokenizer) if tokenizer is not None else set()
        # behaviour log-probs are only comparable with the trainer's after temperature and
        # top-p (`processed_logprobs`, vLLM >= 0.10.2); an older vLLM reports none
        self.logprobs = True
        if llm is None:
            settings = dict(model=model, tokenizer=model, dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len, enable_prefix_caching=True)
            if sleep_level:
                settings["enable_sleep_mode"] = True
            try:
                llm = vllm.LLM(**settings, logprobs_mode="processed_logprobs")
            except TypeError as err:
                if "logprobs_mode" not in str(err):
                    raise
                llm, self.logprobs = vllm.LLM(**settings), False
        self.llm = llm
        self.synced_version: int | None = None   # the trainer's update the weights are from
        self.sleep_level = sleep_level
        self.asleep = False

    def generate(self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling,
                 keys: Sequence[Hashable] | None = None) -> list[Generated]:
        """One continuation per context, as token ids ending at the first stop string or EOS
        (kept), with their log-probabilities when sampling. `keys` are not needed: vLLM's
        prefix cache finds the shared history itself."""
        if not contexts or max_new_tokens <= 0:
            return [Generated() for _ in contexts]
        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep: sync_weights(policy) wakes it with "
                               "the policy's weights")
        from vllm.inputs import TokensPrompt

        params = self._vllm.SamplingParams(
            n=1, max_tokens=max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            stop=self.stop_strings + list(sampling.stop), include_stop_str_in_output=True,
            stop_token_ids=sorted(self.stop_ids),
            logprobs=0 if self.logprobs and not sampling.greedy else None)  # 0: the sampled one
        prompts = [TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(contexts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(contexts)} "
                               "prompts")
        return [_generated(out.outputs[0], with_logprobs=params.logprobs is not None)
                for out in outputs]

    def sync_weights(self, policy: torch.nn.Module, version: int | None = None) -> int:
        """Load `policy`'s weights into the engine unless they are already those of
        `version` (the trainer's count of optimizer steps); returns how many tensors were
        pushed. A sleeping engine wakes: its weights first, then the new ones are pushed
        (always: after level 2 it holds none), then its KV cache."""
        waking = self.asleep
        if waking:
            _wake(self.llm, "weights")
        elif version is not None and version == self.synced_version:
            return 0
        target = _engine_model(self.llm)
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in hf_weights(policy):
                count += 1
                yield item

        target.load_weights(counted())
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()
        if waking:
            _wake(self.llm, "kv_cache")
            self.asleep = False
        self.synced_version = version
        return count

    def sleep(self) -> None:
        """vLLM's sleep mode at `sleep_level` (0: nothing): the update gets the memory."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True


def _wake(llm, tag: str) -> None:
    """Wake one part of a sleeping engine (weights before the sync, the KV cache after it,
    so the two are never both in memory with the trainer's); a vLLM without tags wakes
    whole at the first call."""
    try:
        llm.wake_up(tags=[tag])
    except TypeError:
        if tag == "weights":
            llm.wake_up()


def _generated(completion, *, with_logprobs: bool) -> Generated:
    """A vLLM completion as token ids with each token's log-probability: `logprobs` holds one
    {token id: Logprob} per generated token, the sampled token among them."""
    ids = list(completion.token_ids)
    if not with_logprobs:
        return Generated(ids)
    per_token = getattr(completion, "logprobs", None) or []
    if len(per_token) != len(ids):
        return Generated(ids)
    return Generated(ids, [float(step[tok].logprob) for tok, step in zip(ids, per_token)])


def _engine_model(llm):
    engine = getattr(llm, "llm_engine", None)
    for path in _MODEL_PATHS:
        obj = engine
        try:
            for attr in path.split("."):
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        if hasattr(obj, "load_weights"):
            return obj
    raise ModelError("cannot reach the vLLM engine's model in this process to load the new "
                     "weights (this vLLM runs it in a worker process); run with "
                     "VLLM_ENABLE_V1_MULTIPROCESSING=0 for colocated training")


@torch.no_grad()
def hf_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, tensor) for every weight of the policy as a plain HF model would
    name it. A peft LoRA model is read with its adapters merged into the base weights
    (W + scale x B A) and the peft prefixes and `base_layer` parts dropped; the adapter
    matrices themselves are not yielded. Tensors are detached views, not copies, where no
    merge is needed."""
    lora_delta: dict[str, torch.Tensor] = {}
    for name, module in policy.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "active_adapters"):
            delta = None
            for adapter in module.active_adapters:
                if adapter in getattr(module, "lora_A", {}):
                    d = module.get_delta_weight(adapter)
                    delta = d if delta is None else delta + d
            if delta is not None:
                lora_delta[f"{name}.base_layer.weight"] = delta
    for name, tensor in policy.state_dict(keep_vars=False).items():
        if ".lora_" in name or "lora_embedding" in name:
            continue
        if name in lora_delta:
            tensor = tensor + lora_delta[name].to(tensor.dtype)
        yield _hf_name(name), tensor.detach()


def _hf_name(name: str) -> str:
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    return name.replace(".base_layer.", ".")
