"""Continuous batching (`rollout.continuous`): rows that join and leave the decoding batch
one by one give the turn-by-turn engine's greedy episodes, an idle row's cache stays as it
is, sampled runs repeat for a seed."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from seekrl.agent.backends import Generated, HFBackend, Sampling
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.agent.static_backend import StaticBackend
from seekrl.models import tiny_policy
from tests.test_rollout import Docs as CountingDocs
from tests.test_rollout import Scripted
from tests.test_static_backend import Docs, ex

STOPS = ("y", "k")   # the varied models below hit these after 1 to 12 tokens


@pytest.fixture(scope="module")
def tiny():
    return tiny_policy(seed=0)


def varied(tok, arch: str):
    """A tiny random Llama or Qwen2 with weights of std 0.1 (not 0.02): its greedy tokens
    depend on the context, so turns end at different lengths."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config, model = {"llama": (LlamaConfig, LlamaForCausalLM),
                     "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    torch.manual_seed(0)
    return model(config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=4096, tie_word_embeddings=False,
                        initializer_range=0.1, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).eval()


def _episodes(trajs):
    return [(t.token_ids, t.loss_mask, t.finish_reason, t.answer,
             [(s.action, s.query, s.hits, s.gold_hit, s.info_end) for s in t.steps])
            for t in trajs]


@pytest.mark.parametrize("arch,sync_every", [("llama", 1), ("qwen2", 8)])
def test_continuous_greedy_episodes_are_the_turn_by_turn_ones(tiny, arch, sync_every):
    """More episodes than rows (waiting ones take freed rows), groups of 2 (equal prompts
    prefilled once), prompts and turns of very different lengths: the same episodes as
    the static backend turn by turn and as HFBackend; continuations too."""
    _, tok = tiny
    model = varied(tok, arch)
    cfg = RolloutConfig(max_turns=5, max_new_tokens=12, max_total_tokens=360, n_samples=2,
                        batch_size=3, seed=3, greedy=True)
    examples = [ex(f"q{i}", f"Question {'long ' * (30 * (i % 3))}number {i}?")
                for i in range(5)]

    def static():
        return StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens,
                             sync_every=sync_every, width_step=16)

    on = cfg.model_copy(update={"continuous": True})
    finished, still = [], []
    backend = static()
    real = backend.run

    def run():   # how many rows go on decoding when some are handed back
        out = real()
        still.append(len(backend._live))
        return out

    backend.run = run
    mine = RolloutEngine(backend, tok, Docs(), on).run(examples, on_finish=finished.append)
    turns = RolloutEngine(static(), tok, Docs(), cfg).run(examples)
    hf = RolloutEngine(HFBackend(model, tok, stop_strings=STOPS), tok, Docs(), cfg).run(examples)
    assert _episodes(mine) == _episodes(turns) == _episodes(hf)
    assert sorted(map(id, finished)) == sorted(map(id, mine))
    assert len({len(t.steps) for t in mine}) > 1 and len({len(t.token_ids) for t in mine}) > 2
    assert max(still) > 0   # rows rejoined while others decoded
    assert backend._session is None and not backend._row_of   # the session ended
    long = [t for t in hf if len(t.steps) > 1 and t.steps[0].info_end is not None][:2]
    prefixes = [(long[0], 1), (long[1], 1), (long[0], 0)]
    a = RolloutEngine(static(), tok, Docs(), on).continue_from(prefixes, 2)
    b = RolloutEngine(HFBackend(model, tok, stop_strings=STOPS), tok, Docs(), cfg
                      ).continue_from(prefixes, 2)
    assert [_episodes(g) for g in a] == [_episodes(g) for g in b]


class ScriptedRows(Scripted):
    """`Scripted` on rows: a turn of n tokens takes n decoding steps, so rows end apart and
    rejoin while others decode, as the static backend's do; holding more rows than the
    session's capacity fails."""

    def open(self, capacity, max_new_tokens, sampling):
        self.capacity, self.held, self.rows = capacity, set(), {}

    def admit(self, keys, contexts, budgets):
        self.held.update(keys)
        assert len(self.held) <= self.capacity
        for k, new in zip(keys, self.generate(contexts, max(budgets), None)):
            self.rows[k] = [Generated(new), len(new)]

    def run(self):
        if not self.rows:   # as the static backend: no row decodes, no turn ends
            return []
        n = min(left for _, left in self.rows.values())
        for row in self.rows.values():
            row[1] -= n
        return [(k, self.rows.pop(k)[0]) for k in [k for k, r in self.rows.items() if not r[1]]]

    def release(self, key):
        self.held.discard(key)


