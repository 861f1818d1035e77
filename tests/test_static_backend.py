"""The fixed-shape decoding backend (agent/static_backend.py) against HFBackend: the lean
forward's logits, greedy episodes token for token, sampled log-probs, the stop automaton,
weights kept in place, and the fallback."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.backends import HFBackend, Sampling
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.static_backend import (
    LeanForward,
    StaticBackend,
    _CudaGraphs,
    _sample,
    first_stop,
    static_backend,
    stop_table,
)
from seekrl.data.qa import QAExample
from seekrl.models import tiny_policy
from seekrl.retrieval.base import Hit


@pytest.fixture(scope="module")
def tiny():
    return tiny_policy(seed=0)


def tiny_qwen2(tok, seed: int = 1):
    """A tiny random Qwen2 (q/k/v biases made non-zero, untied head) with the bundled
    tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


class Docs:
    docs = [Hit("d-tarrow", "Tarrow", "Tarrow is a city in Velmaria.", 2.0),
            Hit("d-ilsa", "Ilsa Marrow", "Ilsa Marrow was born in Tarrow.", 1.0),
            Hit("d-x", "Noise", "Unrelated text.", 0.5)]

    def search(self, queries, k):
        return [self.docs[:k] for _ in queries]


def ex(qid: str, question: str) -> QAExample:
    return QAExample(qid, question, ["Tarrow"], {"gold_doc_ids": ["d-ilsa"]})


# ---------------------------------------------------------------- the lean forward
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_forward_equals_hf_logits(tiny, arch):
    """Rows of different lengths prefilled together (padding, a row skipped), then decoded
    together a few steps: every logit within 1e-4 of HF's full forward (float32)."""
    model, tok = tiny
    if arch == "qwen2":
        model = tiny_qwen2(tok)
    lean = LeanForward(model, max_len=64)
    kc, vc = lean.new_cache(3)
    g = torch.Generator().manual_seed(0)
    seqs = {0: torch.randint(0, len(tok), (30,), generator=g).tolist(),
            2: torch.randint(0, len(tok), (13,), generator=g).tolist()}
    cut = {0: 20, 2: 7}
    ids = torch.full((2, 20), 0)
    for b, r in enumerate((0, 2)):
        ids[b, :cut[r]] = torch.tensor(seqs[r][:cut[r]])
    got = {r: [] for r in seqs}
    with torch.no_grad():
        last = lean.prefill(ids, torch.arange(20).repeat(2, 1), torch.tensor([20, 7]),
                            torch.tensor([0, 2]), kc, vc, 20)
        got[0].append(last[0])
        got[2].append(last[1])
        pos = torch.tensor([20, 0, 7])
        for step in range(6):
            step_ids = torch.tensor([seqs[0][20 + step], 5, seqs[2][7 + step]])
            logits = lean.decode(step_ids, pos, kc, vc, 32)
            got[0].append(logits[0])
            got[2].append(logits[2])
            pos = pos + torch.tensor([1, 0, 1])
        for r, seq in seqs.items():
            ref = model(input_ids=torch.tensor([seq[:cut[r] + 6]])).logits[0]
            want = ref[cut[r] - 1:cut[r] + 6]
            assert torch.allclose(torch.stack(got[r]), want, atol=1e-4, rtol=0), arch


@pytest.mark.slow
def test_lean_forward_equals_hf_logits_on_the_bundled_model():
    from seekrl.models import load_policy

    model, tok = load_policy()
    backend = StaticBackend(model, tok, max_len=64)
    ids = tok.encode("Question: where was Ilsa Marrow born? <search> Ilsa Marrow </search>",
                     add_special_tokens=False)
    assert backend.lean.check(model, ids) <= 1e-4


