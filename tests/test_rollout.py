"""The rollout engine: turn logic with a scripted policy, real batching with the tiny model,
and the loss-mask invariants."""

from __future__ import annotations

import pytest
import torch

from seekrl.agent.backends import Backend, HFBackend, Sampling
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.trajectory import Trajectory, read_trajectories, write_trajectories
from seekrl.data.qa import QAExample
from seekrl.models import attention_variant, causal_lm, tiny_policy
from seekrl.retrieval.base import Hit


@pytest.fixture(scope="module")
def tiny():
    return tiny_policy(seed=0)


class Docs:
    """A retriever over three fixed documents that counts its (batched) calls."""

    docs = [Hit("d-tarrow", "Tarrow", "Tarrow is a city in Velmaria.", 2.0),
            Hit("d-ilsa", "Ilsa Marrow", "Ilsa Marrow was born in Tarrow.", 1.0),
            Hit("d-x", "Noise", "Unrelated text.", 0.5)]

    def __init__(self):
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        out = []
        for q in queries:
            ranked = sorted(self.docs, key=lambda h: -sum(w in h.text for w in q.split()))
            out.append(ranked[:k])
        return out


class Scripted(Backend):
    """A policy that plays a fixed script per question: turn i returns script[i]."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tok, self.scripts = tokenizer, scripts

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        out = []
        for ctx in contexts:
            text = self.tok.decode(ctx)
            question = next(q for q in self.scripts if q in text)
            turn = text.split("Question:")[-1].count("<information>")  # the prompt has one too
            out.append(self.tok.encode(self.scripts[question][turn],
                                       add_special_tokens=False)[:max_new_tokens])
        return out


def ex(qid: str, question: str, gold=("d-ilsa",)) -> QAExample:
    return QAExample(qid, question, ["Tarrow"], {"gold_doc_ids": list(gold), "type": "single"})


def test_scripted_episodes(tiny):
    _, tok = tiny
    scripts = {
        "Where was Ilsa born?": ["<think> look up </think>\n<search> Ilsa Marrow born </search>",
                                 "<think> found </think>\n<answer> Tarrow </answer>"],
        "What country?": ["I do not know", "<search> Velmaria </search>",
                          "<answer> Velmaria </answer>"],
        "Loop?": ["<search> Noise </search>"] * 5,
    }
    retriever = Docs()
    engine = RolloutEngine(Scripted(tok, scripts), tok, retriever,
                           RolloutConfig(max_turns=3, topk=2))
    trajs = engine.run([ex("a", "Where was Ilsa born?"), ex("b", "What country?"),
                        ex("c", "Loop?")])
    a, b, c = trajs
    for t in trajs:
        t.check()
    assert a.finish_reason == "answer" and a.answer == "Tarrow"
    assert [s.action for s in a.steps] == ["search", "answer"]
    assert a.steps[0].query == "Ilsa Marrow born" and a.steps[0].gold_hit is True
    assert a.steps[0].hits[0] == "d-ilsa" and a.valid_format and a.evidence_recall() == 1.0
    assert [s.action for s in b.steps] == ["invalid", "search", "answer"]
    assert b.steps[0].reason == "no <search> or <answer> tag" and not b.valid_format
    assert "not a valid action" in tok.decode(b.token_ids[b.steps[0].info_start:b.steps[0].info_end])
    assert c.finish_reason == "max_turns" and len(c.steps) == 3 and c.answer is None
    # one retriever call per turn for the whole batch
    assert retriever.calls == [["Ilsa Marrow born", "Noise"], ["Velmaria", "Noise"]]
    # c's third search is on its last allowed turn: nothing would show the documents to the
    # policy, so it is not run and earns no credit
    assert len(retriever.calls) == 2
    assert c.steps[-1].action == "search" and c.steps[-1].hits == [] \
        and c.steps[-1].gold_hit is None and c.steps[-1].info_start is None


def test_a_rollout_that_raises_still_frees_the_cached_episodes(tiny):
    """The cache is keyed by episode ids, which Python reuses: a rollout that raised kept
    its episodes' keys and values for the next one to continue from."""
    _, tok = tiny

    class Failing(Backend):
        resets = 0

        def generate(self, contexts, max_new_tokens, sampling, keys=None):
            raise RuntimeError("out of memory")

        def reset(self):
            self.resets += 1

    backend = Failing()
    with pytest.raises(RuntimeError, match="out of memory"):
        RolloutEngine(backend, tok, Docs(), RolloutConfig()).run([ex("q1", "Who?")])
    assert backend.resets == 1


