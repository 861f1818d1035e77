"""Simulated search (ZeroSearch): a causal language model plays the search engine.

Given a query, the simulator writes `k` short documents, one a line, in the layout the agent
reads them in (`Doc i (Title: T) text`), and `parse_documents` turns its text into `Hit`s:
the same `Retriever.search` interface as an index, so every RL method and command runs on it
unchanged (and `seekrl serve --simulate MODEL` answers the Search-R1 schema with it).

Two prompts: *useful* documents (relevant to the query and, when the caller knows them, to
the episode's question and its gold answer: `search_with_context`) and *noisy* ones (they
look relevant but do not answer it). Each query draws noisy with probability `noise`, which a
curriculum raises over training (`noise_probability`: ZeroSearch's exponential schedule from
a start to an end value, base 4 by default). The simulator is an environment: its tokens
never enter the policy's loss (the engine appends them as an `<information>` block, masked
like a real retriever's).

Documents get ids `sim-<digest of title and text>`: they never equal a corpus id, so the
`evidence` reward and evidence recall, which judge by gold ids, give simulated documents no
credit; `simulator_quality` measures them against the real index instead (gold-document
title hits and answer containment).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from seekrl.retrieval.base import Hit, RetrievalError

USEFUL = "useful"
NOISY = "noisy"

_ASK = ("You are a search engine. Write {k} short documents (about {words} words each) that a "
        "search for the query below would return. Write each on its own line as: Doc N "
        "(Title: a title) the document's text.")
_USEFUL = (" The documents must be relevant to the query and hold facts that help answer the "
           "question{answer_hint}.")
_NOISY = (" The documents must look related to the query but must not contain the information "
          "that answers it or the question: mention other people, places and numbers.")


def simulator_prompt(query: str, k: int, *, kind: str = USEFUL, question: str | None = None,
                     answer: str | None = None, words: int = 30) -> str:
    """The user message the simulator answers: what to write (`kind`: useful or noisy), the
    query, and for useful documents the episode's question and gold answer when known (as
    ZeroSearch gives them, so a simulator can write documents for questions it does not
    know the answer to; a noisy prompt leaves both the question and the answer out)."""
    if kind not in (USEFUL, NOISY):
        raise ValueError(f"kind: expected {USEFUL!r} or {NOISY!r}, got {kind!r}")
    text = _ASK.format(k=k, words=words)
    if kind == USEFUL:
        hint = f", whose answer is {answer}" if answer else ""
        text += _USEFUL.format(answer_hint=hint)
    else:
        text += _NOISY
    text += f"\n\nQuery: {query.strip()}"
    if question and kind == USEFUL:
        text += f"\nQuestion: {question.strip()}"
    return text


def simulator_input(tokenizer, prompt: str) -> str:
    """The text the simulator reads for a prompt: through its chat template (plain text with
    a blank line where it has none). Generation and the simulator's SFT both use this."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             tokenize=False, add_generation_prompt=True)
    return prompt + "\n\n"


def simulator_target(hits: Sequence[Hit]) -> str:
    """Documents as the simulator should write them (its SFT target): the prompt's layout."""
    return "\n".join(f"Doc {i} (Title: {h.title}) {' '.join(h.text.split())}"
                     for i, h in enumerate(hits, 1))


# "Doc N (Title: T) text" or "Doc N: text"; an opened "(Title:" must be the title, which
# may hold brackets of its own one deep ("Foo (band)", as Wikipedia titles do); N is whole
# (no digits given back to the text: "Doc 10 (Title: cut off" is not a document "0 ...")
_DOC = re.compile(r"^\s*(?:[-*]\s*)?Doc(?:ument)?\s*(\d+)(?!\d)\s*"
                  r"(?:\(\s*Title:\s*(?P<title>(?:[^()]|\([^()]*\))*)\)|(?!\s*\(\s*Title:))"
                  r"\s*[:.\-]?\s*(?P<text>.*\S)\s*$", re.I)