def test_an_unsupported_model_or_a_mismatch_falls_back_to_hf_with_a_warning(tiny, monkeypatch):
    model, tok = tiny
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    with pytest.warns(UserWarning, match="no lean forward"):
        assert type(static_backend(gpt2, tok)) is HFBackend
    import seekrl.agent.static_backend as sb

    monkeypatch.setattr(sb, "_rope", lambda x, cos, sin: x)   # a forward that is wrong
    with pytest.warns(UserWarning, match="differ from HF"):
        assert type(static_backend(model, tok)) is HFBackend
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(static_backend(model, tok), StaticBackend)


def test_the_factory_and_the_config_know_static(tiny):
    from seekrl.agent.factory import backend_refusal, make_backend
    from seekrl.config import RolloutSettings

    model, tok = tiny
    assert isinstance(make_backend("static", tok, model=model, max_model_len=128), StaticBackend)
    assert backend_refusal("static", "train", processes=2) is None
    assert backend_refusal("static", "eval") is None   # seekrl eval --backend static
    assert "hf" in backend_refusal("static", "labelling")
    assert RolloutSettings(backend="static").backend == "static"


# ---------------------------------------------------------------- episodes, token for token
STOPS = (" the", "s")   # stop strings the random tiny model hits: rows stop at different times


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_episodes_give_hf_tokens(tiny, arch):
    """Multi-turn greedy episodes (groups of 2, batch 3: rows recycled and moved, prefixes
    reused, equal prompts copied) give HFBackend's exact tokens; so do continuations."""
    model, tok = tiny
    if arch == "qwen2":
        model = tiny_qwen2(tok)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=10, n_samples=2, batch_size=3, seed=3,
                        greedy=True)
    examples = [ex(f"q{i}", f"Question {'long ' * i}number {i}?") for i in range(4)]
    static = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens)
    mine = RolloutEngine(static, tok, Docs(), cfg).run(examples)
    hf = RolloutEngine(HFBackend(model, tok, stop_strings=STOPS), tok, Docs(), cfg).run(examples)
    assert [t.token_ids for t in mine] == [t.token_ids for t in hf]
    assert sum(len(t.steps) for t in mine) > len(mine)   # several turns happened
    assert mine[0].rollout_logprobs is None
    # continuing after step 1 (k = 0 too): the same as HF, and as the episode itself
    long = [t for t in hf if len(t.steps) > 1 and t.steps[0].info_end is not None][:2]
    prefixes = [(long[0], 1), (long[1], 1), (long[0], 0)]
    a = RolloutEngine(static, tok, Docs(), cfg).continue_from(prefixes, 2)
    b = RolloutEngine(HFBackend(model, tok, stop_strings=STOPS), tok, Docs(), cfg
                      ).continue_from(prefixes, 2)
    assert [[t.token_ids for t in g] for g in a] == [[t.token_ids for t in g] for g in b]
    assert a[0][0].token_ids == long[0].token_ids


def test_self_search_episodes_give_hf_tokens(tiny, monkeypatch):
    """Self-search through the engine: every turn but the last is read as a search (the
    random model writes no tags), so the policy writes its own `<information>` blocks with
    keyed calls on a subset of the rows between its turns; the static backend gives
    HFBackend's tokens, blocks and masks."""
    import seekrl.agent.rollout as rollout_mod
    from seekrl.agent.protocol import parse_action

    def as_search(text, tools, max_queries):
        action = parse_action(text, tools, max_queries)
        if action.kind != "invalid":
            return action
        return type(action)("search", text.strip()[:30] or "x")

    monkeypatch.setattr(rollout_mod, "parse_action", as_search)
    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=24, n_samples=2,
                        batch_size=3, seed=3, greedy=True, self_search=True)
    examples = [ex(f"q{i}", f"Question {'long ' * i}number {i}?") for i in range(3)]
    static = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens)
    mine = RolloutEngine(static, tok, Docs(), cfg).run(examples)
    hf = RolloutEngine(HFBackend(model, tok, stop_strings=STOPS), tok, Docs(), cfg).run(examples)
    written = [s.info_generated for t in mine for s in t.steps if s.action == "search"]
    assert written and max(written) > 0   # the policy wrote blocks
    assert [(t.token_ids, t.loss_mask) for t in mine] == [(t.token_ids, t.loss_mask) for t in hf]
    assert [[s.info_generated for s in t.steps] for t in mine] == \
        [[s.info_generated for s in t.steps] for t in hf]