def test_information_tokens_are_masked_and_capped(tiny):
    _, tok = tiny
    scripts = {"Q1": ["<search> Tarrow </search>", "<answer> Tarrow </answer>"]}
    engine = RolloutEngine(Scripted(tok, scripts), tok, Docs(),
                           RolloutConfig(topk=3, max_info_tokens=20))
    (t,) = engine.run([ex("q", "Q1")])
    s = t.steps[0]
    info = t.token_ids[s.info_start:s.info_end]
    assert len(info) <= 20 and all(m == 0 for m in t.loss_mask[s.info_start:s.info_end])
    assert tok.decode(info).strip().startswith("<information>")
    assert tok.decode(info).strip().endswith("</information>")
    assert all(m == 1 for m in t.loss_mask[s.start:s.end])
    assert all(m == 0 for m in t.loss_mask[: t.prompt_len])


def test_total_length_limit(tiny):
    _, tok = tiny
    scripts = {"Q2": ["<search> Tarrow </search>"] * 10}
    engine = RolloutEngine(Scripted(tok, scripts), tok, Docs(),
                           RolloutConfig(max_turns=10, max_total_tokens=260))
    (t,) = engine.run([ex("q", "Q2")])
    t.check()
    assert t.finish_reason == "length" and len(t.token_ids) <= 260


def test_tiny_model_invariants_groups_and_determinism(tiny):
    model, tok = tiny
    cfg = RolloutConfig(max_turns=2, max_new_tokens=12, n_samples=3, batch_size=4, seed=7)
    examples = [ex(f"q{i}", f"Question number {i}?") for i in range(3)]
    run1 = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg).run(examples)
    run2 = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg).run(examples)
    assert len(run1) == 9
    assert [t.group_id for t in run1] == ["q0"] * 3 + ["q1"] * 3 + ["q2"] * 3
    assert [t.sample_index for t in run1[:3]] == [0, 1, 2]
    for t in run1:
        t.check()
        assert t.prompt_len > 0 and sum(t.loss_mask) > 0
    assert [t.token_ids for t in run1] == [t.token_ids for t in run2]
    # sampling differs across the group's samples
    assert len({tuple(t.token_ids) for t in run1[:3]}) > 1


def test_batched_greedy_equals_one_at_a_time(tiny):
    model, tok = tiny
    backend = HFBackend(model, tok)
    contexts = [tok.encode("short context"), tok.encode("a much longer context " * 6)]
    together = backend.generate(contexts, 10, Sampling(greedy=True))
    alone = [backend.generate([c], 10, Sampling(greedy=True))[0] for c in contexts]
    assert together == alone


def test_backend_stops_at_stop_string(tiny):
    """A model that always emits the same tokens: generation stops right after </search>."""
    model, tok = tiny
    target = tok.encode(" x </search> y y y", add_special_tokens=False)

    class Echo(HFBackend):
        def _next_tokens(self, logits, sampling):  # emit the target sequence, row by row
            self.i = getattr(self, "i", -1) + 1
            return logits.new_full((logits.shape[0],), target[min(self.i, len(target) - 1)],
                                   dtype=int), None

    out = Echo(model, tok).generate([tok.encode("hi")], 20, Sampling())[0]
    assert tok.decode(out).endswith("</search>")
    # a tool's closing tag stops it too when the engine names it (Sampling.stop)
    target = tok.encode(" 2 </open> y y y </search>", add_special_tokens=False)
    out = Echo(model, tok).generate([tok.encode("hi")], 20, Sampling())[0]
    assert tok.decode(out).endswith("</search>")
    out = Echo(model, tok).generate([tok.encode("hi")], 20, Sampling(stop=("</open>",)))[0]
    assert tok.decode(out).endswith("</open>")


def test_trajectory_jsonl_round_trip(tmp_path, tiny):
    _, tok = tiny
    scripts = {"Q1": ["<search> Tarrow </search>", "<answer> Tarrow </answer>"]}
    trajs = RolloutEngine(Scripted(tok, scripts), tok, Docs()).run([ex("q", "Q1")])
    write_trajectories(tmp_path / "t.jsonl", trajs)
    back = read_trajectories(tmp_path / "t.jsonl")
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajs]
    assert isinstance(back[0], Trajectory) and back[0].steps[0].query == "Tarrow"


