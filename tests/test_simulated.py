"""Simulated search (ZeroSearch) and self-search (SSRL): the simulator's prompt, parsing its
documents into hits (malformed output included), the noise curriculum, the retriever in the
rollout engine and the trainer, the simulator's SFT data, `seekrl serve --simulate`, and which
self-search tokens are trained."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.backends import Backend
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.data.qa import QAExample, read_qa_jsonl
from seekrl.retrieval.base import Hit, RetrievalError
from seekrl.retrieval.server import create_app
from seekrl.retrieval.simulated import (
    NOISY,
    USEFUL,
    SimulatedRetriever,
    noise_probability,
    parse_documents,
    simulator_prompt,
    simulator_quality,
    simulator_target,
)

GOOD = ("Doc 1 (Title: Tarrow) Tarrow is a city of 40,000 people.\n"
        "Doc 2 (Title: Kelbaan) Kelbaan Records was founded in 1986.\n"
        "Doc 3 (Title: Extra) One too many.")


class Scripted(SimulatedRetriever):
    """The simulator's replies scripted; records the prompts it got."""

    def __init__(self, replies, **kw):
        super().__init__(None, None, **kw)
        self.replies, self.prompts = list(replies), []

    def generate(self, prompts):
        self.prompts += prompts
        return [self.replies[(len(self.prompts) - len(prompts) + i) % len(self.replies)]
                for i in range(len(prompts))]


# ---- the prompt and the parser
def test_useful_prompt_holds_query_question_and_answer_noisy_leaves_the_answer_out():
    useful = simulator_prompt("Tarrow population", 3, question="How big is Tarrow?",
                              answer="40,000")
    assert "Query: Tarrow population" in useful and "Question: How big is Tarrow?" in useful
    assert "whose answer is 40,000" in useful and "Write 3 short documents" in useful
    noisy = simulator_prompt("Tarrow population", 3, kind=NOISY, question="q?", answer="40,000")
    assert "40,000" not in noisy and "Question:" not in noisy and "must not contain" in noisy
    with pytest.raises(ValueError, match="kind"):
        simulator_prompt("q", 3, kind="helpful")


def test_documents_parse_in_order_capped_at_k_and_round_trip_the_target():
    docs, ok = parse_documents(GOOD, 2)
    assert ok and docs == [("Tarrow", "Tarrow is a city of 40,000 people."),
                           ("Kelbaan", "Kelbaan Records was founded in 1986.")]
    hits = [Hit("a", "T one", "first  text", 1.0), Hit("b", "T two", "second", 0.5)]
    assert parse_documents(simulator_target(hits), 5) == ([("T one", "first text"),
                                                          ("T two", "second")], True)


@pytest.mark.parametrize("text, docs, ok", [
    ("", [], False),
    ("I am a search engine and here are results.", [], False),
    ("Doc 1: no title here\nDoc 2 (Title: B) b text", [("", "no title here"), ("B", "b text")],
     True),
    ("Sure!\nDoc 1 (Title: A) a text", [("A", "a text")], False),    # a stray line: malformed
    ("Doc 1 (Title: A) same\nDoc 2 (Title: A) same", [("A", "same")], True),   # repeat dropped
    ("Doc 1 (Title: A)", [], False),                                  # a title, no text
    ("Doc 1 (Title: Foo (band)) Foo is a band.", [("Foo (band)", "Foo is a band.")], True),
    # the number is whole: no digit given back to become a document's text
    ("Doc 10 (Title: Foo bar", [], False),             # a line cut at max_new_tokens
    ("Doc 12", [], False),
    ("Doc 10 (Title: X) x text", [("X", "x text")], True),
])
def test_malformed_simulator_output(text, docs, ok):
    assert parse_documents(text, 3) == (docs, ok)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text("abc ()-", min_size=1, max_size=12).filter(
    lambda t: t.strip() and t.count("(") == t.count(")") <= 1 and "()" not in t
    and t == " ".join(t.split()) and (t.find("(") < t.find(")") or "(" not in t)),
    st.text("xyz .", min_size=1, max_size=20).filter(lambda t: t.strip()[:1].isalpha())),
    max_size=4))
def test_titles_round_trip_through_the_target(pairs):
    """What the simulator is trained to write parses back to its titles and texts, brackets
    in a title included (a Wikipedia title like "Foo (band)" was cut at its first ")")."""
    hits = [Hit(str(i), t, x, 1.0) for i, (t, x) in enumerate(pairs)]
    want, seen = [], set()
    for h in hits:
        key = f"{h.title.lower()}\n{' '.join(h.text.split()).lower()}"
        if key not in seen:
            seen.add(key)
            want.append((h.title, " ".join(h.text.split())))
    assert parse_documents(simulator_target(hits), 5)[0] == want[:5]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.integers(1, 5))
def test_parsing_any_text_never_raises(text, k):
    docs, ok = parse_documents(text, k)
    assert len(docs) <= k and all(body and body == " ".join(body.split()) for _, body in docs)
    assert not ok or docs


# ---- the curriculum
def test_noise_rises_from_start_to_end_along_the_exponential_curve():
    xs = [noise_probability(s, 100, 0.0, 0.5) for s in range(0, 121, 10)]
    assert xs[0] == 0.0 and xs[10] == pytest.approx(0.5) and xs[-1] == pytest.approx(0.5)
    assert all(a <= b for a, b in zip(xs, xs[1:]))
    # base 4: half-way through is (4^0.5 - 1) / 3 = 1/3 of the way
    assert noise_probability(50, 100, 0.0, 0.6) == pytest.approx(0.2)
    assert noise_probability(50, 100, 0.2, 0.6, base=1.0) == pytest.approx(0.4)   # linear
    assert noise_probability(30, 100, 0.5, 0.5) == 0.5
    with pytest.raises(ValueError):
        noise_probability(1, 0, 0, 0.5)
    with pytest.raises(ValueError):
        noise_probability(1, 10, 0, 1.5)