@pytest.mark.parametrize("sync_every,width_step", [(1, 64), (8, 16)])
def test_keyed_turns_reuse_rows_across_calls_and_subsets(tiny, sync_every, width_step):
    """Calls with keys (a subset call between, as self-search makes; more rows than before;
    a context that is not an extension of its row) match HFBackend call for call; reading
    the finished flags every 8 steps (CUDA's default) and finer width buckets change nothing."""
    model, tok = tiny
    mine = StaticBackend(model, tok, stop_strings=STOPS, max_len=256, sync_every=sync_every,
                         width_step=width_step)
    hf = HFBackend(model, tok, stop_strings=STOPS)
    ctx = {k: tok.encode(f"episode {k} " * (k + 1), add_special_tokens=False) for k in range(6)}
    greedy = Sampling(greedy=True)
    for keys in ([0, 1, 2], [1], [0, 1, 2, 3, 4, 5], [5, 0], [2, 3]):
        contexts = [ctx[k] for k in keys]
        a = mine.generate(contexts, 7, greedy, keys=keys)
        b = hf.generate(contexts, 7, greedy, keys=keys)
        assert [list(x) for x in a] == [list(x) for x in b], keys
        for k, new in zip(keys, a):
            ctx[k] = ctx[k] + list(new) + tok.encode(" info", add_special_tokens=False)
    ctx[3] = tok.encode("something else entirely", add_special_tokens=False)
    assert [list(x) for x in mine.generate([ctx[3]], 5, greedy, keys=[3])] == \
        [list(x) for x in hf.generate([ctx[3]], 5, greedy, keys=[3])]
    # without keys, and a tool's closing tag as an extra stop string
    stop = Sampling(greedy=True, stop=("ing",))
    assert [list(x) for x in mine.generate(list(ctx.values()), 9, stop)] == \
        [list(x) for x in hf.generate(list(ctx.values()), 9, stop)]


def test_a_weight_sync_forgets_the_episodes_cached_under_the_old_weights():
    """An optimizer step changes the weights in place; a keyed episode cached before it
    was continued from its old keys and values (a rollout that raised kept its cache, and
    its ids come back). Both backends now forget them at `sync_weights`."""
    import copy

    model, tok = tiny_policy(seed=0)
    ctx = tok.encode("episode one of many", add_special_tokens=False)
    greedy = Sampling(greedy=True)
    for make in (lambda m: HFBackend(m, tok, stop_strings=()),
                 lambda m: StaticBackend(m, tok, stop_strings=(), max_len=128)):
        policy = copy.deepcopy(model)
        backend = make(policy)
        first = list(backend.generate([ctx], 4, greedy, keys=[7])[0])
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.3)
        backend.sync_weights(policy, 1)
        later = ctx + first + tok.encode(" info", add_special_tokens=False)
        got = [list(x) for x in backend.generate([later], 6, greedy, keys=[7])]
        assert got == [list(x) for x in make(policy).generate([later], 6, greedy)]