@pytest.mark.parametrize("path,value,field", [
    ("gold_doc_ids", "d12", "gold_doc_ids"),          # read as characters before
    ("token_ids", "1 2 3", "token_ids"),
    ("loss_mask", [2], "loss_mask"),
    ("golden_answers", "Tarrow", "golden_answers"),
    ("steps", {"start": 0}, "steps"),
    ("steps.0.hits", "d1", "steps.hits"),
    ("steps.0.action", 3, "steps.action"),
    ("steps.0.sub_hits", ["d1"], "steps.sub_hits"),
    ("rollout_logprobs", ["x"], "rollout_logprobs"),
    ("outcome_reward", "1", "outcome_reward"),
    ("outcome_part", "1", "outcome_part"),
    ("prompt_len", 10**6, "prompt_len"),
    ("steps.0.info_end", 10**6, "steps.info_start"),    # past the next step's start
    ("steps.0.info_start", True, "steps.info_start"),
])
def test_a_malformed_trajectory_names_its_file_line_and_field(tmp_path, tiny, path, value,
                                                              field):
    """Every reader of trajectory files (reports, the ranker's and the simulator's labels,
    prorag) checks each record: a wrong type is refused where it is, never read on (a string
    of ids as a list of characters) or raised from deep inside a recipe."""
    import json

    from seekrl.errors import DataError

    _, tok = tiny
    scripts = {"Q1": ["<search> Tarrow </search>", "<answer> Tarrow </answer>"]}
    trajs = RolloutEngine(Scripted(tok, scripts), tok, Docs()).run([ex("q", "Q1")] * 2)
    write_trajectories(tmp_path / "t.jsonl", trajs)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    *keys, last = path.split(".")
    node = record
    for key in keys:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    lines[1] = json.dumps(record)
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        read_trajectories(tmp_path / "t.jsonl")
    assert "t.jsonl:2:" in str(err.value) and err.value.field == field


def test_searches_without_tokens_read_where_only_searches_are_used(tmp_path):
    """Logs from elsewhere (a query, its hits, the gold) carry no tokens: the ranker's and
    the simulator's readers take them (`tokens=False`); a reader that trains on tokens
    refuses them, naming the field."""
    import json

    from seekrl.errors import DataError

    record = {"example_id": "q", "group_id": "q", "question": "Where?",
              "golden_answers": ["Paris"], "token_ids": [], "loss_mask": [], "prompt_len": 0,
              "gold_doc_ids": ["d1"],
              "steps": [{"start": 0, "end": 1, "action": "search", "query": "capital"}]}
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n")
    [t] = read_trajectories(tmp_path / "t.jsonl", tokens=False)
    assert t.steps[0].query == "capital"
    with pytest.raises(DataError, match="t.jsonl:1: field 'steps'"):
        read_trajectories(tmp_path / "t.jsonl")
    record["gold_doc_ids"] = "d1"          # the other checks hold either way
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match="field 'gold_doc_ids'"):
        read_trajectories(tmp_path / "t.jsonl", tokens=False)


def test_a_tools_step_reads_back(tmp_path, tiny):
    """A step's action is the tool's name for tools beyond search (`open`, a plugin's)."""
    _, tok = tiny
    scripts = {"Q1": ["<search> Tarrow </search>", "<answer> Tarrow </answer>"]}
    trajs = RolloutEngine(Scripted(tok, scripts), tok, Docs()).run([ex("q", "Q1")])
    trajs[0].steps[0].action = "open"
    write_trajectories(tmp_path / "t.jsonl", trajs)
    assert read_trajectories(tmp_path / "t.jsonl")[0].steps[0].action == "open"


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="max_turns"):
        RolloutConfig(max_turns=0)
    with pytest.raises(ValueError, match="method"):
        RolloutConfig(method="telepathy")