# ---- the retriever
def test_the_simulator_turns_its_text_into_hits_and_counts_what_went_wrong():
    sim = Scripted([GOOD, "nothing useful", "Doc 1 (Title: X) x\nstray"], noise=0.0)
    out = sim.search(["a", "b", "c"], 2)
    assert [[h.title for h in hits] for hits in out] == [["Tarrow", "Kelbaan"], [], ["X"]]
    assert all(h.doc_id.startswith("sim-") for hits in out for h in hits)
    assert [h.score for h in out[0]] == [2.0, 1.0]
    assert dict(sim.stats) == {"queries": 3, USEFUL: 3, "malformed": 2, "empty": 1, "short": 2,
                               "cut": 0}   # a scripted reply does not say it was cut
    assert all("Question:" not in p for p in sim.prompts)   # search() knows queries alone


def test_the_noise_is_drawn_query_by_query_within_one_call():
    sim = Scripted([GOOD], noise=0.5)
    sim.search(["q"] * 200, 2)
    kinds = ["must not contain" in p for p in sim.prompts]
    assert 60 < sim.stats[NOISY] < 140 and sum(kinds) == sim.stats[NOISY]
    assert sim.stats[USEFUL] + sim.stats[NOISY] == 200


def test_noise_draws_per_query_and_context_reaches_the_useful_prompt():
    sim = Scripted([GOOD], noise=1.0)
    sim.search_with_context(["q1", "q2"], 2, ["Where?", "Who?"], ["Tarrow", None])
    assert sim.stats[NOISY] == 2 and all("must not contain" in p for p in sim.prompts)
    sim.set_noise(0.0)
    sim.search_with_context(["q1"], 2, ["Where?"], ["Tarrow"])
    assert "whose answer is Tarrow" in sim.prompts[-1] and "Question: Where?" in sim.prompts[-1]
    with pytest.raises(ValueError):
        sim.set_noise(2.0)
    with pytest.raises(ValueError, match="2 queries"):
        sim.search_with_context(["a", "b"], 1, ["q"], ["x"])


def test_the_tiny_model_as_simulator_generates_and_never_breaks(tiny):
    model, tok = tiny
    sim = SimulatedRetriever(model, tok, max_new_tokens=12, temperature=1.0, batch_size=2)
    out = sim.search(["a query", "another", "third"], 2)
    assert len(out) == 3 and sim.stats["queries"] == 3   # random weights: mostly malformed
    greedy = SimulatedRetriever(model, tok, max_new_tokens=8, temperature=0.0)
    assert greedy.generate(["same prompt"]) == greedy.generate(["same prompt"])
    # what a server may cache: only a greedy engine without noise answers alike twice
    assert sim.sampled and not greedy.sampled
    assert SimulatedRetriever(model, tok, temperature=0.0, noise=0.5).sampled


def test_both_engines_decode_the_same_greedy_documents(tiny):
    """seekrl's decoding loop (`text_decoder`, what the trainer and `seekrl serve` hand in)
    and model.generate (no decoder) agree token for token when greedy, one prompt and a
    batch (rows that stop early leave seekrl's batch; generate keeps them padded), and both
    leave the caller's random stream where it was."""
    import torch

    from seekrl.agent.backends import TextDecoder, text_decoder

    model, tok = tiny
    prompts = ["a query", "another, longer query about Tarrow", "third"]
    decoder = text_decoder(model, tok)
    assert isinstance(decoder, TextDecoder)
    seekrl = SimulatedRetriever(model, tok, max_new_tokens=10, temperature=0.0, decoder=decoder)
    hf = SimulatedRetriever(model, tok, max_new_tokens=10, temperature=0.0)
    assert seekrl.engine == "seekrl" and hf.engine == "generate"
    for batch in ([prompts[0]], prompts):
        assert seekrl.generate(batch) == hf.generate(batch)
        # both say which replies ran out of tokens before their end, alike (the tiny
        # random model writes 10 tokens and no end)
        assert seekrl.last_cut == hf.last_cut == [True] * len(batch)
    # both count the tokens they decoded alike (each reply's up to its end token; none of
    # generate's padding after it), at most 10 a reply
    assert 0 < seekrl.stats["tokens"] == hf.stats["tokens"] <= 10 * 4
    seekrl.search(prompts, 2)
    assert seekrl.stats["cut"] == 3
    end = next(iter(decoder.backend.stop_ids))
    real = decoder.backend.generate
    decoder.backend.generate = lambda contexts, n, sampling: [[5, end], [5] * n, [5] * 3]
    seekrl.generate(prompts)   # an ended reply, a cut one, one that stopped without its end
    assert seekrl.last_cut == [False, True, True]
    decoder.backend.generate = real
    mute = SimulatedRetriever(model, tok, max_new_tokens=10, temperature=0.0,
                              decoder=lambda texts, n, t: decoder(texts, n, t))
    replies = mute.generate(prompts)   # a decoder that does not count: its replies, re-read
    assert mute.stats["tokens"] == sum(len(tok(r, add_special_tokens=False)["input_ids"])
                                       for r in replies) > 0
    short = SimulatedRetriever(model, tok, max_new_tokens=10, temperature=0.0,
                               decoder=lambda texts, n, t: decoder(texts[:1], n, t))
    with pytest.raises(RetrievalError, match="returned 1 replies for 3 prompts"):
        short.search(prompts, 2)     # not the first query's documents alone, the rest lost
    state = torch.random.get_rng_state()

    def sampled(seed):
        return SimulatedRetriever(model, tok, max_new_tokens=6, temperature=1.0, seed=seed,
                                  decoder=decoder)

    first = sampled(3).generate(prompts)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert sampled(3).generate(prompts) == first   # seeded per call: reproducible
    assert sampled(4).generate(prompts) != first   # ... by its seed