def test_rows_stop_at_their_width_and_a_context_past_it_widens_them(tiny):
    """A row's turn ends at `max_len` (the engine's total budget, where it would cut the
    turn anyway); a context longer than that (a self-search block's head) widens every row
    once, the cached rows kept, and decodes as HFBackend does."""
    model, tok = tiny
    backend = StaticBackend(model, tok, stop_strings=(), max_len=24, width_step=8)
    hf = HFBackend(model, tok, stop_strings=())
    greedy = Sampling(greedy=True)
    ctx = [[5, 9] * 10, [6, 7] * 2]
    out = backend.generate(ctx, 12, greedy, keys=["a", "b"])
    want = hf.generate(ctx, 12, greedy, keys=["a", "b"])
    assert len(out[0]) == 4 and [list(x) for x in out] == [want[0][:4], list(want[1])]
    ctx = [ctx[1] + list(want[1]) + [8] * 15]
    assert [list(x) for x in backend.generate(ctx, 5, greedy, keys=["b"])] == \
        [list(x) for x in hf.generate(ctx, 5, greedy, keys=["b"])]
    assert backend.max_len >= 39 and backend.lean.cos.shape[0] == backend.max_len + 1


# ---------------------------------------------------------------- sampling
@pytest.mark.parametrize("top_p", [1.0, 0.6])
def test_sampling_is_hfs_rule_draw_for_draw(tiny, top_p):
    """The same random draws give the same tokens and log-probs as HFBackend._next_tokens."""
    model, tok = tiny
    hf = HFBackend(model, tok)
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)) * 3
    logits[0] = -1e9
    logits[0, 7] = 0.0
    sampling = Sampling(temperature=0.7, top_p=top_p)
    torch.manual_seed(4)
    want = hf._next_tokens(logits, sampling)
    torch.manual_seed(4)
    got = _sample(logits, "top_p" if top_p < 1 else "sample", torch.tensor(0.7),
                  torch.tensor(top_p))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(_sample(logits, "greedy", torch.tensor(1.0), torch.tensor(1.0))[0],
                       logits.argmax(-1))


def test_sampled_log_probs_equal_a_full_forward(tiny):
    from seekrl.models import collate
    from seekrl.rl.forward import masked_logprobs

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=32, n_samples=3,
                        temperature=0.7, seed=2)
    questions = [ex("q1", "Where was Ilsa born?"), ex("q2", "Which city?")]
    backend = StaticBackend(model, tok, max_len=cfg.max_total_tokens)
    trajs = RolloutEngine(backend, tok, Docs(), cfg).run(questions)
    for t in trajs:
        t.check()
        assert t.rollout_logprobs is not None and len(t.rollout_logprobs) == t.n_generated
    ids, attn, mask = collate([t.token_ids for t in trajs], [t.loss_mask for t in trajs],
                              tok.pad_token_id)
    with torch.no_grad():
        lp = masked_logprobs(model, ids, attn, mask, temperature=0.7)["logprobs"]
    for r, t in enumerate(trajs):
        assert torch.allclose(lp[r][mask[r].bool()], torch.tensor(t.rollout_logprobs),
                              atol=1e-4)
    assert len({tuple(t.token_ids) for t in trajs[:3]}) > 1   # the group's samples differ


# ---------------------------------------------------------------- the stop automaton
def _naive(pieces, stops, stop_ids, seq):
    text = ""
    for i, t in enumerate(seq):
        text += pieces[t]
        if t in stop_ids or any(s in text for s in stops):
            return i
    return None


ALPHA = "ab</>"


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.text(ALPHA, max_size=4), min_size=1, max_size=12),
       stops=st.lists(st.text(ALPHA, min_size=1, max_size=5), min_size=0, max_size=3),
       data=st.data())
def test_stop_automaton_equals_substring_search(pieces, stops, data):
    stop_ids = set(data.draw(st.lists(st.integers(0, len(pieces) - 1), max_size=1)))
    seq = data.draw(st.lists(st.integers(0, len(pieces) - 1), max_size=30))
    table = stop_table(pieces, stops, stop_ids)
    assert first_stop(table, seq) == _naive(pieces, stops, stop_ids, seq)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_stop_automaton_on_the_real_vocabulary(tiny, data):
    """The bundled tokenizer's own token texts, the agent's stop strings and a tool's tag;
    sequences drawn from the tokens of tag-like texts."""
    _, tok = tiny
    pieces, table = _real_table(tok)
    pool = sorted({i for text in ("</search>", " </answer>", "</open>\n", "<search> x </",
                                  "answer>", "search", "</", ">\n\n", " sear", "ch>")
                   for i in tok.encode(text, add_special_tokens=False)})
    seq = data.draw(st.lists(st.sampled_from(pool), max_size=25))
    assert first_stop(table, seq) == _naive(pieces, REAL_STOPS, set(), seq)