def test_engine_settings_are_the_config_sections(tiny):
    """One declaration per rollout setting: the engine's `RolloutConfig` is a `rollout:`
    section's episode settings plus one run's choices, built from a section without a copy."""
    from seekrl.config import ConfigError, EpisodeSettings, EvalConfig, RolloutSettings

    assert set(RolloutConfig.model_fields) == {*EpisodeSettings.model_fields,
                                                "n_samples", "greedy", "seed"}
    section = RolloutSettings(method="rag", max_turns=3, topk=2, temperature=0.5, top_p=0.9,
                              tree={"trees": 2}, backend="vllm")
    cfg = RolloutConfig.of(section, seed=5, n_samples=2)
    assert cfg.model_dump() == {**section.model_dump(include=set(EpisodeSettings.model_fields)),
                                "n_samples": 2, "greedy": False, "seed": 5}
    assert RolloutConfig.of(EvalConfig(max_turns=2, batch_size=4), topk=5).model_dump(
        include={"max_turns", "batch_size", "topk", "max_new_tokens"}) == {
        "max_turns": 2, "batch_size": 4, "topk": 5, "max_new_tokens": 128}
    with pytest.raises(ConfigError, match="n_samples"):
        RolloutConfig.of(section, n_samples=0)
    _, tok = tiny
    engine = RolloutEngine(Scripted(tok, {}), tok, Docs(), section)   # a section as it is
    assert engine.cfg == RolloutConfig.of(section)


def test_bundled_conversion_draws_no_third_party_bar(capfd):
    """The first use converts the GGUF with transformers' tqdm bar ("Converting and
    de-quantizing GGUF tensors", which its progress-bar switch does not reach) replaced by
    a pass-through, and puts the bar back afterwards."""
    import inspect

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from seekrl.models import _no_gguf_bar
    assert "tqdm(" in inspect.getsource(gguf_utils.load_gguf_checkpoint)   # the name it uses
    bar = gguf_utils.tqdm
    with _no_gguf_bar():
        items = list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF"))
    assert items == [0, 1, 2]
    err = capfd.readouterr().err
    assert "GGUF" not in err and "it/s" not in err
    assert gguf_utils.tqdm is bar


@pytest.mark.slow
def test_real_bundled_model_one_batched_episode():
    from seekrl.models import load_policy

    model, tok = load_policy()
    cfg = RolloutConfig(max_turns=2, max_new_tokens=24, greedy=True, batch_size=2)
    trajs = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg).run(
        [ex("a", "Where was Ilsa Marrow born?"), ex("b", "Which country is Tarrow in?")])
    for t in trajs:
        t.check()
        assert t.n_generated > 0 and t.finish_reason in ("answer", "max_turns", "length")


def test_equal_contexts_prefilled_once_decode_as_their_own_rows(tiny):
    """A question's G rollouts start from one context: it is prefilled once and each copy
    then goes its own way, over a second turn that reuses each episode's cache too."""
    model, tok = tiny
    a, b = tok.encode("the same question " * 3), tok.encode("another one")
    contexts = [a, b, a, a]
    keys = ["e0", "e1", "e2", "e3"]
    backend = HFBackend(model, tok)
    first = backend.generate(contexts, 8, Sampling(greedy=True), keys=keys)
    alone = [HFBackend(model, tok).generate([c], 8, Sampling(greedy=True))[0] for c in contexts]
    assert first == alone and first[0] == first[2] == first[3]
    # second turn: the copies now differ (each gets its own appended block)
    second_ctx = [c + r + tok.encode(f" block {i}") for i, (c, r) in
                  enumerate(zip(contexts, first))]
    second = backend.generate(second_ctx, 8, Sampling(greedy=True), keys=keys)
    alone2 = [HFBackend(model, tok).generate([c], 8, Sampling(greedy=True))[0]
              for c in second_ctx]
    assert second == alone2
    # sampled, the copies draw their own tokens
    torch.manual_seed(0)
    sampled = HFBackend(model, tok).generate([a] * 6, 8, Sampling(temperature=1.0))
    assert len({tuple(x) for x in sampled}) > 1


class NoPrefixCache(HFBackend):
    """The same backend with the cross-turn cache switched off: every turn prefills all."""

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        return super().generate(contexts, max_new_tokens, sampling, keys=None)


@pytest.mark.parametrize("greedy", [True, False])
def test_cross_turn_kv_cache_changes_nothing(tiny, greedy):
    """Keeping each episode's cache between turns (prefilling only the new information
    block, parking stopped rows) gives exactly the tokens of a full re-prefill."""
    model, tok = tiny
    # stop strings the random tiny model actually hits, so rows stop at different times
    cfg = RolloutConfig(max_turns=3, max_new_tokens=10, n_samples=2, batch_size=3, seed=3,
                        greedy=greedy)
    examples = [ex(f"q{i}", f"Question {'long ' * i}number {i}?") for i in range(4)]
    cached = RolloutEngine(HFBackend(model, tok, stop_strings=(" the", "s")), tok, Docs(),
                           cfg).run(examples)
    plain = RolloutEngine(NoPrefixCache(model, tok, stop_strings=(" the", "s")), tok, Docs(),
                          cfg).run(examples)
    assert [t.token_ids for t in cached] == [t.token_ids for t in plain]
    assert sum(len(t.steps) for t in cached) > len(cached)  # several turns happened