def test_a_simulator_whose_generation_config_sets_a_penalty_decodes_with_generate(tiny):
    import copy

    from seekrl.agent.backends import text_decoder

    model, tok = tiny
    model = copy.deepcopy(model)
    model.generation_config.repetition_penalty = 1.3
    with pytest.warns(UserWarning, match="repetition_penalty"):
        assert text_decoder(model, tok) is None
    sim = SimulatedRetriever(model, tok, max_new_tokens=4, temperature=0.0,
                             decoder=text_decoder(model, tok))
    assert sim.engine == "generate" and len(sim.generate(["a query"])) == 1


def test_generate_ends_a_reply_at_the_templates_end_of_turn_not_eos_alone(tiny):
    """A simulator whose EOS is not its chat template's end-of-turn token (a base model's
    tokenizer) stops at the turn's end instead of writing to max_new_tokens."""
    import copy

    model, tok = tiny
    tok = copy.deepcopy(tok)
    tok.eos_token = tok.pad_token = "<|endoftext|>"
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    model = copy.deepcopy(model)
    seen = {}

    def generate(**kw):
        seen.update(kw)
        return kw["input_ids"]

    model.generate = generate
    assert SimulatedRetriever(model, tok, max_new_tokens=4, temperature=0.0
                              ).generate(["a query"]) == [""]
    assert {tok.eos_token_id, im_end} <= set(seen["eos_token_id"])


def test_simulator_quality_against_the_real_index():
    sim = [[Hit("s1", "Tarrow", "a city of 40,000", 1.0)], []]
    real = [[Hit("d1", "Tarrow", "Tarrow has 40,000 people", 1.0)],
            [Hit("d2", "Other", "nothing", 1.0)]]
    q = simulator_quality(sim, real, [["Tarrow"], ["Kelbaan"]], [["40,000"], ["1986"]])
    assert q == {"queries": 2, "sim_gold_title_hit": 0.5, "sim_answer_contained": 0.5,
                 "real_gold_title_hit": 0.5, "real_answer_contained": 0.5, "sim_empty": 0.5}


# ---- in the engine
class Script(Backend):
    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, turns, []

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        turn = self.turns[min(len(self.calls), len(self.turns) - 1)]
        self.calls.append((len(contexts), max_new_tokens, sampling.stop))
        return [self.tok.encode(turn, add_special_tokens=False) for _ in contexts]


def test_the_engine_gives_a_simulator_the_question_and_answer_and_masks_its_documents(tiny):
    _, tok = tiny
    sim = Scripted([GOOD])
    backend = Script(tok, ["<search> Tarrow size </search>", "<answer> 40,000 </answer>"])
    engine = RolloutEngine(backend, tok, sim, RolloutConfig(max_turns=3, topk=2))
    (t,) = engine.run([QAExample("a", "How big is Tarrow?", ["40,000"])])
    assert "whose answer is 40,000" in sim.prompts[0] and "Question: How big is Tarrow?" \
        in sim.prompts[0]
    s = t.steps[0]
    block = tok.decode(t.token_ids[s.info_start:s.info_end])
    assert "Doc 1 (Title: Tarrow) Tarrow is a city" in block and "Extra" not in block
    assert set(t.loss_mask[s.info_start:s.info_end]) == {0}
    assert s.hit_titles == ["Tarrow", "Kelbaan"] and t.answer == "40,000"


def test_rag_gives_a_simulator_the_question_and_answer_as_the_agent_does(tiny):
    """rag's one retrieval went through `search` (queries alone): a simulator then wrote
    its useful documents without the answer the agent's searches give it."""
    _, tok = tiny
    sim = Scripted([GOOD])
    backend = Script(tok, ["<answer> 40,000 </answer>"])
    engine = RolloutEngine(backend, tok, sim, RolloutConfig(method="rag", topk=2))
    (t,) = engine.run([QAExample("a", "How big is Tarrow?", ["40,000"])])
    assert len(sim.prompts) == 1 and "whose answer is 40,000" in sim.prompts[0]
    assert "Question: How big is Tarrow?" in sim.prompts[0] and t.answer == "40,000"


def test_self_search_the_policy_writes_the_block_and_none_of_it_is_trained(tiny):
    _, tok = tiny
    backend = Script(tok, ["<think> look </think>\n<search> Tarrow size </search>",
                           "Doc 1 (Title: Tarrow) Tarrow has 40,000 people.</information> junk",
                           "<answer> 40,000 </answer>"])
    engine = RolloutEngine(backend, tok, None, RolloutConfig(max_turns=3, topk=2,
                                                             self_search=True,
                                                             max_info_tokens=64))
    (t,) = engine.run([QAExample("a", "How big is Tarrow?", ["40,000"],
                                 {"gold_doc_ids": ["d-t"]})])
    t.check()
    # the second call wrote the block: stopped at its closing tag, within the block's budget
    assert backend.calls[1][2] == ("</information>",) and backend.calls[1][1] < 64
    s = t.steps[0]
    assert s.action == "search" and s.query == "Tarrow size" and t.n_searches == 1
    block = tok.decode(t.token_ids[s.info_start:s.info_end])
    assert block == "\n\n<information>Doc 1 (Title: Tarrow) Tarrow has 40,000 people." \
                    "</information>\n\n"
    assert set(t.loss_mask[s.info_start:s.info_end]) == {0}   # own documents: not trained
    assert s.hit_titles == ["Tarrow"] and s.hits[0].startswith("sim-") and s.gold_hit is False
    assert t.evidence_recall() == 0.0 and t.answer == "40,000"
    # the policy's own turns are trained, and only they carry rollout log-probs
    assert sum(t.loss_mask) == sum(st.end - st.start for st in t.steps)
    # but it decoded the block too: a rollout-token budget counts it (it did not, and a
    # self-search run got ~60% more steps than a real-search one at the "same" budget)
    written = len(tok.encode(backend.turns[1], add_special_tokens=False))
    assert s.info_generated == written and t.n_decoded == t.n_generated + written
    (cont,) = engine.continue_from([(t, 1)], 1)[0]   # a continuation's prefix includes it
    assert cont.prefix_tokens == sum(t.loss_mask[:s.info_end]) + written