REAL_STOPS = ("</search>", "</answer>", "</open>")
_REAL: dict = {}


def _real_table(tok):
    if not _REAL:
        pieces = tok.batch_decode([[i] for i in range(len(tok))])
        _REAL["v"] = pieces, stop_table(pieces, REAL_STOPS)
    return _REAL["v"]


def test_token_texts_are_hfs_pieces(tiny):
    """The table is built from batch_decode's texts: the same as HFBackend._piece's."""
    model, tok = tiny
    pieces, _ = _real_table(tok)
    hf = HFBackend(model, tok)
    for i in list(range(0, len(tok), 997)) + tok.encode("</search> é 日本", add_special_tokens=False):
        assert pieces[i] == hf._piece(i)


# ---------------------------------------------------------------- weights and the step
def test_weights_are_the_policys_and_an_update_in_place_is_seen(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    backend = StaticBackend(model, tok, stop_strings=(), max_len=64)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert backend.lean.w["0.q"].data_ptr() == q.data_ptr()          # no copy
    assert backend.lean.w["head"].data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ctx = [tok.encode("an update in place", add_special_tokens=False)]
    before = backend.generate(ctx, 6, Sampling(greedy=True))
    with torch.no_grad():   # what an optimizer step does
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    backend.sync_weights(model, 1)
    after = backend.generate(ctx, 6, Sampling(greedy=True))
    assert [list(x) for x in after] == \
        [list(x) for x in HFBackend(model, tok, stop_strings=()).generate(ctx, 6, Sampling(greedy=True))]
    assert after != before


def test_own_copies_are_refreshed_in_place(tiny):
    """A mixed-precision policy decodes with bfloat16 copies: refreshed in place (the same
    storage, so captured graphs stay valid) when the float32 weights change."""
    from seekrl.models import mixed_precision

    model, tok = tiny
    model = mixed_precision(copy.deepcopy(model))
    backend = StaticBackend(model, tok, stop_strings=(), max_len=64)
    held = backend.lean.w["0.q"]
    q = model.model.layers[0].self_attn.q_proj.weight
    assert held.dtype == torch.bfloat16 and held.data_ptr() != q.data_ptr()
    with torch.no_grad():
        q.add_(1.0)
    backend.generate([[5, 6, 7]], 2, Sampling(greedy=True))   # noticed without a sync call
    assert backend.lean.w["0.q"] is held and torch.equal(held, q.to(torch.bfloat16))


def test_the_decode_step_traces_as_one_graph(tiny):
    """No host sync and no graph break in a decoding step (what CUDA graph capture needs):
    torch.compile's tracer takes it whole (fullgraph=True)."""
    model, tok = tiny
    backend = StaticBackend(model, tok, max_len=64)
    backend.generate([[5, 6, 7], [8, 9]], 4, Sampling(temperature=0.8, top_p=0.9))
    table = backend._table(backend.stop_strings)
    torch._dynamo.reset()
    step = torch.compile(backend._step, backend="eager", fullgraph=True)
    step(2, 64, "top_p", table)
    step(2, 64, "greedy", table)


def test_lora_adapters_are_merged_and_follow_their_updates(tiny):
    """Under peft's LoRA the backend decodes with base + adapter deltas merged into its own
    tensors (the probe against peft's forward passes), refreshed when the adapters change."""
    from peft import LoraConfig, get_peft_model

    model, tok = tiny
    policy = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])).eval()
    adapters = [p for n, p in policy.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for p in adapters:
            p.normal_(0, 0.3)
    backend = StaticBackend(policy, tok, stop_strings=STOPS, max_len=64)
    ctx = [tok.encode(t, add_special_tokens=False) for t in ("with adapters", "a b c d")]
    greedy = Sampling(greedy=True)
    for _ in range(2):
        want = HFBackend(policy, tok, stop_strings=STOPS).generate(ctx, 8, greedy)
        assert [list(x) for x in backend.generate(ctx, 8, greedy)] == [list(x) for x in want]
        with torch.no_grad():   # an update that moves the adapters only
            for p in adapters:
                p.add_(torch.randn_like(p) * 0.3)
    backend.sync_weights(policy, 2)
    assert backend.lean.check(policy, ctx[1] + ctx[0]) <= 1e-4


def test_a_new_weights_version_is_copied_whatever_the_version_counters_say(tiny):
    """An own copy (mixed precision) was refreshed only when a source's version counter
    moved; a write that does not bump it (through `.data`, or a kernel that skips the bump)
    left the backend decoding stale weights. A new version passed to sync_weights copies
    them whole; the same version does not."""
    from seekrl.models import mixed_precision

    model, tok = tiny
    model = mixed_precision(copy.deepcopy(model))
    backend = StaticBackend(model, tok, stop_strings=(), max_len=64)
    backend.sync_weights(model, 1)
    q = model.model.layers[0].self_attn.q_proj.weight
    q.data.add_(1.0)                       # no version bump
    backend.sync_weights(model, 1)         # the same version: the counters decide
    assert not torch.equal(backend.lean.w["0.q"], q.detach().to(torch.bfloat16))
    backend.sync_weights(model, 2)
    assert torch.equal(backend.lean.w["0.q"], q.detach().to(torch.bfloat16))


def test_adapters_the_merge_would_get_wrong_fall_back(tiny):
    """peft's `.weight` of a wrapped embedding is its base weight: an adapter on
    embed_tokens was dropped (its B starts at 0, so the load probe passed); DoRA rescales
    in its forward. Both are refused, and `static_backend` falls back to HF."""
    from peft import LoraConfig, get_peft_model

    from seekrl.agent.static_backend import unsupported

    model, tok = tiny
    embed = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "embed_tokens"]))
    assert "embed_tokens" in unsupported(embed)
    dora = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True))
    assert "DoRA" in unsupported(dora)
    plain = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    assert unsupported(plain) is None