# searches, answers and invalid turns of different lengths
SCRIPTS = {
    "Where was Ilsa born?": ["<search> Ilsa Marrow born </search>", "<answer> Tarrow </answer>"],
    "What country?": ["I do not know at all, not even a little bit",
                      "<search> Velmaria </search>", "<answer> Velmaria </answer>"],
    "Loop?": ["<search> Noise </search>"] * 4,
    "Quick?": ["<answer> no </answer>"],
}
SCRIPTED_EXAMPLES = [ex(f"q{i}", q) for i, q in enumerate(SCRIPTS)]
SCRIPTED_CFG = RolloutConfig(max_turns=3, topk=2, n_samples=2, batch_size=3, continuous=True)


def test_the_continuous_loop_takes_turns_as_they_end(tiny):
    """Searches, answers and invalid turns of different lengths, more episodes than rows:
    the same trajectories as turn by turn; retrieval is batched over the turns that ended
    together."""
    _, tok = tiny
    scripts, examples, cfg = SCRIPTS, SCRIPTED_EXAMPLES, SCRIPTED_CFG
    docs = CountingDocs()
    mine = RolloutEngine(ScriptedRows(tok, scripts), tok, docs, cfg).run(examples)
    want = RolloutEngine(Scripted(tok, scripts), tok, CountingDocs(), cfg).run(examples)
    assert _episodes(mine) == _episodes(want)
    assert {t.finish_reason for t in mine} == {"answer", "max_turns"}
    assert sum(map(len, docs.calls)) == sum(s.info_end is not None for t in mine
                                            for s in t.steps if s.action == "search")


class SlowDocs(CountingDocs):
    """CountingDocs that answer after a random pause, noting the thread that asked."""

    def __init__(self, seed: int):
        super().__init__()
        self.rng, self.threads = random.Random(seed), []

    def search(self, queries, k):
        self.threads.append(threading.current_thread().name)
        time.sleep(self.rng.random() * 0.03)
        return super().search(queries, k)


class Simulated(CountingDocs):
    """A retriever that writes its documents from the question (as the simulated one
    does): its tool is not run beside the decoding."""

    def search_with_context(self, queries, k, questions, answers):
        self.threads = [*getattr(self, "threads", []), threading.current_thread().name]
        return self.search(queries, k)


def test_tool_calls_run_beside_the_decoding_and_rejoin_at_a_fixed_point(tiny):
    """The rows that ended at one `run` have their documents fetched on the tool thread
    while the next `run` decodes the others, and rejoin right after it: however long the
    retriever takes, the same rows are admitted at the same points (so sampled runs stay
    reproducible), and the episodes are the turn-by-turn ones. A tool that is not
    `concurrent` is called on the engine's own thread."""
    _, tok = tiny
    scripts, examples, cfg = SCRIPTS, SCRIPTED_EXAMPLES, SCRIPTED_CFG

    def play(docs):
        backend, admitted = ScriptedRows(tok, scripts), []
        real = backend.admit

        def admit(keys, contexts, budgets):   # which contexts join, in order
            admitted.append(sorted(tok.decode(c)[-40:] for c in contexts))
            real(keys, contexts, budgets)

        backend.admit = admit
        return RolloutEngine(backend, tok, docs, cfg).run(examples), admitted

    slow = [SlowDocs(seed) for seed in (1, 2)]
    (a, joins_a), (b, joins_b) = play(slow[0]), play(slow[1])
    assert joins_a == joins_b and len(joins_a) > 2
    want = RolloutEngine(Scripted(tok, scripts), tok, CountingDocs(), cfg).run(examples)
    assert _episodes(a) == _episodes(b) == _episodes(want)
    for docs in slow:
        assert docs.threads and all(n.startswith("seekrl-tools") for n in docs.threads)
    own = Simulated()
    c, _ = play(own)
    assert _episodes(c) == _episodes(want)
    assert own.threads and set(own.threads) == {threading.main_thread().name}