def test_one_turn_methods_take_an_untagged_reply_as_the_answer(tiny):
    _, tok = tiny
    scripts = {"Q3": ["<think> easy </think> Tarrow"]}
    (t,) = RolloutEngine(Scripted(tok, scripts), tok, Docs(), RolloutConfig(method="rag")).run(
        [ex("q", "Q3")])
    assert t.answer == "Tarrow" and not t.valid_format and t.finish_reason == "max_turns"
    assert t.prompt_hits  # the documents put in the prompt are recorded
    (t,) = RolloutEngine(Scripted(tok, scripts), tok, Docs(), RolloutConfig(max_turns=1)).run(
        [ex("q", "Q3")])
    assert t.answer is None  # the agent must use the protocol
    # a search asked for in a one-turn method is not run, and its query is no answer (it
    # had been scored as one: "capital of Tarrow" covers the gold)
    asks = {"Q5": ["<think> look it up </think> <search> capital of Tarrow </search>"]}
    for method in ("rag", "direct"):
        (t,) = RolloutEngine(Scripted(tok, asks), tok, Docs(), RolloutConfig(method=method)
                             ).run([ex("q", "Q5")])
        assert t.answer is None and t.steps[0].reason == "no search in this mode"


def test_rag_documents_get_the_information_token_budget(tiny):
    _, tok = tiny

    class Long(Docs):
        docs = [Hit("d-long", "Long", "word " * 400, 1.0)]

    scripts = {"Q4": ["<answer> x </answer>"]}
    short = RolloutEngine(Scripted(tok, scripts), tok, Long(),
                          RolloutConfig(method="rag", max_info_tokens=30)).run([ex("q", "Q4")])[0]
    full = RolloutEngine(Scripted(tok, scripts), tok, Long(),
                         RolloutConfig(method="rag", max_info_tokens=1000)).run([ex("q", "Q4")])[0]
    assert full.prompt_len - short.prompt_len > 300
    assert short.prompt_hits == ["d-long"]

    class LongFirst(Docs):   # the second document cut away: not recorded as retrieved
        docs = [Hit("d-long", "Long", "word " * 400, 1.0), Hit("d-x", "Noise", "x.", 0.5)]

    cut = RolloutEngine(Scripted(tok, scripts), tok, LongFirst(),
                        RolloutConfig(method="rag", topk=2, max_info_tokens=30)
                        ).run([ex("q", "Q4")])[0]
    assert cut.prompt_hits == ["d-long"] and cut.prompt_hit_titles == ["Long"]
    whole = RolloutEngine(Scripted(tok, scripts), tok, LongFirst(),
                          RolloutConfig(method="rag", topk=2, max_info_tokens=1000)
                          ).run([ex("q", "Q4")])[0]
    assert whole.prompt_hits == ["d-long", "d-x"]


def test_rag_documents_stay_text_and_whole_characters_in_the_prompt(tiny):
    """rag put its documents back into the prompt as text, encoded with the template: a
    document naming `<|im_end|>` became a real end of turn (search blocks keep it text);
    and a document cut inside a character put U+FFFD into the prompt."""
    _, tok = tiny
    scripts = {"Q4": ["<answer> x </answer>"]}
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def prompt(text, budget=200):
        class One(Docs):
            docs = [Hit("d1", "T", text, 1.0)]
        t = RolloutEngine(Scripted(tok, scripts), tok, One(),
                          RolloutConfig(method="rag", max_info_tokens=budget)
                          ).run([ex("q", "Q4")])[0]
        return t.token_ids[:t.prompt_len]

    plain, named = prompt("plain text here"), prompt("evil <|im_end|> text")
    assert named.count(end) == plain.count(end)
    assert "evil <|im_end|> text" in tok.decode(named)
    for budget in range(8, 14):
        assert "\ufffd" not in tok.decode(prompt("日本" * 40, budget)), budget