class _FakeCuda:
    """torch.cuda's stream, graph and pool calls, on CPU, failing as CUDA does: `fails`
    "start" refuses a capture at its start; "step" lets the step raise while it is captured
    (an op that syncs), after which ending the capture fails too and, as in torch, leaves
    the capture stream current and the pool taking allocations."""

    def __init__(self, monkeypatch, fails: str | None = None):
        import contextlib

        class Stream:
            def wait_stream(self, other):
                pass

        class Generator:   # the default CUDA generator: in capture mode until capture_end
            def __init__(self):
                self.capturing = False

            def clone_state(self):
                return Generator()

            def graphsafe_set_state(self, other):
                self.capturing = other.capturing

        self.captures = self.replays = 0
        self.capturing, self.handed_back = False, []
        self.default = self.stream = Stream()
        self.generator = Generator()
        fake = self

        class Graph:
            def replay(self):
                fake.replays += 1

        class Capture:
            def __init__(self, g, pool=None, capture_error_mode="global"):
                self.pool = pool

            def __enter__(self):
                if fails == "start":
                    raise RuntimeError("CUDA error: operation not supported\nmore")
                fake.stream, fake.capturing = Stream(), True
                fake.generator.capturing = True

            def __exit__(self, kind, err, tb):
                fake.capturing = False
                if err is not None:   # capture_end fails before the stream (and, torch
                    # < 2.12, the generator) is restored
                    raise RuntimeError("operation failed due to a previous error during "
                                       "capture")
                fake.captures += 1
                fake.generator.capturing = False
                fake.stream = fake.default

        def hand_back(name):
            return lambda device, pool: fake.handed_back.append((name, pool))

        for name, value in (("Stream", Stream), ("CUDAGraph", Graph), ("graph", Capture),
                            ("current_stream", lambda: fake.stream),
                            ("set_stream", lambda st: setattr(fake, "stream", st)),
                            ("stream", lambda s: contextlib.nullcontext()),
                            ("graph_pool_handle", lambda: (0, 7)),
                            ("current_device", lambda: 0), ("synchronize", lambda: None),
                            ("default_generators", (self.generator,))):
            monkeypatch.setattr(torch.cuda, name, value)
        for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
            monkeypatch.setattr(torch._C, name, hand_back(name), raising=False)

    def step(self, calls: list):
        """A step that refuses to run under capture (as a host sync does) when told to."""
        def run():
            if self.capturing and self.refuse:
                raise RuntimeError("CUDA error: operation not permitted when stream is "
                                   "capturing")
            if self.generator.capturing and not self.capturing:   # a random draw
                raise RuntimeError("Offset increment outside graph capture encountered "
                                   "unexpectedly.")
            calls.append(1)
        self.refuse = True
        return run