class WithLogprobs(Script):
    """A backend that keeps to `max_new_tokens` and reports log-probs, as a real one does."""

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        from seekrl.agent.backends import Generated

        outs = super().generate(contexts, max_new_tokens, sampling, keys)
        return [Generated(o[:max_new_tokens], [-0.5] * len(o[:max_new_tokens])) for o in outs]


def test_a_self_written_block_is_cut_at_its_budget_closed_by_the_engine_and_untrained(tiny):
    """The policy never closes its block: it is cut at `max_info_tokens` (the tags
    included), the environment closes it, none of it is trained, and the rollout
    log-probs are those of the policy's own turns alone."""
    _, tok = tiny
    backend = WithLogprobs(tok, ["<search> Tarrow size </search>",
                                 "Doc 1 (Title: A) " + "word " * 300, "<answer> x </answer>"])
    engine = RolloutEngine(backend, tok, None, RolloutConfig(max_turns=3, self_search=True,
                                                             max_info_tokens=64))
    (t,) = engine.run([QAExample("a", "How big is Tarrow?", ["x"])])
    t.check()
    s = t.steps[0]
    assert t.rollout_logprobs is not None and len(t.rollout_logprobs) == sum(t.loss_mask)
    assert s.info_end - s.info_start <= 64 and set(t.loss_mask[s.info_start:s.info_end]) == {0}
    block = tok.decode(t.token_ids[s.info_start:s.info_end])
    assert block.startswith("\n\n<information>Doc 1 (Title: A) word") \
        and block.endswith("word</information>\n\n")
    assert s.info_generated == backend.calls[1][1] < 64 and t.answer == "x"


def test_self_search_needs_no_retriever_but_a_real_search_does(tiny):
    _, tok = tiny
    with pytest.raises(ValueError, match="needs a retriever"):
        RolloutEngine(Script(tok, ["x"]), tok, None, RolloutConfig())


# ---- the trainer: rollouts simulated, evaluation on the real index
def _sim_lab(tmp_path, tiny):
    """A small world and its index, and the tiny model saved as a simulator in `sim/`."""
    from conftest import build_world_and_index

    model, tok = tiny
    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=8, n_dev=4, n_test=4)
    model.save_pretrained(tmp_path / "sim")
    tok.save_pretrained(tmp_path / "sim")
    return paths, index_dir


def test_a_training_step_with_a_simulator_follows_the_curriculum(tmp_path, tiny):

    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    paths, index_dir = _sim_lab(tmp_path, tiny)
    cfg = TrainConfig(data=str(paths["train"]), index=str(index_dir), out=str(tmp_path / "run"),
                      steps=2, questions_per_step=2, group_size=2, save_every=0,
                      rollout={"max_turns": 2, "max_new_tokens": 8},
                      simulator={"model": str(tmp_path / "sim"), "noise_start": 0.0,
                                 "noise_end": 1.0, "max_new_tokens": 8, "batch_size": 4},
                      eval={"data": str(paths["dev"]), "n": 2, "at_start": False,
                            "max_turns": 2, "max_new_tokens": 8})
    trainer = Trainer(cfg, model=model, tokenizer=tok)
    trainer.train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    noise = [r["simulator_noise"] for r in records if "simulator_noise" in r]
    assert noise == [0.0, 1.0]   # the first step at noise_start, the last at noise_end
    assert trainer.env.simulator is not trainer.retriever   # evaluation kept the real index
    assert type(trainer.env.simulator.decoder).__name__ == "TextDecoder"
    assert any("dev_em" in r for r in records)
    with pytest.raises(ValueError, match="simulator.engine"):
        TrainConfig(data="x", simulator={"engine": "vllm"})


def test_the_curriculum_follows_a_token_budget_that_ends_the_run_before_its_steps():
    """A run compared at equal compute stops at its token budget, long before its nominal
    steps: its progress (what the noise curriculum follows) is the budget's share spent."""
    from seekrl.recipes.train_state import RunState

    def progress(step, steps, tokens, budget):
        return RunState(step_done=step, rollout_tokens=tokens).progress(steps, budget)

    assert progress(5, 100, 23_000, 46_000) == pytest.approx(0.5)   # the budget leads
    assert progress(5, 11, 1_000, 46_000) == pytest.approx(0.5)     # the steps lead
    assert progress(5, 11, 0, None) == pytest.approx(0.5)
    assert progress(9, 10, 0, None) == 1.0                          # the last step: the end
    assert progress(0, 1, 0, None) == 0.0                           # one step: the start
    assert progress(11, 100, 47_000, 46_000) == 1.0                # capped
    assert noise_probability(progress(10, 100, 41_000, 46_000), 1.0, 0.0, 0.5) > 0.4