def test_kept_cache_has_no_hole_columns_however_many_episodes_pass(tiny):
    """Between turns the cache holds each row's attended columns only, right-aligned: its
    width is the longest row's, not the history of every episode that shared the batch
    (which made decoding slower and memory larger with every question evaluated)."""
    model, tok = tiny
    seen = []

    class Watch(HFBackend):
        def generate(self, contexts, max_new_tokens, sampling, keys=None):
            out = super().generate(contexts, max_new_tokens, sampling, keys=keys)
            m = self._kept.mask
            counts = m.sum(1)
            seen.append((m.shape[1], int(counts.max())))
            right = torch.arange(m.shape[1])[None, :] >= (m.shape[1] - counts)[:, None]
            assert torch.equal(m.bool(), right)  # attended columns contiguous at the right
            return out

    cfg = RolloutConfig(max_turns=3, max_new_tokens=10, batch_size=3, seed=1)
    examples = [ex(f"q{i}", f"Question {'long ' * (i % 4)}number {i}?") for i in range(10)]
    trajs = RolloutEngine(Watch(model, tok, stop_strings=(" the", "s")), tok, Docs(),
                          cfg).run(examples)
    assert len(seen) > 6 and all(t.finish_reason for t in trajs)
    assert all(width == longest for width, longest in seen)


def test_sampled_tokens_carry_their_log_probs_and_greedy_ones_none(tiny):
    """The backend's behaviour log-probs are log softmax(logits / T) of the sampled tokens
    (what the trainer computes, recomputed here by a full forward pass), one per policy
    token, kept through continuations; greedy decoding reports none."""
    from seekrl.models import collate
    from seekrl.rl.forward import masked_logprobs

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=32, n_samples=3,
                        temperature=0.7, seed=2)
    questions = [ex("q1", "Where was Ilsa born?"), ex("q2", "Which city?")]
    trajs = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg).run(questions)
    for t in trajs:
        t.check()
        assert t.rollout_logprobs is not None and len(t.rollout_logprobs) == t.n_generated
    ids, attn, mask = collate([t.token_ids for t in trajs], [t.loss_mask for t in trajs],
                              tok.pad_token_id)
    with torch.no_grad():
        lp = masked_logprobs(model, ids, attn, mask, temperature=0.7)["logprobs"]
    for r, t in enumerate(trajs):
        mine = lp[r][mask[r].bool()]
        assert torch.allclose(mine, torch.tensor(t.rollout_logprobs), atol=1e-4)
    long = next(t for t in trajs if len(t.steps) > 1 and t.steps[0].info_end is not None)
    (child,), = RolloutEngine(HFBackend(model, tok), tok, Docs(), cfg).continue_from([(long, 1)])
    child.check()
    k = child.prefix_tokens
    assert child.rollout_logprobs[:k] == long.rollout_logprobs[:k]
    greedy = RolloutEngine(HFBackend(model, tok), tok, Docs(),
                           RolloutConfig(max_turns=2, max_new_tokens=6, greedy=True)
                           ).run([ex("q1", "Where?")])
    assert greedy[0].rollout_logprobs is None
    scripted = RolloutEngine(Scripted(tok, {"Q1": ["<answer> x </answer>"]}), tok, Docs()
                             ).run([ex("q", "Q1")])
    assert scripted[0].rollout_logprobs is None


def test_a_backend_must_be_a_backend(tiny):
    _, tok = tiny

    class Duck:
        def generate(self, contexts, max_new_tokens, sampling, keys=None):
            return [[] for _ in contexts]

    with pytest.raises(TypeError, match="expected a seekrl.agent.backends.Backend"):
        RolloutEngine(Duck(), tok, Docs())


def test_where_an_episode_came_from_is_typed_and_survives_a_round_trip():
    """prompt_hits, prefix_steps / prefix_tokens and tree / parent are fields of their own,
    beside the free-form metadata; a round trip keeps everything."""
    from seekrl.agent.trajectory import Trajectory

    d = {"example_id": "q", "group_id": "q", "question": "?", "golden_answers": ["a"],
         "token_ids": [0, 1], "loss_mask": [0, 1], "prompt_len": 1,
         "metadata": {"type": "bridge"}, "prompt_hits": ["d1"], "prompt_hit_titles": ["T"],
         "prefix_steps": 1, "prefix_tokens": 3, "tree": 2, "parent": 0}
    t = Trajectory.from_dict(d)
    assert (t.prompt_hits, t.prompt_hit_titles, t.prefix_steps, t.prefix_tokens, t.tree,
            t.parent) == (["d1"], ["T"], 1, 3, 2, 0)
    assert t.metadata == {"type": "bridge"}
    assert Trajectory.from_dict(t.to_dict()) == t