def test_only_rows_with_calls_wait_and_their_tools_overlap_the_next_run(tiny):
    """A row that answered (or ran out of turns) gives its slot back before the next `run`
    and a row without a call goes on at once; a search submitted after one `run` is still
    being answered when the next `run` starts (the engine does not wait on it first)."""
    _, tok = tiny
    scripts, examples, cfg = SCRIPTS, SCRIPTED_EXAMPLES, SCRIPTED_CFG

    class Watch(ScriptedRows):
        def open(self, capacity, max_new_tokens, sampling):
            super().open(capacity, max_new_tokens, sampling)
            self.runs, self.ended = 0, set()

        def run(self):
            self.runs += 1
            # every row that answered or searched on its last turn at the last run is gone
            assert not (self.ended & self.held), "a finished row was held into the next run"
            out = super().run()
            self.ended = {k for k, g in out if "<answer>" in self.tok.decode(g)}
            return out

    backend, marks = Watch(tok, scripts), []

    class Gate(CountingDocs):   # answers only once the run after its submission began
        def search(self, queries, k):
            target = marks[len(self.calls)]
            deadline = time.monotonic() + 10
            while backend.runs <= target:
                assert time.monotonic() < deadline, "the engine waited for the tools first"
                time.sleep(0.001)
            return super().search(queries, k)

    engine = RolloutEngine(backend, tok, Gate(), cfg)
    real = engine._tool_jobs

    def jobs(calls):   # the run count when the calls are handed to the thread
        marks.append(backend.runs)
        return real(calls)

    engine._tool_jobs = jobs
    mine = engine.run(examples)
    want = RolloutEngine(Scripted(tok, scripts), tok, CountingDocs(), cfg).run(examples)
    assert _episodes(mine) == _episodes(want) and len(marks) > 2


def test_a_failing_tool_on_the_tool_thread_fails_the_run(tiny):
    _, tok = tiny

    class Broken(CountingDocs):
        def search(self, queries, k):
            raise RuntimeError("index gone")

    scripts = {"Where?": ["<search> x </search>", "<answer> y </answer>"]}
    cfg = RolloutConfig(max_turns=3, topk=2, batch_size=2, continuous=True)
    with pytest.raises(RuntimeError, match="index gone"):
        RolloutEngine(ScriptedRows(tok, scripts), tok, Broken(), cfg).run([ex("q", "Where?")])


def test_an_idle_row_keeps_its_cache_and_rejoins(tiny):
    """A row whose turn ended does not decode while the others go on (its cache columns
    untouched); readmitted with or without new tokens after its turn it decodes
    HFBackend's tokens; a released row goes to a new key; `generate` waits for reset."""
    model, tok = tiny
    backend = StaticBackend(model, tok, stop_strings=(), max_len=128, width_step=16)
    hf = HFBackend(model, tok, stop_strings=())
    greedy = Sampling(greedy=True)
    ctx = {k: tok.encode(f"row {k} " * (3 * n + 1), add_special_tokens=False)
           for n, k in enumerate("abc")}
    backend.open(3, 9, greedy)
    backend.admit(list(ctx), list(ctx.values()), [2, 9, 9])
    (key, turn), = backend.run()
    assert key == "a" and turn == hf.generate([ctx["a"]], 2, greedy)[0]
    r = backend._row_of["a"]
    held = len(backend._seen[r])
    before = backend.kc[:, r, :, :held].clone(), backend.vc[:, r, :, :held].clone()
    rest = dict(backend.run())
    assert sorted(rest) == ["b", "c"]
    assert torch.equal(backend.kc[:, r, :, :held], before[0])
    assert torch.equal(backend.vc[:, r, :, :held], before[1])
    for k in "bc":
        assert rest[k] == hf.generate([ctx[k]], 9, greedy)[0]
    again = {"a": ctx["a"] + turn, "b": ctx["b"] + rest["b"] + [7, 8, 9]}
    backend.admit(list(again), list(again.values()), [5, 5])
    got = dict(backend.run())
    assert got == {k: hf.generate([c], 5, greedy)[0] for k, c in again.items()}
    with pytest.raises(RuntimeError, match="session"):
        backend.generate([[1, 2]], 2, greedy)
    freed = backend._row_of["c"]
    backend.release("c")
    backend.admit(["d"], [ctx["c"]], [9])
    assert backend._row_of["d"] == freed and "c" not in backend._row_of
    assert dict(backend.run()) == {"d": rest["c"]}
    backend.reset()
    assert backend.generate([ctx["a"]], 2, greedy)[0] == turn