class SearchOnce(Backend):
    """A policy that searches on its first turn and answers on the next."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, contexts, max_new_tokens, sampling, keys=None):
        turns = ["<answer> x </answer>" if "</information>" in self.tok.decode(c)
                 .rsplit("assistant", 1)[-1] else "<search> x </search>"
                 for c in contexts]
        return [self.tok.encode(t, add_special_tokens=False) for t in turns]


def test_a_self_search_step_charges_its_budget_for_the_blocks_the_policy_wrote(tmp_path, tiny):
    """The trainer's rollout tokens are every token the policy decoded: its turns and the
    information blocks it wrote under self-search (not trained, but generated)."""
    from conftest import build_world_and_index

    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    _, paths, _ = build_world_and_index(tmp_path / "w", seed=4, entities=200, n_train=8,
                                        n_dev=4, n_test=4)
    cfg = TrainConfig(data=str(paths["train"]), out=str(tmp_path / "run"), steps=1,
                      questions_per_step=2, group_size=2, save_every=0,
                      rollout={"max_turns": 2, "max_new_tokens": 16, "self_search": True,
                               "max_info_tokens": 32})
    trainer = Trainer(cfg, model=model, tokenizer=tok)
    script = SearchOnce(tok)
    trainer._generation_backend = lambda: script
    played = []
    real_rollout = trainer.rollout
    trainer.rollout = lambda *a, **k: played.extend(out := real_rollout(*a, **k)) or out
    record = trainer.step(1)
    written = sum(s.info_generated for t in played for s in t.steps)
    assert written > 0 and record["searches"] == 1.0
    assert record["rollout_tokens"] == sum(t.n_decoded for t in played) \
        == sum(t.n_generated for t in played) + written
    assert record["self_info_length"] == pytest.approx(written / len(played), abs=0.05)


def test_a_resumed_simulator_run_draws_what_the_uninterrupted_one_did(tmp_path, tiny):
    """The simulator's useful/noisy draws and generation seeds come from each step's seed,
    and its totals are kept with the checkpoint: a run resumed after step 1 logs step 2 as
    the straight run did (they restarted from step 1's stream, the totals from zero)."""

    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    paths, index_dir = _sim_lab(tmp_path, tiny)
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def cfg(out):
        return TrainConfig(data=str(paths["train"]), index=str(index_dir), out=str(out),
                           steps=2, questions_per_step=2, group_size=2, save_every=1,
                           rollout={"max_turns": 2, "max_new_tokens": 16},
                           simulator={"model": str(tmp_path / "sim"), "noise_start": 0.5,
                                      "noise_end": 0.5, "max_new_tokens": 8,
                                      "batch_size": 4})

    def sim_records(out):
        return [{k: v for k, v in json.loads(x).items() if k.startswith("simulator_")
                 or k in ("reward", "searches", "rollout_tokens")}
                for x in (out / "metrics.jsonl").read_text().splitlines() if '"episodes"' in x]

    def trainer(out, **kw):   # the tiny policy's turns scripted: a search, then an answer
        model.load_state_dict(start)
        t = Trainer(cfg(out), model=model, tokenizer=tok, **kw)
        script = SearchOnce(tok)
        t._generation_backend = lambda: script
        return t

    trainer(tmp_path / "a").train()
    assert trainer(tmp_path / "b").train(until=1)["interrupted"]
    trainer(tmp_path / "b", resume=True).train()
    straight, resumed = sim_records(tmp_path / "a"), sim_records(tmp_path / "b")
    assert straight[1]["simulator_queries_total"] > straight[0]["simulator_queries_total"] > 0
    assert resumed == straight


def test_the_simulators_counts_are_summed_over_the_processes(tmp_path, tiny, monkeypatch):
    """Each process's simulator answers its own rollouts: the logged totals are their sum,
    and the checkpoint keeps that sum (resumed into rank 0; the other ranks count from 0)."""

    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    paths, index_dir = _sim_lab(tmp_path, tiny)
    cfg = TrainConfig(data=str(paths["train"]), index=str(index_dir), out=str(tmp_path / "run"),
                      steps=1, questions_per_step=2, group_size=2, save_every=1,
                      rollout={"max_turns": 2, "max_new_tokens": 16},
                      simulator={"model": str(tmp_path / "sim"), "max_new_tokens": 8})
    trainer = Trainer(cfg, model=model, tokenizer=tok)
    script = SearchOnce(tok)
    trainer._generation_backend = lambda: script
    # as if a second process had answered as many queries as this one
    monkeypatch.setattr(type(trainer.dist), "sum_values",
                        lambda self, v: {k: 2 * x for k, x in v.items()})
    record = trainer.step(1)
    own = trainer.env.simulator.stats["queries"]
    assert own > 0 and record["simulator_queries_total"] == 2 * own
    assert 0 < record["simulator_tokens_total"] == 2 * trainer.env.simulator.stats["tokens"]
    summary = trainer.train()
    meta = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/trainer.json"))
                      .read_text())
    assert meta["simulator_stats"]["queries"] == trainer.env.simulator_totals["queries"] >= 2 * own
    # the run's summary says what the simulator decoded (compute no budget counts)
    assert summary["simulator_tokens"] == meta["simulator_stats"]["tokens"] > 0


@pytest.mark.parametrize("mode", ["simulator", "self_search"])
def test_evaluation_searches_the_real_index_whatever_the_rollouts_search(tmp_path, tiny,
                                                                        monkeypatch, mode):
    from conftest import build_world_and_index

    import seekrl.recipes.train as train_mod
    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer
    from seekrl.retrieval.simulated import SimulatedRetriever

    model, tok = tiny
    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=4, n_dev=2, n_test=2)
    model.save_pretrained(tmp_path / "sim")
    tok.save_pretrained(tmp_path / "sim")
    extra = {"simulator": {"model": str(tmp_path / "sim")}} if mode == "simulator" \
        else {"rollout": {"self_search": True}}
    cfg = TrainConfig(data=str(paths["train"]), index=str(index_dir), out=str(tmp_path / "run"),
                      eval={"data": str(paths["dev"]), "n": 2}, **extra)
    trainer = Trainer(cfg, model=model, tokenizer=tok)
    seen = []

    def fake_eval(model, tok, retriever, *a, **k):
        seen.append(retriever)
        return {"average": {"em": 0.0, "f1": 0.0, "valid_format": 1.0, "searches": 1.0,
                            "questions": 2}}

    monkeypatch.setattr(train_mod, "eval_policy", fake_eval)
    trainer.evaluate(tmp_path / "ev")
    (used,) = seen
    assert used is trainer.retriever and not isinstance(used, SimulatedRetriever)

    hits = used.search([read_qa_jsonl(paths["dev"])[0].question], 2)[0]
    assert hits and not any(h.doc_id.startswith("sim-") for h in hits)   # the corpus's own
    if mode == "simulator":
        assert trainer.env.for_rollouts(0, trainer.run_progress()) is trainer.env.simulator is not used


