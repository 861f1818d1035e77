"""The synthetic world: determinism, disjoint splits, facts where the metadata says they are."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from seekrl.data.qa import read_qa_jsonl
from seekrl.data.world import PRESETS, WorldConfig, _Builder, generate_world, write_world

SMALL = dict(entities=240, n_train=150, n_dev=30, n_test=30)


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=3, difficulty="medium", **SMALL)


@pytest.fixture(scope="module")
def docs(world):
    return {d["id"]: d["contents"] for d in world.docs}


def test_same_seed_same_world_other_seed_other_world():
    a = generate_world(seed=7, **SMALL)
    b = generate_world(seed=7, **SMALL)
    c = generate_world(seed=8, **SMALL)
    assert a.docs == b.docs
    assert [q.to_dict() for q in a.splits["test"]] == [q.to_dict() for q in b.splits["test"]]
    assert a.docs != c.docs


def test_split_sizes_and_ids(world):
    assert {s: len(q) for s, q in world.splits.items()} == {"train": 150, "dev": 30, "test": 30}
    ids = [q.id for qs in world.splits.values() for q in qs]
    assert len(ids) == len(set(ids))
    for qs in world.splits.values():
        assert len({q.question for q in qs}) == len(qs)


def _touched(questions) -> set[str]:
    """Every entity a question touches: each hop's subject and answer, and its gold doc."""
    out = set()
    for q in questions:
        for hop in q.metadata["chain"]:
            out |= {hop["subject"], hop["doc_id"]}
            if hop["relation"] not in ("birth_year", "founded_year", "release_year",
                                       "population", "occupation", "language"):
                out.add(hop["answer"])
    return out


def test_test_questions_touch_no_train_entity(world):
    train = _touched(world.splits["train"])
    for split in ("dev", "test"):
        assert not (_touched(world.splits[split]) & train), split


def test_every_hop_fact_is_in_its_gold_document(world, docs):
    n = 0
    for qs in world.splits.values():
        for q in qs:
            assert q.metadata["gold_doc_ids"] == [h["doc_id"] for h in q.metadata["chain"]]
            assert q.metadata["hops"] == len(q.metadata["chain"])
            for hop in q.metadata["chain"]:
                text = docs[hop["doc_id"]]
                assert hop["subject"] in text, (q.question, hop)
                assert hop["answer"] in text, (q.question, hop)
                n += 1
    assert n > 300


def test_reverse_stated_facts_are_not_in_the_subjects_own_document(world, docs):
    by_title = {c.split("\n", 1)[0]: c for c in docs.values()}
    reverse = [h for qs in world.splits.values() for q in qs for h in q.metadata["chain"]
               if h["stated_in"] == "object"]
    assert len(reverse) > 20  # medium states ~30% of relations only in the object's doc
    hidden = sum(h["answer"] not in by_title[h["subject"]] for h in reverse)
    assert hidden / len(reverse) > 0.9


def test_answers_follow_the_chain(world):
    for q in world.splits["train"]:
        meta = q.metadata
        if meta["type"] == "comparison":
            assert meta["judgement"]
            if q.golden_answers[0] in ("yes", "no"):
                continue
            # the winner is one of the entities the question names
            assert q.golden_answers[0] in {h["subject"] for h in meta["chain"]}
        else:
            assert q.golden_answers[0] == meta["chain"][-1]["answer"]
            # each hop starts where the previous one ended
            for prev, nxt in zip(meta["chain"], meta["chain"][1:]):
                assert nxt["subject"] == prev["answer"]


def test_documents_are_paragraphs_of_60_to_125_words(world):
    words = [len(d["contents"].split("\n", 1)[1].split()) for d in world.docs]
    assert min(words) >= 45 and max(words) <= 170
    assert 60 <= sum(words) / len(words) <= 125
    titles = [d["contents"].split("\n", 1)[0] for d in world.docs]
    assert len(titles) == len(set(titles)), "every document has its own title"


def test_document_text_reads_as_english(world):
    """No "a album" / "an university" from a template's "a {kind}", and no
    "ambitious and ambitious" from two draws of the same adjective."""
    import re

    from seekrl.data.world import _article

    for d in world.docs:
        text = d["contents"]
        for article, word in re.findall(r"\b([Aa]n?) ([A-Za-z]+)", text):
            assert article.lower() == _article(word), (article, word, d["id"])
        assert not re.search(r"\b(\w+) and \1\b", text), text
    assert _article("university") == "a" and _article("album") == "an"
    assert _article("hour") == "an" and _article("city") == "a"