def parse_documents(text: str, k: int) -> tuple[list[tuple[str, str]], bool]:
    """The (title, text) documents in a simulator's output, at most `k`, in order, repeats
    dropped; and whether the output was well formed (every non-empty line a `Doc N` line,
    at least one). Lines that are not documents are left out but make it malformed; a
    document without a title gets an empty one."""
    docs: list[tuple[str, str]] = []
    seen: set[str] = set()
    well_formed = True
    for line in str(text).splitlines():
        if not line.strip():
            continue
        m = _DOC.match(line)
        if m is None or not m.group("text").strip():
            well_formed = False
            continue
        title = " ".join((m.group("title") or "").split())
        body = " ".join(m.group("text").split())
        key = f"{title.lower()}\n{body.lower()}"
        if key in seen:
            continue
        seen.add(key)
        if len(docs) < k:
            docs.append((title, body))
    return docs, well_formed and bool(docs)


def document_id(title: str, text: str) -> str:
    """`sim-` and 12 hex digits (`retrieval.base.simulated_id` knows them)."""
    return "sim-" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def noise_probability(step: float, total: float, start: float, end: float,
                      base: float = 4.0) -> float:
    """ZeroSearch's curriculum: the probability that a query gets noisy documents at training
    step `step` of `total` (or any share of the run: the trainer passes its progress of 1),
    rising from `start` to `end` along `(base^(step/total) - 1) / (base - 1)`; `end` from
    `total` on. `base` 1 would be linear (taken as such)."""
    if total <= 0:
        raise ValueError(f"total: expected a positive number of steps, got {total}")
    if not (0 <= start <= 1 and 0 <= end <= 1):
        raise ValueError(f"noise: start and end must be probabilities, got {start}, {end}")
    frac = min(max(step, 0) / total, 1.0)
    shape = frac if abs(base - 1.0) < 1e-9 else (base ** frac - 1) / (base - 1)
    return start + shape * (end - start)


SIMULATOR_FILE = "simulator.json"   # in a `seekrl simulator train` final/: its prompt settings
# a simulator's defaults (`simulator:` in a train config has its own, the same)
DEFAULT_WORDS = 30             # asked-for length of a document
DEFAULT_MAX_NEW_TOKENS = 256   # tokens written per query, all its documents
DEFAULT_TEMPERATURE = 0.8


def prompt_mismatch(model: str, *, topk: int | None, words: int) -> str | None:
    """What differs between the prompt a trained simulator (`seekrl simulator train`'s
    final/, which records its documents per query and words per document) learned and
    the one it is about to be given (`topk` None: set per request), or None."""
    saved = Path(model) / SIMULATOR_FILE
    if not saved.is_file():
        return None
    try:
        trained = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return f"simulator {model}: {saved} cannot be read ({err}), so its prompt is unknown"
    asked = {"topk": topk, "words": words}
    off = [f"{key} {asked[key]} (trained with {trained[key]})" for key in ("topk", "words")
           if asked[key] is not None and key in trained and trained[key] != asked[key]]
    return (f"simulator {model}: asked for {', '.join(off)}: its documents may not follow "
            "the prompt it is given") if off else None