def test_a_simulator_run_needs_no_index_for_its_rollouts(tmp_path, tiny):
    from conftest import build_world_and_index

    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    _, paths, _ = build_world_and_index(tmp_path / "w", seed=4, entities=200, n_train=4,
                                        n_dev=2, n_test=2)
    cfg = TrainConfig(data=str(paths["train"]), out=str(tmp_path / "run"), steps=1,
                      rollout={"self_search": True, "max_turns": 2, "max_new_tokens": 8})
    trainer = Trainer(cfg, model=model, tokenizer=tok)
    assert trainer.retriever is None
    trainer.step(1)


# ---- the simulator's SFT
def test_simulator_examples_label_useful_and_noisy_and_train_only_the_documents(tmp_path, tiny):
    from conftest import build_world_and_index

    from seekrl.config import SimulatorTrainConfig
    from seekrl.recipes.simulator import examples, interactions, label
    from seekrl.retrieval.index import load_index

    _, tok = tiny
    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=6, n_dev=2, n_test=2)
    cfg = SimulatorTrainConfig(index=str(index_dir), data=[str(paths["train"])])
    records = interactions(cfg)
    assert records and all(r["gold_ids"] and r["answers"] for r in records)
    rows, counts = examples(records, load_index(index_dir), tok, 2, 30)
    assert counts[USEFUL] + counts[NOISY] == len(rows) and counts[USEFUL] > 0
    for row in rows:
        target = tok.decode([i for i, m in zip(row["token_ids"], row["loss_mask"]) if m])
        prompt = tok.decode([i for i, m in zip(row["token_ids"], row["loss_mask"]) if not m])
        assert target.startswith("Doc 1 (Title: ") and f"Query: {row['query']}" in prompt
        assert ("must not contain" in prompt) == (row["kind"] == NOISY)
    r = {"gold_ids": ["g"], "gold_titles": [], "answers": ["1986"]}
    assert label(r, [Hit("g", "T", "x", 1.0)]) == USEFUL
    assert label(r, [Hit("o", "T", "founded in 1986", 1.0)]) == USEFUL
    assert label(r, [Hit("o", "T", "nothing", 1.0)]) == NOISY
    # an answer counts as a whole word: "no" is not in "not", nor "1" in "1990"
    for answer, text, kind in [("no", "it is not known", NOISY), ("1", "in 1990", NOISY),
                               ("no", "no, it is not", USEFUL), ("ten", "tennis", NOISY),
                               ("1986", "(1986)", USEFUL)]:
        assert label({"gold_ids": [], "gold_titles": [], "answers": [answer]},
                     [Hit("o", "T", text, 1.0)]) == kind, (answer, text)
    with pytest.raises(ValueError, match="no source of search queries"):
        SimulatorTrainConfig(index=str(index_dir))
    plain = tmp_path / "plain.jsonl"   # questions without the world's hop queries
    plain.write_text(json.dumps({"id": "q", "question": "q?", "golden_answers": ["a"]}) + "\n")
    with pytest.raises(ValueError, match="no search queries found"):
        interactions(SimulatorTrainConfig(index=str(index_dir), data=[str(plain)]))
    # a hop without a query is no search to simulate (a KeyError before); one supporting
    # title given as text is that title, not its letters
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"id": "o", "question": "o?", "golden_answers": ["a"],
                               "metadata": {"supporting_titles": "Tarrow Hall",
                                            "chain": [{"doc_id": "d1"},
                                                      {"query": "Tarrow", "doc_id": "d2"}]}})
                   + "\n")
    got = interactions(SimulatorTrainConfig(index=str(index_dir), data=[str(odd)]))
    assert [(r["query"], r["gold_titles"]) for r in got] == [("Tarrow", ["Tarrow Hall"])]
    # the world's folder: its train split (the first file a folder gave was test's, whose
    # gold answers would be in the simulator's prompts)
    folder = SimulatorTrainConfig(index=str(index_dir), data=[str(paths["train"].parent)])
    train_questions = {q.question for q in read_qa_jsonl(paths["train"])}
    assert {r["question"] for r in interactions(folder)} <= train_questions