def test_sampled_continuous_runs_repeat_for_a_seed(tiny):
    """Sampled: the same seed gives the same episodes and log-probs (those of a full
    forward); the group's samples differ."""
    from seekrl.models import collate
    from seekrl.rl.forward import masked_logprobs

    model, tok = tiny
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8, max_info_tokens=32, n_samples=3,
                        batch_size=2, temperature=0.7, seed=2, continuous=True)
    questions = [ex("q1", "Where was Ilsa born?"), ex("q2", "Which city?")]
    backend = StaticBackend(model, tok, max_len=cfg.max_total_tokens)
    runs = [RolloutEngine(backend, tok, Docs(), cfg).run(questions) for _ in range(2)]
    assert _episodes(runs[0]) == _episodes(runs[1])
    assert [t.rollout_logprobs for t in runs[0]] == [t.rollout_logprobs for t in runs[1]]
    trajs = runs[0]
    ids, attn, mask = collate([t.token_ids for t in trajs], [t.loss_mask for t in trajs],
                              tok.pad_token_id)
    with torch.no_grad():
        lp = masked_logprobs(model, ids, attn, mask, temperature=0.7)["logprobs"]
    for row, t in enumerate(trajs):
        t.check()
        assert torch.allclose(lp[row][mask[row].bool()], torch.tensor(t.rollout_logprobs),
                              atol=1e-4)
    assert len({tuple(t.token_ids) for t in trajs[:3]}) > 1


def test_continuous_is_off_by_default_and_the_static_backends():
    from seekrl.config import EpisodeSettings, RolloutSettings

    assert not RolloutConfig().continuous and not EpisodeSettings().continuous
    assert RolloutSettings(backend="static", continuous=True).continuous
    with pytest.raises(ValueError, match="static backend"):
        RolloutSettings(continuous=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_continuous_under_cuda_graphs_decodes_the_eager_tokens(tiny):
    """Captured steps (flags read every 8 steps) give the eager continuous episodes and
    the turn-by-turn ones."""
    _, tok = tiny
    model = varied(tok, "llama").to("cuda")
    cfg = RolloutConfig(max_turns=4, max_new_tokens=24, n_samples=2, batch_size=3, seed=3,
                        greedy=True)
    examples = [ex(f"q{i}", f"Question {'long ' * (30 * (i % 3))}number {i}?") for i in range(5)]
    runs = []
    for graphs, continuous in ((None, True), (False, True), (None, False)):
        backend = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens,
                                width_step=16, graphs=graphs)
        play = cfg.model_copy(update={"continuous": continuous})
        runs.append(_episodes(RolloutEngine(backend, tok, Docs(), play).run(examples)))
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_work_on_another_thread_beside_captured_steps(tiny):
    """Another thread allocating, computing and syncing on the GPU (as a dense encoder or
    a ranker on the rollout's tool thread does) while the engine captures and replays
    decoding steps: the eager episodes, graphs captured, no capture error on either side.
    (The varied model writes no <search>, so the work runs on a thread of its own.)"""
    import threading

    _, tok = tiny
    model = varied(tok, "llama").to("cuda")
    cfg = RolloutConfig(max_turns=4, max_new_tokens=24, n_samples=2, batch_size=3, seed=3,
                        greedy=True, continuous=True)
    examples = [ex(f"q{i}", f"Question {'long ' * (30 * (i % 3))}number {i}?") for i in range(5)]
    stop, done, errors = threading.Event(), [], []

    def busy():   # no random draws: the default generator is the capture's
        while not stop.is_set():
            try:
                x = torch.ones(512, 512, device="cuda")
                done.append((x @ x).sum().item())
            except RuntimeError as err:
                errors.append(err)
                return

    runs = []
    for graphs in (None, False):
        backend = StaticBackend(model, tok, stop_strings=STOPS, max_len=cfg.max_total_tokens,
                                width_step=16, graphs=graphs)
        stop.clear()
        thread = threading.Thread(target=busy)
        thread.start()
        try:
            runs.append(_episodes(RolloutEngine(backend, tok, Docs(), cfg).run(examples)))
        finally:
            stop.set()
            thread.join()
        if graphs is None:
            assert backend._graphs._graphs and backend._graphs.failed is None
    assert runs[0] == runs[1]
    assert done and not errors, errors[:1]