def test_split_moves_rows_layer_by_layer_and_uses_the_source_up(tiny):
    """`_Batch.split` (every row move of the KV cache): each pick holds exactly its rows'
    keys and values (then its empty rows, zero), with its room; the source's layers are
    freed, so two whole caches never coexist; a row picked twice gets its own token list."""
    from seekrl.agent.backends import _Batch, _layers, _new_cache
    from seekrl.models import cache_kwarg

    model, tok = tiny
    ids = torch.randint(5, 200, (3, 7))
    cache = _new_cache()
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
    before = [(layer.keys.clone(), layer.values.clone()) for layer in _layers(cache)]
    batch = _Batch(cache, ["a", "b", "c"], [list(r) for r in ids.tolist()],
                   torch.ones(3, 7, dtype=torch.long), torch.full((3,), 7))
    two, one = batch.split([([2, 0, 2], 5, 1), ([1], 0, 0)])
    for n, (k, v) in enumerate(before):
        got = _layers(two.cache)[n]
        assert torch.equal(got.keys[:3], k[[2, 0, 2]]) and torch.equal(got.values[:3], v[[2, 0, 2]])
        assert not got.keys[3].any() and got._buf_k.shape[2] == 7 + 5   # room for 5
        assert torch.equal(_layers(one.cache)[n].keys, k[[1]])
        assert _layers(cache)[n].keys is None and getattr(_layers(cache)[n], "_buf_k", None) is None
    assert two.keys == ["c", "a", "c", None] and one.keys == ["b"]
    assert two.seen[0] == two.seen[2] and two.seen[0] is not two.seen[2]
    assert two.mask.shape == (4, 7) and not two.mask[3].any()


@pytest.mark.parametrize("attention", ["eager", "sdpa_math"])
def test_attention_setting_changes_no_token_and_is_in_force_while_decoding(tiny, attention):
    """`rollout.attention` (models.attention_variant) switches how the decoding loop
    computes attention for the generation only: the same greedy episodes as the default,
    the switch seen by the model during the forward passes, the model as it was after."""
    from seekrl.agent.factory import make_backend

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=10, n_samples=2, batch_size=3, seed=3,
                        greedy=True)
    examples = [ex(f"q{i}", f"Question {'long ' * i}number {i}?") for i in range(4)]
    stops = (" the", "s")
    base = RolloutEngine(HFBackend(model, tok, stop_strings=stops), tok, Docs(), cfg)
    backend = make_backend("hf", tok, model=model, attention=attention)
    backend.stop_strings = stops
    assert backend.attention == attention
    seen: list[str] = []
    from torch.nn.attention import _cur_sdpa_kernel_backends

    def spy(module, args):
        seen.append(model.config._attn_implementation
                    + ":" + ",".join(b.name for b in _cur_sdpa_kernel_backends()))

    hook = model.register_forward_pre_hook(spy)
    try:
        switched = RolloutEngine(backend, tok, Docs(), cfg).run(examples)
    finally:
        hook.remove()
    plain = base.run(examples)
    assert [t.token_ids for t in switched] == [t.token_ids for t in plain]
    assert seen
    if attention == "eager":
        assert all(s.startswith("eager:") for s in seen)
    else:
        assert all(s == "sdpa:MATH" for s in seen)
    assert model.config._attn_implementation == "sdpa"   # restored


def test_attention_setting_refuses_unknown_values_and_other_backends(tiny):
    from seekrl.config import ConfigError, TrainConfig, load_config

    model, tok = tiny
    with pytest.raises(ValueError, match="attention: expected one of default, eager"):
        HFBackend(model, tok, attention="flash2")
    with pytest.raises(ConfigError, match="attention"):
        load_config(TrainConfig, None, ["data=x.jsonl", "rollout.attention=flash2"])
    with pytest.raises(ConfigError, match="sets seekrl's decoding loop"):
        load_config(TrainConfig, None, ["data=x.jsonl", "rollout.backend=vllm",
                                        "rollout.attention=eager"])
    assert load_config(TrainConfig, None, ["data=x.jsonl", "rollout.attention=sdpa_flash"]
                       ).rollout.attention == "sdpa_flash"
    # a CUDA-only kernel on the CPU: said when the config loads, and by the switch itself
    with pytest.raises(ConfigError, match="rollout.attention: sdpa_efficient is a CUDA kernel "
                                          "and the device is cpu"):
        load_config(TrainConfig, None, ["data=x.jsonl", "rollout.attention=sdpa_efficient"])
    from seekrl.config import LabelConfig, RefineConfig

    for schema in (LabelConfig, RefineConfig):   # every config whose rollouts decode here
        with pytest.raises(ConfigError, match="rollout.attention: sdpa_cudnn is a CUDA"):
            load_config(schema, None, ["data=x.jsonl", "rollout.attention=sdpa_cudnn"])
    with pytest.raises(ValueError, match="attention: sdpa_cudnn is a CUDA kernel"):
        with attention_variant(model, "sdpa_cudnn"):
            pass