class SimulatedRetriever:
    """A causal LM writes the documents (see the module). `model` and `tokenizer` are a
    Hugging Face causal LM and its tokenizer (`from_pretrained` loads one by name, the
    bundled model by default); generation is batched, `batch_size` queries at a time,
    sampled at `temperature` (0: greedy), at most `max_new_tokens` per query. `noise` is the
    probability of a noisy prompt per query (`set_noise`, the curriculum's value). `stats`
    counts queries, useful and noisy prompts, malformed outputs and empty ones (no document
    parsed: the agent is then told nothing matched), cut ones (stopped by `max_new_tokens`
    before their end: the last document is a fragment, kept as written), and the tokens the
    simulator decoded (`tokens`: its compute, which no rollout-token budget counts).

    `decoder`: what turns the prompts' texts into replies, `decoder(texts, max_new_tokens,
    temperature) -> texts`, called under the simulator's seed. None: Hugging Face's
    `model.generate`. The trainer and `seekrl serve --simulate` pass the rollout engine's
    own loop (`seekrl.agent.backends.text_decoder`, `simulator.engine: seekrl`), which
    gives the same greedy tokens faster than `generate`; this module does not import it, as
    `retrieval/` sits below `agent/` (a decoder is handed in, not looked up). `engine` says
    which decodes: the decoder's `name`, or `generate`."""

    def __init__(self, model, tokenizer, *, noise: float = 0.0,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 temperature: float = DEFAULT_TEMPERATURE, batch_size: int = 16,
                 words: int = DEFAULT_WORDS,
                 seed: int = 0, decoder: Callable[[list[str], int, float], list[str]]
                 | None = None):
        if not 0 <= noise <= 1:
            raise ValueError(f"noise: expected a probability, got {noise}")
        self.model, self.tokenizer = model, tokenizer
        self.decoder = decoder
        self.noise, self.max_new_tokens, self.temperature = noise, max_new_tokens, temperature
        self.batch_size, self.words = batch_size, words
        self._rng = random.Random(seed)
        self._seed = seed
        self._calls = 0
        self.stats: Counter = Counter()
        self.last_cut: list[bool] | None = None

    @property
    def sampled(self) -> bool:
        """Each query is a fresh draw (a noisy or useful prompt, sampled tokens): a server
        neither caches its answers nor merges repeats of a query (a GRPO group's rollouts
        asking alike would otherwise all read the same documents)."""
        return self.temperature > 0 or self.noise > 0

    @property
    def engine(self) -> str:
        return "generate" if self.decoder is None else getattr(self.decoder, "name", "custom")

    @classmethod
    def from_pretrained(cls, name: str = "smollm2-135m", *, device: str = "cpu",
                        dtype: str = "float32", make_decoder=None, **kw
                        ) -> "SimulatedRetriever":
        """Load the simulator by name; `make_decoder(model, tokenizer)` builds its decoder
        (None from it, or no `make_decoder`: `model.generate`)."""
        from seekrl.models import load_policy

        model, tokenizer = load_policy(name, device=device, dtype=dtype)
        model.eval()
        decoder = make_decoder(model, tokenizer) if make_decoder is not None else None
        return cls(model, tokenizer, decoder=decoder, **kw)

    def reseed(self, seed: int) -> None:
        """Draw the useful/noisy choices and the generation seeds from `seed` from here on:
        the trainer reseeds it at each step's rollouts from the step's (and rank's) seed, so
        a resumed run draws what the uninterrupted one would have, and ranks differ."""
        self._rng = random.Random(seed)
        self._seed, self._calls = seed, 0

    def set_noise(self, noise: float) -> None:
        if not 0 <= noise <= 1:
            raise ValueError(f"noise: expected a probability, got {noise}")
        self.noise = noise

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return self.search_with_context(queries, k)

    def search_with_context(self, queries: list[str], k: int,
                            questions: Sequence[str | None] | None = None,
                            answers: Sequence[str | None] | None = None) -> list[list[Hit]]:
        """`search`, with each query's episode question and gold answer for the useful
        prompt (the rollout engine passes them; the HTTP schema has queries alone)."""
        n = len(queries)
        questions = list(questions) if questions is not None else [None] * n
        answers = list(answers) if answers is not None else [None] * n
        if len(questions) != n or len(answers) != n:
            raise ValueError(f"{n} queries but {len(questions)} questions and {len(answers)} "
                             "answers")
        kinds = [NOISY if self._rng.random() < self.noise else USEFUL for _ in queries]
        prompts = [simulator_prompt(q, k, kind=kind, question=qu, answer=a, words=self.words)
                   for q, kind, qu, a in zip(queries, kinds, questions, answers)]
        texts: list[str] = []
        cuts: list[bool] = []
        for start in range(0, n, self.batch_size):
            self.last_cut = None
            replies = self.generate(prompts[start:start + self.batch_size])
            texts += replies
            said = self.last_cut   # which replies ran out of tokens (None: not known)
            cuts += list(said) if said is not None and len(said) == len(replies) \
                else [False] * len(replies)
        out = []
        for kind, text, cut in zip(kinds, texts, cuts):
            docs, ok = parse_documents(text, k)
            self.stats["queries"] += 1
            self.stats[kind] += 1
            self.stats["malformed"] += not ok
            self.stats["cut"] += bool(cut)
            self.stats["empty"] += not docs
            self.stats["short"] += len(docs) < k   # fewer than k (repeats dropped, or unwritten)
            out.append([Hit(document_id(t, x), t, x, float(len(docs) - i))
                        for i, (t, x) in enumerate(docs)])
        return out

    def generate(self, prompts: list[str]) -> list[str]:
        """The simulator's reply to each user message (through its chat template); sets
        `last_cut`, whether each reply stopped at `max_new_tokens` before its end (None
        when its decoder does not say)."""
        import torch

        texts = [simulator_input(self.tokenizer, p) for p in prompts]
        self._calls += 1
        seeded = _seeded(self._seed * 1_000_003 + self._calls,
                         next(self.model.parameters()).device)
        if self.decoder is not None:
            with torch.no_grad(), seeded:
                replies = list(self.decoder(texts, self.max_new_tokens, self.temperature))
            if len(replies) != len(texts):   # zip would hand the rest wrong documents or none
                raise RetrievalError(f"the simulator's decoder {self.decoder!r} returned "
                                     f"{len(replies)} replies for {len(texts)} prompts")
            decoded = getattr(self.decoder, "last_tokens", None)
            if decoded is None:   # a decoder that does not say: its replies, tokenised again
                decoded = sum(len(self.tokenizer(r, add_special_tokens=False)["input_ids"])
                              for r in replies)
            self.stats["tokens"] += int(decoded)
            self.last_cut = getattr(self.decoder, "last_cut", None)
            return replies
        return self._hf_generate(texts, seeded)

    def _hf_generate(self, texts: list[str], seeded) -> list[str]:
        import torch

        from seekrl.models import end_of_turn_ids

        tok = self.tokenizer
        # a reply ends at its turn's end: the template's end-of-turn token too, not EOS alone
        stop = end_of_turn_ids(tok, self.model)
        side, tok.padding_side = tok.padding_side, "left"
        try:
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tok.padding_side = side
        device = next(self.model.parameters()).device
        enc = {key: v.to(device) for key, v in enc.items()}
        sample = self.temperature > 0
        with torch.no_grad(), seeded:
            out = self.model.generate(
                **enc, max_new_tokens=self.max_new_tokens, do_sample=sample,
                temperature=self.temperature if sample else None, top_p=None, top_k=None,
                eos_token_id=sorted(stop),
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                else tok.eos_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        # what each row decoded: up to its first end token, which counts (the padding after
        # it, when pad and end are one token, does not)
        if new.shape[1]:
            ended = torch.isin(new, torch.tensor(sorted(stop), device=new.device))
            first = torch.where(ended.any(1), ended.int().argmax(1) + 1, new.shape[1])
            self.stats["tokens"] += int(first.sum())
            # generate stops early only once every row has ended
            self.last_cut = ((~ended.any(1)).tolist() if new.shape[1] >= self.max_new_tokens
                             else [False] * new.shape[0])
        return tok.batch_decode(new, skip_special_tokens=True)


class _seeded:
    """Sampling draws from torch's global generators (the CPU one, and the CUDA one of the
    simulator's device when it is on a GPU): seed them for the call from `seed` and put the
    caller's states back after, so the simulator neither depends on nor moves the policy's
    random stream."""

    def __init__(self, seed: int, device=None):
        import torch

        self.seed = seed
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def __enter__(self):
        import torch

        cuda = self.device.type == "cuda"
        self.fork = torch.random.fork_rng(devices=[self.device] if cuda else [])
        self.fork.__enter__()
        torch.random.default_generator.manual_seed(self.seed)
        if cuda:
            with torch.cuda.device(self.device):
                torch.cuda.manual_seed(self.seed)

    def __exit__(self, *exc):
        return self.fork.__exit__(*exc)


def simulator_quality(simulated: Sequence[Sequence[Hit]], real: Sequence[Sequence[Hit]],
                      gold_titles: Sequence[Sequence[str]], answers: Sequence[Sequence[str]]
                      ) -> dict[str, float]:
    """How a simulator's documents compare with a real index's for the same queries: the
    share of queries with a document titled as a gold document (`gold_title_hit`), with
    a document holding a gold answer (`answer_contained`), both for the simulated and the
    real results, and the share of queries the simulator returned nothing for."""
    def norm(s: str) -> str:
        return " ".join(str(s).lower().split())

    def rates(results) -> tuple[float, float]:
        title = answer = 0
        for hits, golds, ans in zip(results, gold_titles, answers):
            titles = {norm(h.title) for h in hits}
            title += bool(titles & {norm(g) for g in golds})
            text = " ".join(norm(h.text) for h in hits)
            answer += any(norm(a) and norm(a) in text for a in ans)
        n = max(1, len(results))
        return title / n, answer / n

    s_title, s_answer = rates(simulated)
    r_title, r_answer = rates(real)
    return {"queries": len(simulated), "sim_gold_title_hit": s_title,
            "sim_answer_contained": s_answer, "real_gold_title_hit": r_title,
            "real_answer_contained": r_answer,
            "sim_empty": sum(not h for h in simulated) / max(1, len(simulated))}