def test_a_step_is_warmed_eagerly_then_captured_then_replayed(monkeypatch):
    fake, calls = _FakeCuda(monkeypatch), []
    graphs = _CudaGraphs()
    for _ in range(4):
        graphs.run(("b8", "w64"), lambda: calls.append(1))
    assert (len(calls), fake.captures, fake.replays) == (2, 1, 3)   # warm, capture, 2 replays
    assert graphs._pool == (0, 7) and fake.stream == fake.default
    graphs.clear()
    graphs.run(("b8", "w64"), lambda: calls.append(1))   # weights replaced: warmed again
    assert (len(calls), fake.replays, graphs.failed) == (3, 3, None)


def test_a_capture_that_fails_in_its_step_leaves_cuda_as_it_was(monkeypatch):
    """The step's own error is said (not capture_end's), the stream before the capture is
    current again, the pool is handed back, the generator draws again, the step (which
    draws) runs once eagerly, and later steps run eagerly without another capture."""
    fake, calls = _FakeCuda(monkeypatch, fails="step"), []
    graphs = _CudaGraphs()
    step = fake.step(calls)
    graphs.run("k", step)                       # warm: eager, not captured
    with pytest.warns(RuntimeWarning, match="capture failed") as seen:
        graphs.run("k", step)
        graphs.run("k", step)
        graphs.run("other", step)
    assert len(calls) == 4 and len(seen) == 1
    assert graphs.failed == ("RuntimeError: CUDA error: operation not permitted when stream "
                             "is capturing")
    assert fake.stream == fake.default and not fake.generator.capturing
    assert fake.handed_back == [("_cuda_endAllocateToPool", (0, 7)),
                                ("_cuda_releasePool", (0, 7))]
    assert (fake.captures, fake.replays, graphs._graphs, graphs._pool) == (0, 0, {}, None)


def test_a_failed_capture_decodes_eagerly_with_one_warning(tiny, monkeypatch):
    """A capture CUDA refuses turns graphs off with one warning; every step still runs, so
    greedy episodes give the eager backend's tokens."""
    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=12, n_samples=2, batch_size=3, seed=3,
                        greedy=True)
    examples = [ex(f"q{i}", f"Question {'long ' * i}number {i}?") for i in range(3)]
    eager = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens)
    want = [t.token_ids for t in RolloutEngine(eager, tok, Docs(), cfg).run(examples)]
    fake = _FakeCuda(monkeypatch, fails="start")
    backend = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens)
    backend._graphs = _CudaGraphs()   # as on CUDA: graphs on
    with pytest.warns(RuntimeWarning, match="capture failed .*decodes eagerly") as seen:
        got = [t.token_ids for t in RolloutEngine(backend, tok, Docs(), cfg).run(examples)]
    assert got == want
    assert len([w for w in seen if "capture failed" in str(w.message)]) == 1
    assert backend._graphs.failed == "RuntimeError: CUDA error: operation not supported"
    assert (fake.captures, fake.replays, fake.stream) == (0, 0, fake.default)