def test_a_bad_question_or_episode_in_the_simulator_data_names_its_file(tmp_path, tiny):
    """A bad hop chain named the question alone (with several files, which one?), and an
    episode's `supporting_titles: 5` was a TypeError from deep in the reader."""
    from conftest import build_world_and_index

    from seekrl.agent.trajectory import Step, Trajectory, write_trajectories
    from seekrl.config import SimulatorTrainConfig
    from seekrl.errors import DataError
    from seekrl.recipes.simulator import interactions

    _, paths, index_dir = build_world_and_index(tmp_path / "w", seed=4, entities=200,
                                                n_train=2, n_dev=2, n_test=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "b", "question": "b?", "golden_answers": ["a"],
                               "metadata": {"chain": [{"query": 5, "doc_id": "d"}]}}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl: question b: metadata\.chain\[0\]\.query"):
        interactions(SimulatorTrainConfig(index=str(index_dir),
                                          data=[str(paths["train"]), str(bad)]))
    logged = tmp_path / "logged.jsonl"
    write_trajectories(logged, [Trajectory(
        example_id="e", group_id="g", question="e?", golden_answers=["a"], token_ids=[0] * 4,
        loss_mask=[0, 0, 1, 1], prompt_len=2,
        steps=[Step(start=2, end=4, action="search", query="x")])])
    episode = json.loads(logged.read_text())
    episode["metadata"] = {"supporting_titles": 5}
    logged.write_text(json.dumps(episode) + "\n")
    with pytest.raises(DataError, match=r"logged\.jsonl:1: field 'metadata\.supporting_titles'"):
        interactions(SimulatorTrainConfig(index=str(index_dir), trajectories=[str(logged)]))
    episode["metadata"]["supporting_titles"] = ["Tarrow"]   # a list of titles reads
    logged.write_text(json.dumps(episode) + "\n")
    got = interactions(SimulatorTrainConfig(index=str(index_dir), trajectories=[str(logged)]))
    assert [(r["query"], r["gold_titles"]) for r in got] == [("x", ["Tarrow"])]


def test_seekrl_simulator_train_runs_from_the_cli(tmp_path):
    from conftest import build_lab
    from typer.testing import CliRunner

    from seekrl.cli import app

    _, paths, index_dir, model_dir = build_lab(tmp_path)
    result = CliRunner().invoke(app, ["simulator", "train", f"model={model_dir}",
                                      f"index={index_dir}", f"data=[{paths['train']}]",
                                      f"out={tmp_path / 'sim'}", "steps=2", "limit=12"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["examples"] == 12 and (tmp_path / "sim" / "sft" / "final").is_dir()
    final = tmp_path / "sim" / "sft" / "final"
    # the prompt it learned is kept with it, and a prompt that differs is told
    assert json.loads((final / "simulator.json").read_text()) == {"topk": 3, "words": 30}
    from seekrl.retrieval.simulated import prompt_mismatch

    assert prompt_mismatch(str(final), topk=3, words=30) is None
    assert prompt_mismatch(str(final), topk=None, words=30) is None   # topk per request
    why = prompt_mismatch(str(final), topk=5, words=20)
    assert "topk 5 (trained with 3), words 20 (trained with 30)" in why
    assert prompt_mismatch(str(tmp_path), topk=5, words=20) is None   # not a trained one


# ---- served
def test_a_simulated_engine_answers_the_search_r1_schema():
    client = TestClient(create_app(Scripted([GOOD]), manifest={"type": "simulated"}))
    r = client.post("/retrieve", json={"queries": ["Tarrow"], "topk": 2, "return_scores": True})
    assert r.status_code == 200
    (hits,) = r.json()["result"]
    assert [h["document"]["contents"].split("\n")[0] for h in hits] == ["Tarrow", "Kelbaan"]
    # what the engine wrote, on /health: a topk beyond its documents shows as short
    client.post("/retrieve", json={"queries": ["Tarrow"], "topk": 9})
    counts = client.get("/health").json()["simulator"]
    assert counts["queries"] == 2 and counts["short"] == 1 and counts["malformed"] == 0


def test_serve_takes_an_index_or_a_simulator_not_both_nor_neither(tmp_path):
    from typer.testing import CliRunner

    from seekrl.cli import app

    for args in ([], ["--index", str(tmp_path), "--simulate", "smollm2-135m"]):
        result = CliRunner().invoke(app, ["serve", *args])
        assert result.exit_code != 0 and "one of the two" in result.output
    # the index's own settings, with a simulator: they had been ignored unsaid
    for args, said in ((["--no-index-process"], "--no-index-process: settings of an index"),
                       (["--faiss-gpu", "--no-index-process"],
                        "--faiss-gpu, --no-index-process: settings of an index (--index)")):
        result = CliRunner().invoke(app, ["serve", "--simulate", "smollm2-135m", "--host",
                                          "256.0.0.1", *args])
        assert result.exit_code != 0 and said in " ".join(result.output.split())
    from seekrl.retrieval.base import RetrievalError as Refused
    from seekrl.retrieval.server import run_server

    with pytest.raises(Refused, match="--faiss-gpu: searches an index on the GPU"):
        run_server(None, host="256.0.0.1", simulate="smollm2-135m", faiss_gpu=True)
    # from Python too: either choice of where an index lives had been taken for the default
    for choice in (False, True):
        with pytest.raises(Refused, match=f"index_process={choice}: where an index lives"):
            run_server(None, host="256.0.0.1", simulate="smollm2-135m", index_process=choice)


@pytest.mark.parametrize("args, said", [
    (["--noise", "0.3"], "--noise: settings of a simulated engine"),
    (["--words", "40", "--sim-temperature", "0"], "--words, --sim-temperature: settings of"),
    (["--max-batch-size", "0"], "--max-batch-size: Input should be greater than or equal to 1"),
    (["--default-topk", "200"], "--default-topk 200 is above --max-topk 100"),
    (["--max-wait-ms", "1e9"], "--max-wait-ms: Input should be less than or equal to 1000"),
])
def test_serve_names_the_flag_of_a_bad_setting_before_loading_anything(tmp_path, args, said):
    from typer.testing import CliRunner

    from seekrl.cli import app

    result = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "none"), *args])
    assert result.exit_code != 0 and said in " ".join(result.output.split())


def test_serve_refuses_a_simulator_setting_out_of_range():
    from typer.testing import CliRunner

    from seekrl.cli import app

    # an unbindable host: were the checks gone, this fails instead of serving forever
    for args, said in ((["--words", "2"], r"--words: .*greater than or equal to 5 \(got 2\)"),
                       (["--sim-max-new-tokens", "4"], r"--sim-max-new-tokens: .*equal to 8"),
                       (["--sim-temperature", "-1"], r"--sim-temperature: .*equal to 0"),
                       (["--sim-temperature", "inf"], r"--sim-temperature: .*finite")):
        result = CliRunner().invoke(app, ["serve", "--simulate", "smollm2-135m", "--host",
                                          "256.0.0.1", *args])
        assert result.exit_code != 0 and re.search(said, " ".join(result.output.split()))