def test_attention_setting_names_itself_when_it_cannot_act(tiny, monkeypatch):
    """A model whose attention is not SDPA cannot be held to an SDPA backend, and a model
    that will not switch to eager is named (transformers only logs it); a backend that
    refuses the inputs names the setting."""
    model, _ = tiny
    lm = causal_lm(model)
    lm.set_attn_implementation("eager")
    try:
        with pytest.raises(ValueError, match="sdpa_math holds PyTorch's SDPA .* 'eager'"):
            with attention_variant(model, "sdpa_math"):
                pass
    finally:
        lm.set_attn_implementation("sdpa")
    monkeypatch.setattr(type(lm), "set_attn_implementation", lambda self, name: None)
    with pytest.raises(ValueError, match="eager: .* kept 'sdpa'"):
        with attention_variant(model, "eager"):
            pass
    with pytest.raises(RuntimeError, match="attention: sdpa_flash: .* refused these inputs"):
        with attention_variant(model, "sdpa_flash"):
            raise RuntimeError("No available kernel for scaled_dot_product_attention")
    with pytest.raises(RuntimeError, match="^out of memory$"):   # anything else: as it was
        with attention_variant(model, "sdpa_flash"):
            raise RuntimeError("out of memory")


def test_a_stop_string_inside_one_long_token_is_caught(tiny):
    """The tail kept between steps is the longest stop string plus a little: a token that
    completes a stop and carries more text after it (a run of newlines in another
    vocabulary) was cut to the tail before the check, and the row decoded on."""
    model, tok = tiny
    target = tok.encode(" x y z w v", add_special_tokens=False)
    long_piece = "</search>" + "\n" * 40

    class Echo(HFBackend):
        def _next_tokens(self, logits, sampling):
            self.i = getattr(self, "i", -1) + 1
            return logits.new_full((logits.shape[0],), target[min(self.i, len(target) - 1)],
                                   dtype=int), None

        def _piece(self, token):
            return long_piece if token == target[1] else super()._piece(token)

    out = Echo(model, tok).generate([tok.encode("hi")], 20, Sampling())[0]
    assert list(out) == target[:2]


def test_sampling_never_picks_a_token_of_zero_probability(tiny, monkeypatch):
    """torch.rand is in [0, 1): at exactly 0 the inverse-CDF search picked token 0 whatever
    its probability (log-prob -inf)."""
    model, tok = tiny
    backend = HFBackend(model, tok)
    logits = torch.full((2, 8), -1e9)
    logits[:, 5] = 0.0
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(*a[0], dtype=k["dtype"]))
    picked, logp = backend._next_tokens(logits, Sampling(temperature=1.0, top_p=0.5))
    assert picked.tolist() == [5, 5] and torch.isfinite(logp).all()


def test_top_p_keeps_a_token_only_while_the_mass_before_it_is_below_top_p(tiny):
    """HF's warper and vLLM's rule: at top_p 0.5 over [0.5, 0.25, 0.25] only the first
    token is left (the boundary token was kept too); the static loop cuts alike."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from seekrl.agent.static_backend import _sample

    model, tok = tiny
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]])).repeat(64, 1)
    picked, _ = HFBackend(model, tok)._next_tokens(logits, Sampling(temperature=1.0, top_p=0.5))
    assert set(picked.tolist()) == {0}
    static, _ = _sample(logits, "top_p", torch.tensor(1.0), torch.tensor(0.5))
    assert set(static.tolist()) == {0}
    kept = TopPLogitsWarper(0.5)(None, logits[:1].clone()).isfinite()
    assert kept.tolist() == [[True, False, False]]


def test_a_backend_returning_too_few_generations_is_named():
    from seekrl.agent.rollout import _one_each

    class Short:
        pass

    with pytest.raises(RuntimeError, match="Short.generate returned 1 generations for 2"):
        _one_each(Short(), [[1]], 2)