def test_distractors_have_near_duplicate_names(world):
    stats = world.stats()
    assert stats["distractor_docs"] >= 0.8 * stats["entities"]
    distractors = [e for e in world.entities.values() if e.distractor]
    real_names = {e.name for e in world.entities.values() if not e.distractor}
    close = 0
    for d in distractors[:100]:
        close += any(len(d.name) - 1 <= len(r) <= len(d.name) + 1 and
                     sum(a != b for a, b in zip(d.name, r)) <= 1 for r in real_names)
    assert close >= 80


def test_an_organisations_alias_is_its_own_word(world):
    """'College of Ruon' is called 'Ruon', not 'College': the kind's word named one
    organisation of every world while a dozen others bear it."""
    from seekrl.data import names as nm

    kinds = {w for suffixes, _ in nm.ORG_KINDS.values() for s in suffixes for w in s.split()}
    orgs = [e for e in world.entities.values() if e.type == "org" and not e.distractor]
    assert any(" of " in e.name for e in orgs)          # the form the check is about
    aliases = [e.alias for e in orgs if e.alias]
    assert aliases and not set(aliases) & kinds
    assert all(a in e.name.split(" ") for e in orgs if (a := e.alias))

def test_difficulty_dials_the_questions():
    easy = generate_world(seed=1, difficulty="easy", **SMALL)
    hard = generate_world(seed=1, difficulty="hard", **SMALL)
    easy_q = [q for qs in easy.splits.values() for q in qs]
    hard_q = [q for qs in hard.splits.values() for q in qs]
    assert {q.metadata["hops"] for q in easy_q} <= {1, 2}
    assert not any(q.metadata["type"] == "comparison" for q in easy_q)
    assert not any(h["stated_in"] == "object" for q in easy_q for h in q.metadata["chain"])
    assert easy.stats()["distractor_docs"] == 0
    hops = Counter(q.metadata["hops"] for q in hard_q)
    assert min(hops) >= 2 and hops[4] > 0 and hops[3] > 0
    assert any(q.metadata.get("anchor_form") == "description" for q in hard_q)
    assert any(q.metadata.get("anchor_form") == "alias" for q in hard_q) or \
        any(a.startswith(("Republic", "Kingdom", "Old ")) for q in hard_q for a in q.golden_answers)
    assert hard.stats()["distractor_docs"] >= 1.8 * hard.stats()["entities"]


def test_descriptions_replace_the_first_query():
    w = generate_world(seed=2, difficulty="hard", **SMALL)
    described = [q for qs in w.splits.values() for q in qs
                 if q.metadata.get("anchor_form") == "description"]
    assert described
    for q in described:
        first = q.metadata["chain"][0]
        assert first["subject"] not in q.question  # the name is never given
        assert first["query"] in q.question        # the expert searches the description


def test_explicit_knobs_override_the_preset():
    cfg = WorldConfig(difficulty="hard", distractors=0.0, hop_mix={3: 1.0},
                      comparison_share=0.0, **SMALL)
    assert cfg.distractors == 0.0 and cfg.reverse_rate == PRESETS["hard"]["reverse_rate"]
    w = generate_world(cfg)
    assert w.stats()["distractor_docs"] == 0
    assert {q.metadata["hops"] for qs in w.splits.values() for q in qs} == {3}