@pytest.mark.parametrize("settings, said", [
    ({"simulator": {}, "rollout": {"self_search": True}},
     "simulator: rollout.self_search has the policy write its own documents"),
    ({"rollout": {"self_search": True, "method": "rag"}},
     "rollout.self_search: the policy writes .* rollout.method is 'rag'"),
    ({"simulator": {}, "rollout": {"method": "direct"}}, "simulator: rollout.method direct"),
    ({"reward": {"process": {"decomposition": 1.0}}},
     "reward.process.decomposition: .* rollout.max_queries is 1"),
    ({"rollout": {"max_queries": 3, "self_search": True}},
     "rollout.self_search: the policy writes one information block a search"),
    ({"rollout": {"tools": ["open"], "self_search": True}},
     r"rollout.self_search: rollout.tools \['open'\] act on retrieved documents"),
])
def test_settings_nothing_would_read_are_refused(settings, said):
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train import check_config

    with pytest.raises(ConfigError, match=said):
        check_config(TrainConfig(data="d", **settings))
    check_config(TrainConfig(data="d", reward={"process": {"decomposition": 1.0}},
                             rollout={"max_queries": 3}))
    check_config(TrainConfig(data="d", simulator={}, rollout={"method": "rag"}))   # it searches


def test_a_trained_simulator_given_another_prompt_is_warned_about(tmp_path, tiny):
    from seekrl.config import TrainConfig
    from seekrl.recipes.train import Trainer

    model, tok = tiny
    sim = tmp_path / "sim"
    model.save_pretrained(sim)
    tok.save_pretrained(sim)
    (sim / "simulator.json").write_text(json.dumps({"topk": 3, "words": 40}))
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q0", "question": "q?", "golden_answers": ["a"]}) + "\n")
    cfg = TrainConfig(data=str(data), out=str(tmp_path / "run"), simulator={"model": str(sim)})
    with pytest.warns(UserWarning, match=r"words 30 \(trained with 40\)"):
        trainer = Trainer(cfg, model=model, tokenizer=tok)
    assert trainer.env.simulator.words == 30


def test_a_bad_simulator_model_is_refused_before_the_policy_loads(tmp_path, monkeypatch):
    from seekrl.config import ConfigError, TrainConfig
    from seekrl.recipes.train import Trainer

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q0", "question": "q?", "golden_answers": ["a"]}) + "\n")
    cfg = TrainConfig(data=str(data), out=str(tmp_path / "run"),
                      simulator={"model": str(tmp_path / "no-such-simulator")})
    monkeypatch.setattr(Trainer, "_build_policy", lambda *a: pytest.fail("policy loaded"))
    with pytest.raises(ConfigError, match="simulator.model: .*no-such-simulator does not exist"):
        Trainer(cfg)


def test_the_served_simulators_defaults_are_the_train_configs():
    from seekrl.config import SimulatorSettings
    from seekrl.retrieval import simulated

    sim = SimulatorSettings()
    assert (sim.words, sim.max_new_tokens, sim.temperature) == (
        simulated.DEFAULT_WORDS, simulated.DEFAULT_MAX_NEW_TOKENS, simulated.DEFAULT_TEMPERATURE)


def test_a_stopped_simulator_training_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """Ctrl-C after step 1 of 3 (a checkpoint every step), then --resume: the simulator a
    straight run trains; a run there is refused without --resume or --overwrite before its
    examples file is written over."""
    from conftest import build_lab

    import seekrl.recipes.sft as sft_module
    from seekrl.config import ConfigError, SimulatorTrainConfig
    from seekrl.recipes.setup import Interrupted
    from seekrl.recipes.simulator import train_simulator
    from tests.test_sft import _same_weights

    _, paths, index_dir, model_dir = build_lab(tmp_path)

    def cfg(out, **keys):
        return SimulatorTrainConfig(**{"model": str(model_dir), "index": str(index_dir),
                                       "data": [str(paths["train"])],
                                       "out": str(tmp_path / out), "steps": 3, "limit": 12,
                                       "batch_size": 2, "grad_accum": 1, "save_every": 1,
                                       **keys})

    straight = train_simulator(cfg("a"))
    real, calls = sft_module.sft_loss, []

    def stop_in_step_2(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sft_module, "sft_loss", stop_in_step_2)
    with pytest.raises(Interrupted):
        train_simulator(cfg("b"))
    monkeypatch.setattr(sft_module, "sft_loss", real)
    examples = tmp_path / "b" / "simulator_examples.jsonl"
    examples.write_text("kept\n")   # a refused run must not write over it
    with pytest.raises(ConfigError, match="already holds a run"):
        train_simulator(cfg("b", limit=6))
    assert examples.read_text() == "kept\n"
    with pytest.raises(ConfigError, match="not both"):
        train_simulator(cfg("b"), resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="--resume: the run in .* other settings: max_steps"):
        train_simulator(cfg("b", steps=5), resume=True)   # refused before the searches
    with pytest.raises(ConfigError, match="examples built now differ"):
        train_simulator(cfg("b", limit=6), resume=True)
    assert examples.read_text() == "kept\n"
    with pytest.raises(ConfigError, match="has no checkpoint"):
        train_simulator(cfg("c"), resume=True)
    examples.unlink()   # the stopped run's, rebuilt
    resumed = train_simulator(cfg("b"), resume=True)
    assert resumed["steps"] == 3 and resumed["examples"] == straight["examples"]
    _same_weights(straight["final"], resumed["final"])