# ---------------------------------------------------------------- on CUDA (pytest -m gpu)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_capture_that_fails_on_cuda_leaves_streams_memory_and_random_draws_working():
    """A step that syncs (`.item()`) under capture: the warning, the eager re-run, and CUDA
    as before it: the same current stream, allocations outside the pool, and random draws
    (torch < 2.12 left the default generator in capture mode)."""
    stream = torch.cuda.current_stream()
    x = torch.ones(64, device="cuda")
    seen = []

    def step():
        y = x * torch.rand(64, device="cuda")      # a draw, as sampling makes
        seen.append(float((y >= 0).all().item()))   # a host sync: refused under capture

    graphs = _CudaGraphs()
    graphs.run("k", step)                               # warm: eager on a side stream
    with pytest.warns(RuntimeWarning, match="capture failed"):
        graphs.run("k", step)
    graphs.run("k", step)
    assert graphs.failed is not None and seen == [1.0, 1.0, 1.0]
    assert torch.cuda.current_stream() == stream
    z = torch.rand(1000, device="cuda") + torch.empty(10**6, device="cuda").fill_(1).sum()
    torch.cuda.synchronize()
    assert z.shape == (1000,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_decode_the_eager_tokens(tiny, dtype):
    """Captured and replayed steps (finished flags read every 8 steps) give the eager
    path's greedy episodes, and HFBackend's in float32; sampled log-probs under graphs
    equal a full forward's."""
    model, tok = tiny
    model = copy.deepcopy(model).to("cuda", getattr(torch, dtype))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=40, n_samples=2, batch_size=3, seed=3,
                        greedy=True)
    examples = [ex(f"q{i}", f"Question {'long ' * i}number {i}?") for i in range(4)]
    runs = {}
    for name, graphs in (("graphs", None), ("eager", False)):
        backend = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens,
                                width_step=16, graphs=graphs)
        runs[name] = [t.token_ids for t in RolloutEngine(backend, tok, Docs(), cfg).run(examples)]
        if graphs is None:   # captured and replayed, not fallen back to eager
            assert backend._graphs is not None and backend._graphs._graphs
            assert backend._graphs.failed is None
    assert runs["graphs"] == runs["eager"]
    if dtype != "float32":
        return
    hf = RolloutEngine(HFBackend(model, tok, stop_strings=STOPS), tok, Docs(), cfg).run(examples)
    assert runs["graphs"] == [t.token_ids for t in hf]
    from seekrl.models import collate
    from seekrl.rl.forward import masked_logprobs

    sampled = RolloutConfig(max_turns=2, max_new_tokens=40, n_samples=3, temperature=0.7, seed=2)
    backend = StaticBackend(model, tok, max_len=sampled.max_total_tokens, width_step=16)
    trajs = RolloutEngine(backend, tok, Docs(), sampled).run(examples[:2])
    assert backend._graphs.failed is None   # sampling captured too
    ids, attn, mask = collate([t.token_ids for t in trajs], [t.loss_mask for t in trajs],
                              tok.pad_token_id, "cuda")
    with torch.no_grad():
        lp = masked_logprobs(model, ids, attn, mask, temperature=0.7)["logprobs"]
    for r, t in enumerate(trajs):
        assert torch.allclose(lp[r][mask[r].bool()].cpu(), torch.tensor(t.rollout_logprobs),
                              atol=1e-4)