@pytest.mark.parametrize("kwargs, field", [
    (dict(difficulty="impossible"), "difficulty"),
    (dict(hop_mix={5: 1.0}), "hop_mix"),
    (dict(hop_mix={2: 0.0}), "hop_mix"),
    (dict(entities=10), "entities"),
    (dict(alias_rate=1.5), "alias_rate"),
    # a negative share had made a 20-entity split; a pair had dropped the test split
    (dict(split_shares=(0.9, 0.2, -0.1)), "split_shares"),
    (dict(split_shares=(0.8, 0.2)), "split_shares"),
    (dict(split_shares=(0.0, 0.0, 0.0)), "split_shares"),
    (dict(split_shares=(0.7, float("nan"), 0.15)), "split_shares"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        WorldConfig(**kwargs)


def test_a_config_and_keyword_fields_together_are_refused():
    """generate_world(cfg, seed=5) built cfg's world and dropped seed=5 without a word."""
    with pytest.raises(TypeError, match="not both .*seed"):
        generate_world(WorldConfig(**SMALL), seed=5)


def test_write_world_files(tmp_path, world):
    paths = write_world(world, tmp_path)
    lines = paths["corpus"].read_text().splitlines()
    assert len(lines) == len(world.docs)
    first = json.loads(lines[0])
    assert set(first) == {"id", "contents"} and "\n" in first["contents"]
    for split in ("train", "dev", "test"):
        back = read_qa_jsonl(paths[split])
        assert [q.to_dict() for q in back] == [q.to_dict() for q in world.splits[split]]
    meta = json.loads(paths["world"].read_text())
    assert meta["config"]["difficulty"] == "medium" and meta["stats"]["docs"] == len(world.docs)


@pytest.fixture(scope="module")
def medium():
    """A medium world with a few hundred questions per split: enough to see its mix."""
    return generate_world(seed=5, difficulty="medium", entities=600, n_train=400, n_dev=90,
                          n_test=90)


@pytest.mark.parametrize("n", [0, 1, 7, 90, 199, 400, 2000])
def test_quotas_sum_to_n_and_round_each_share(n):
    cfg = WorldConfig(difficulty="medium")
    quotas = _Builder(cfg).quotas(n)
    assert sum(quotas.values()) == n
    exact = {"comparison": cfg.comparison_share * n}
    exact |= {h: (1 - cfg.comparison_share) * n * w for h, w in cfg.hop_mix.items()}
    assert quotas.keys() == exact.keys()
    assert all(abs(quotas[k] - exact[k]) < 1 for k in exact), (quotas, exact)


def test_every_split_holds_the_configured_mix(medium):
    """Quotas, not draw weights: a failed draw is retried as the same kind, so the kinds
    that fail more (long chains) are not crowded out by comparisons and 1-hop chains."""
    cfg = medium.config
    for split, qs in medium.splits.items():
        n = len(qs)
        comparisons = sum(q.metadata["type"] == "comparison" for q in qs)
        assert abs(comparisons - round(cfg.comparison_share * n)) <= 1, split
        hops = Counter(q.metadata["hops"] for q in qs if q.metadata["type"] != "comparison")
        for h, w in cfg.hop_mix.items():
            assert abs(hops[h] - (1 - cfg.comparison_share) * n * w) < 1, (split, hops)
        # interleaved, not made in blocks of one kind
        assert len({q.metadata["type"] for q in qs[:20]}) > 1
        assert [q.id for q in qs] == [f"{split}-{i}" for i in range(n)]


def test_three_way_comparisons_name_the_winner_among_three(medium):
    by_name = {e.name: e for e in medium.entities.values() if not e.distractor}
    comparisons = [q for q in medium.splits["train"] if q.metadata["type"] == "comparison"]
    three = [q for q in comparisons if q.metadata["options"] == 3]
    assert len(three) >= 10
    assert all(q.metadata["options"] == 2 for q in comparisons if q not in three)
    for q in three:
        chain = q.metadata["chain"]
        assert q.metadata["hops"] == 3 and len(chain) == 3
        entities = [by_name[h["subject"]] for h in chain]
        assert len({e.key for e in entities}) == 3
        assert all(e.name in q.question or e.alias in q.question for e in entities), q.question
        values = [int(h["answer"].replace(",", "")) for h in chain]
        assert len(set(values)) == 3, q.question       # one winner
        winner = q.golden_answers[0]
        assert winner in [e.name for e in entities]
        assert values[[e.name for e in entities].index(winner)] in (min(values), max(values))
        assert q.metadata["judgement"].count(";") == 2
        assert " or " in q.question or " and " in q.question


def test_yes_no_comparisons_stay_balanced(medium):
    answers = Counter(q.golden_answers[0] for qs in medium.splits.values() for q in qs
                      if q.golden_answers[0] in ("yes", "no"))
    assert answers["yes"] + answers["no"] >= 40
    assert 0.35 <= answers["yes"] / (answers["yes"] + answers["no"]) <= 0.65


@pytest.mark.parametrize("hop_mix", [{1: 0.5, 2: 0.5}, {1: 0.5, 2: 0.5, 4: 0.0}])
def test_no_three_way_comparisons_without_3_hop_questions(hop_mix):
    """A hop count of weight 0 is not asked for (it opened three-way comparisons)."""
    w = generate_world(seed=4, difficulty="medium", hop_mix=hop_mix, **SMALL)
    comparisons = [q for qs in w.splits.values() for q in qs
                   if q.metadata["type"] == "comparison"]
    assert comparisons and all(q.metadata["options"] == 2 and q.metadata["hops"] == 2
                               for q in comparisons)


def test_same_seed_same_questions_in_every_split():
    a = generate_world(seed=11, difficulty="medium", **SMALL)
    b = generate_world(seed=11, difficulty="medium", **SMALL)
    for split in a.splits:
        assert [q.to_dict() for q in a.splits[split]] == [q.to_dict() for q in b.splits[split]]


def test_a_kind_that_cannot_be_filled_is_named(monkeypatch):
    make = _Builder.chain_question
    monkeypatch.setattr(_Builder, "chain_question",
                        lambda self, split, hops: None if hops == 4 else make(self, split, hops))
    with pytest.raises(RuntimeError, match="train split: could only make 0 of 18 distinct 4-hop chain"):
        generate_world(seed=3, difficulty="medium", **SMALL)
