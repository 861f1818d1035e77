"""The vLLM backend against a stand-in `vllm` package (vLLM itself needs a CUDA machine):
token ids in and out, the sampling settings it asks for, LoRA-merged weights under HF
names, and the trainer's weight sync before each rollout that follows an update."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
from test_train import make_cfg, parity_reward, world  # noqa: F401  (world: a fixture)

from seekrl.agent.backends import Sampling
from seekrl.agent.protocol import STOP_STRINGS
from seekrl.models import tiny_policy


class FakeEngineModel:
    def __init__(self, calls: list):
        self.loads: list[dict[str, torch.Tensor]] = []
        self.calls = calls

    def load_weights(self, weights):
        self.loads.append({n: t.clone() for n, t in weights})
        self.calls.append("load")


class FakeLLM:
    """Records every request; answers each prompt with `reply` token ids."""

    instances: list[FakeLLM] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.requests: list[tuple[list, object]] = []
        self.reply: list[int] = []
        self.resets = 0
        self.calls: list[str] = []
        self.engine_model = FakeEngineModel(self.calls)
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
                model=self.engine_model))))
        FakeLLM.instances.append(self)

    def generate(self, prompts, params, use_tqdm=True):
        self.requests.append((prompts, params))
        # vLLM's shape: with SamplingParams(logprobs=k), one {token id: Logprob} per token
        logprobs = None if params.logprobs is None else [
            {tok: types.SimpleNamespace(logprob=-0.25 * (i + 1), rank=1)}
            for i, tok in enumerate(self.reply)]
        done = types.SimpleNamespace(token_ids=tuple(self.reply), finish_reason="stop",
                                     logprobs=logprobs)
        return [types.SimpleNamespace(outputs=[done]) for _ in prompts]

    def reset_prefix_cache(self):
        self.resets += 1

    def sleep(self, level=1):
        assert self.kwargs.get("enable_sleep_mode"), "sleep mode was not enabled"
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake:{','.join(tags or ['all'])}")


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kw: dict(kw)
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    FakeLLM.instances.clear()
    return vllm


def test_without_vllm_the_backend_says_how_to_get_it(monkeypatch):
    from seekrl.agent.vllm_backend import VLLMBackend
    from seekrl.models import ModelError

    monkeypatch.setitem(sys.modules, "vllm", None)     # import fails
    with pytest.raises(ModelError, match="needs the vllm package"):
        VLLMBackend("m", None)


def test_token_ids_in_and_out_with_the_protocol_stops(fake_vllm):
    from seekrl.agent.vllm_backend import VLLMBackend

    backend = VLLMBackend("/models/policy", None, dtype="bfloat16", max_model_len=2048, seed=7)
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["enable_prefix_caching"] is True and llm.kwargs["model"] == "/models/policy"
    assert llm.kwargs["seed"] == 7 and llm.kwargs["max_model_len"] == 2048
    llm.reply = [11, 12, 13]
    contexts = [[1, 2, 3], [1, 2, 3, 4, 5]]
    out = backend.generate(contexts, 32, Sampling(greedy=True))
    assert out == [[11, 12, 13], [11, 12, 13]]
    prompts, params = llm.requests[-1]
    # the exact ids, never text: no re-tokenisation between turns
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [1, 2, 3, 4, 5]}]
    assert params.stop == list(STOP_STRINGS) and params.include_stop_str_in_output is True
    assert params.max_tokens == 32 and params.temperature == 0.0 and params.n == 1
    assert params.logprobs is None and out[0].logprobs is None    # greedy: nothing to correct
    # behaviour log-probs after temperature / top-p, the distribution actually sampled
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    out = backend.generate(contexts, 8, Sampling(temperature=0.7, top_p=0.9))
    params = llm.requests[-1][1]
    assert params.temperature == 0.7 and params.top_p == 0.9 and params.logprobs == 0
    assert out[1] == [11, 12, 13] and out[1].logprobs == [-0.25, -0.5, -0.75]
    assert backend.generate([], 8, Sampling()) == [] and len(llm.requests) == 2


def test_lora_weights_are_merged_under_hf_names():
    from peft import LoraConfig, get_peft_model

    from seekrl.agent.vllm_backend import hf_weights

    model, _ = tiny_policy(seed=1)
    plain = dict(hf_weights(model))
    assert plain.keys() == model.state_dict().keys()
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8,
                                                           target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():      # B starts at zero: make the adapters do something
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    pushed = dict(hf_weights(lora))
    merged = copy.deepcopy(lora).merge_and_unload().state_dict()
    assert pushed.keys() == merged.keys() == model.state_dict().keys()
    for name in merged:
        torch.testing.assert_close(pushed[name], merged[name], msg=name)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(pushed[q], plain[q])      # the adapter's change is in it


def _train_on_the_fake_engine(cfg, world):  # noqa: F811
    """A trainer on the tiny model whose every turn (from the stand-in engine) answers; the
    reward varies within a group, so each step updates. Returns the trained trainer."""
    from seekrl.recipes.train import Trainer

    model, tok = tiny_policy(seed=3)
    trainer = Trainer(cfg, model=model, tokenizer=tok, retriever=world["index"],
                      questions=world["train"], reward_fn=parity_reward, overwrite=True)
    answer = tok.encode("<answer> Tarrow </answer>", add_special_tokens=False)
    original = FakeLLM.generate

    def generate(self, prompts, params, use_tqdm=True):
        self.reply = answer
        return original(self, prompts, params, use_tqdm)

    FakeLLM.generate = generate
    try:
        trainer.train()
    finally:
        FakeLLM.generate = original
    return trainer


def test_trainer_pushes_the_updated_policy_before_each_rollout(fake_vllm, world, tmp_path):  # noqa: F811
    trainer = _train_on_the_fake_engine(make_cfg(tmp_path, steps=2, **{
        "rollout.backend": "vllm", "algo.kl_coef": 0.0}), world)
    llm = FakeLLM.instances[-1]
    loads = llm.engine_model.loads
    assert len(loads) == 2 and llm.resets == 2          # once per step, before its rollout
    # step 1 rolled out the starting weights, step 2 those after step 1's update
    start = dict(tiny_policy(seed=3)[0].state_dict())
    assert all(torch.equal(loads[0][n], start[n]) for n in start)
    changed = [n for n in start if not torch.equal(loads[1][n], start[n])]
    assert changed
    final = trainer.model.state_dict()      # step 2's own update came after its rollout
    assert any(not torch.equal(loads[1][n], final[n]) for n in changed)


def test_refine_and_labelling_refuse_the_vllm_backend(tmp_path):
    from seekrl.config import LabelConfig, RefineConfig
    from seekrl.recipes.mcts import run_labelling
    from seekrl.recipes.refine import run_refine

    model, tok = tiny_policy(seed=0)
    with pytest.raises(ValueError, match="rollout.backend: refine samples"):
        run_refine(RefineConfig(out=str(tmp_path / "r"), rollout={"backend": "vllm"}),
                   model=model, tokenizer=tok, retriever=object(), questions=[])
    with pytest.raises(ValueError, match="rollout.backend: labelling"):
        run_labelling(LabelConfig(out=str(tmp_path / "m"), data="q.jsonl",
                                   rollout={"backend": "vllm"}), model=model, tokenizer=tok,
                      questions=[])
    # tree rollouts are RL's: here they would be read by nothing
    from seekrl.recipes import mcts, refine
    tree = {"tree": {"trees": 2}}
    with pytest.raises(ValueError, match="rollout.tree: .* refine plays"):
        refine.check_config(RefineConfig(out=str(tmp_path / "r"), rollout=tree))
    with pytest.raises(ValueError, match="rollout.tree: .* labelling plays"):
        mcts.check_config(LabelConfig(out=str(tmp_path / "m"), data="q.jsonl", rollout=tree))


def test_the_templates_end_of_turn_stops_vllm_as_it_stops_the_hf_backend(fake_vllm):
    from seekrl.agent.vllm_backend import VLLMBackend
    from seekrl.models import load_tokenizer

    tok = load_tokenizer()
    tok.eos_token = tok.pad_token = "<|endoftext|>"   # a base model's tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    backend = VLLMBackend("/models/policy", tok)
    FakeLLM.instances[-1].reply = [11, im_end]
    backend.generate([[1, 2]], 8, Sampling(greedy=True))
    params = FakeLLM.instances[-1].requests[-1][1]
    assert set(params.stop_token_ids) == {tok.eos_token_id, im_end} == backend.stop_ids


def test_an_old_vllm_without_logprobs_mode_gives_no_behaviour_logprobs(fake_vllm):
    from seekrl.agent.vllm_backend import VLLMBackend

    class OldLLM(FakeLLM):
        def __init__(self, **kwargs):
            if "logprobs_mode" in kwargs:
                raise TypeError("__init__() got an unexpected keyword argument 'logprobs_mode'")
            super().__init__(**kwargs)

    fake_vllm.LLM = OldLLM
    backend = VLLMBackend("/models/policy", None)
    llm = FakeLLM.instances[-1]
    llm.reply = [5, 6]
    out = backend.generate([[1, 2]], 8, Sampling(temperature=1.0))
    assert out == [[5, 6]] and out[0].logprobs is None      # raw ones would not compare
    assert llm.requests[-1][1].logprobs is None


def test_the_engine_sleeps_through_each_update_and_wakes_for_the_sync(fake_vllm, world,  # noqa: F811
                                                                      tmp_path):
    trainer = _train_on_the_fake_engine(make_cfg(tmp_path, steps=2, **{
        "rollout.backend": "vllm", "rollout.vllm_sleep": 1, "algo.kl_coef": 0.0}), world)
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["enable_sleep_mode"] is True
    # step 1: push, roll out, sleep through the update; step 2: weights wake, the new ones
    # are pushed, then the KV cache wakes; roll out; sleep again
    assert llm.calls == ["load", "sleep1", "wake:weights", "load", "wake:kv_cache", "sleep1"]
    with pytest.raises(RuntimeError, match="asleep"):
        trainer._backend.generate([[1, 2]], 4, Sampling())
