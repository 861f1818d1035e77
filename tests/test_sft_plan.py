"""SFT's two levers on the lookup plan: `plan_weight` (the plan's tokens weigh more in a
weighted mean) and `balance_types` (each epoch draws the question groups in equal or given
shares). Both off by default, where the loss and the batches are today's."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter

import pytest
import torch
from conftest import build_world_and_index, interrupt_at_call
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.agent.oracle import PLAN_LEAD, oracle_episode
from seekrl.config import ConfigError, SFTConfig
from seekrl.data.qa import read_qa_jsonl
from seekrl.errors import DataError
from seekrl.models import collate, load_tokenizer, tiny_policy
from seekrl.recipes.sft import (
    SFTExample,
    balanced_draw,
    batches,
    check_balance,
    group_quotas,
    load_sft_examples,
    loss_weight,
    plan_span,
    question_group,
    run_sft,
    sft_loss,
)
from seekrl.retrieval.index import load_index
from seekrl.rl.forward import masked_logprobs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("sftplan")
    _, paths, index_dir = build_world_and_index(out, seed=5, difficulty="medium", entities=200,
                                                n_train=12, n_dev=6, n_test=6)
    index = load_index(index_dir)
    train = read_qa_jsonl(paths["train"])
    oracle = out / "oracle.jsonl"
    oracle.write_text("".join(json.dumps(oracle_episode(ex, index, k=2)) + "\n"
                              for ex in train))
    return {"train": train, "oracle": oracle}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return tiny_policy(seed=2)


@pytest.fixture(scope="module")
def tok():
    from seekrl.models import DEFAULT_MODEL
    return load_tokenizer(DEFAULT_MODEL)


def _decode(tok):
    return lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False)


# --- the plan's span ------------------------------------------------------------------

def test_the_plan_span_is_the_oracle_plans_number_and_noun(world, tok):
    """On oracle episodes: exactly the tokens of "N lookup(s)" in the first turn, N the
    lookups the oracle planned."""
    examples, _ = load_sft_examples(world["oracle"], tok, max_info_tokens=64,
                                    only_complete=False, plans=True)
    recs = [json.loads(line) for line in world["oracle"].read_text().splitlines()]
    assert len(examples) == len(recs)
    for e, rec in zip(examples, recs):
        planned = rec["turns"][0]["content"].split(PLAN_LEAD)[1].split(".")[0]
        s, end = e.plan
        assert _decode(tok)(e.token_ids[s:end]) == planned
        assert all(e.loss_mask[s:end])
        first_policy = e.loss_mask.index(1)
        assert first_policy < s < first_policy + 20     # in the first turn's opening
        assert e.metadata == rec["metadata"]
    plain, _ = load_sft_examples(world["oracle"], tok, max_info_tokens=64, only_complete=False)
    assert [e.plan for e in plain] == [None] * len(plain)   # found only when asked
    assert [(e.token_ids, e.loss_mask) for e in plain] == \
        [(e.token_ids, e.loss_mask) for e in examples]


# any text but an earlier plan of its own (then that one is the plan)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).filter(
    lambda t: "lookup" not in t)


@settings(max_examples=150, deadline=None)
@given(before=_text, after=_text, n=st.integers(0, 120), prompt=st.integers(0, 5))
def test_the_plan_span_holds_the_plan_and_nothing_it_can_spare(tok, before, after, n, prompt):
    """Whatever text surrounds it: the span decodes to a text that holds the plan, and
    neither its first nor its last token can go."""
    plan = f"{n} lookup{'s' * (n > 1)}"
    turn = f"<think> {before}{PLAN_LEAD}{plan}. {after} </think>\n<search> q </search>"
    ids = list(range(100, 100 + prompt)) + tok.encode(turn, add_special_tokens=False)
    mask = [0] * prompt + [1] * (len(ids) - prompt)
    ids += tok.encode("<information> Doc 1 x </information>", add_special_tokens=False)
    mask += [0] * (len(ids) - len(mask))
    decode = _decode(tok)
    span = plan_span(decode, ids, mask)
    assert span is not None
    s, e = span
    assert prompt <= s < e <= len(ids) and all(mask[s:e])
    assert plan in decode(ids[s:e])
    assert plan not in decode(ids[s + 1:e]) and plan not in decode(ids[s:e - 1])


def test_no_plan_no_span(tok):
    """A first turn without the plan (`--plan none`), a plan only in a later turn or in a
    document: nothing to weigh."""
    decode = _decode(tok)

    def ep(*parts):
        ids, mask = [], []
        for text, m in parts:
            new = tok.encode(text, add_special_tokens=False)
            ids += new
            mask += [m] * len(new)
        return ids, mask

    plan = f"{PLAN_LEAD}2 lookups."
    for parts in ([("prompt", 0), ("<think> First I will look. </think>", 1)],
                  [("prompt", 0), ("<think> x </think>", 1), (plan, 0), (plan, 1)],
                  [(plan, 0), ("<answer> y </answer>", 1)],
                  [("prompt", 0)]):
        assert plan_span(decode, *ep(*parts)) is None
    assert plan_span(decode, *ep(("p", 0), (plan, 1))) is not None


# --- the weighted loss ----------------------------------------------------------------

def _toy_batch(world, tok):
    examples, _ = load_sft_examples(world["oracle"], tok, max_info_tokens=32, limit=3,
                                    plans=True)
    assert all(e.plan is not None for e in examples)
    return examples


def _token_nll(model, e):
    """Each token's NLL under the model, by hand (position t predicted at t - 1)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([e.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
    return [0.0] + [-float(logp[t - 1, e.token_ids[t]]) for t in range(1, len(e.token_ids))]


@pytest.mark.parametrize("w", [0.0, 0.5, 3.0, 10.0])
def test_the_weighted_loss_is_a_weighted_mean(world, tiny, tok, w):
    model, _ = tiny
    batch = _toy_batch(world, tok)
    num = den = 0.0
    for e in batch:
        nll = _token_nll(model, e)
        for t, m in enumerate(e.loss_mask):
            if m:
                weight = w if e.plan[0] <= t < e.plan[1] else 1.0
                num += weight * nll[t]
                den += weight
    total, weight = sft_loss(model, batch, tok.pad_token_id, "cpu", plan_weight=w)
    assert weight == pytest.approx(den) and loss_weight(batch, w) == pytest.approx(den)
    assert float(total.detach()) / weight == pytest.approx(num / den, rel=1e-4)
    # two micro-batches normalised over the step, as run_sft does: the same mean
    a, _ = sft_loss(model, batch[:1], tok.pad_token_id, "cpu", plan_weight=w)
    b, _ = sft_loss(model, batch[1:], tok.pad_token_id, "cpu", plan_weight=w)
    assert float((a + b).detach()) / loss_weight(batch, w) == pytest.approx(num / den, rel=1e-4)


def test_plan_weight_one_is_todays_loss_bit_for_bit(world, tiny, tok):
    model, _ = tiny
    batch = _toy_batch(world, tok)
    ids, attn, mask = collate([e.token_ids for e in batch], [e.loss_mask for e in batch],
                              tok.pad_token_id, "cpu")
    today = -(masked_logprobs(model, ids, attn, mask)["logprobs"] * mask).sum()
    n = int(mask.sum())
    for kw in ({}, {"plan_weight": 1.0}, {"plan_weight": 1.0, "parts": {}}):
        total, weight = sft_loss(model, batch, tok.pad_token_id, "cpu", **kw)
        assert torch.equal(total, today) and weight == n and isinstance(weight, int)
    assert loss_weight(batch) == n and isinstance(loss_weight(batch), int)
    parts: dict = {}
    sft_loss(model, batch, tok.pad_token_id, "cpu", parts=parts)
    assert parts["plan_tokens"] == sum(e.plan[1] - e.plan[0] for e in batch)


# --- the balanced draw ----------------------------------------------------------------

def _examples(counts: dict[tuple[str, int], int]) -> list[SFTExample]:
    out = []
    for (kind, hops), n in counts.items():
        for i in range(n):
            out.append(SFTExample([1, 2, 3 + len(out)], [0, 1, 1], f"{kind}-{hops}:{i}",
                                  {"type": kind, "hops": hops}))
    return out


MIX = {("single", 1): 10, ("bridge", 2): 24, ("comparison", 2): 6, ("bridge", 3): 20}


@pytest.mark.parametrize("by, weights, expected", [
    ("hops", None, {"1": 20, "2": 20, "3": 20}),
    ("type", None, {"single": 20, "bridge": 20, "comparison": 20}),
    ("kind", None, {"single-1": 15, "bridge-2": 15, "comparison-2": 15, "bridge-3": 15}),
    ("hops", {"1": 2, "2": 1, "3": 1}, {"1": 30, "2": 15, "3": 15}),
    ("hops", {"1": 1, "2": 1, "3": 0}, {"1": 30, "2": 30}),
])
def test_the_balanced_draw_gives_each_group_its_share(by, weights, expected):
    examples = _examples(MIX)
    order = balanced_draw(examples, by, weights, random.Random(0))
    assert len(order) == len(examples)
    assert Counter(question_group(e.metadata, by) for e in order) == expected
    for g in expected:   # within a group: its whole pool before any repeats
        pool = [e for e in examples if question_group(e.metadata, by) == g]
        seen = Counter(e.source for e in order if question_group(e.metadata, by) == g)
        assert max(seen.values()) - min(seen.get(e.source, 0) for e in pool) <= 1
    epoch = batches(examples, 4, random.Random(0),
                    draw=lambda r: balanced_draw(examples, by, weights, r))
    drawn = [e for mb in epoch for e in mb]
    assert Counter(question_group(e.metadata, by) for e in drawn) == expected


def test_without_a_draw_an_epoch_is_each_episode_once_as_today():
    examples = _examples(MIX)
    epoch = batches(examples, 4, random.Random(3))
    assert sorted(e.source for mb in epoch for e in mb) == sorted(e.source for e in examples)
    assert epoch == batches(examples, 4, random.Random(3), draw=None)


def test_later_epochs_draw_other_episodes_of_a_large_group():
    examples = _examples({("single", 1): 4, ("bridge", 2): 40})
    rng = random.Random(1)
    seen = Counter()
    for _ in range(4):   # 22 of 40 bridges an epoch: over 4 epochs nearly all of them
        seen.update(e.source for e in balanced_draw(examples, "hops", None, rng)
                    if e.metadata["hops"] == 2)
    assert len(seen) >= 36


@settings(max_examples=200, deadline=None)
@given(sizes=st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 50), min_size=1),
       total=st.integers(0, 500), data=st.data())
def test_quotas_sum_to_the_draw_and_follow_the_weights(sizes, total, data):
    weights = data.draw(st.none() | st.fixed_dictionaries(
        {g: st.floats(0, 10) for g in sizes}).filter(lambda w: sum(w.values()) > 0))
    q = group_quotas(sizes, total, weights)
    assert sum(q.values()) == total and set(q) == set(sizes)
    shares = weights or {g: 1.0 for g in sizes}
    norm = sum(shares.values())
    for g in sizes:
        assert abs(q[g] - total * shares[g] / norm) < 1
        if shares[g] == 0:
            assert q[g] == 0


def test_group_labels_and_weights_are_checked():
    assert question_group({"type": "bridge", "hops": 3}, "kind") == "bridge-3"
    assert question_group({"type": "bridge", "hops": 3}, "hops") == "3"
    assert question_group(None, "type") == "-" and question_group({"hops": True}, "hops") == "-"
    examples = _examples(MIX)
    assert check_balance(examples, "hops", None) == {"1": 10, "2": 30, "3": 20}
    with pytest.raises(ConfigError, match="no episode is 4; no weight for 3"):
        check_balance(examples, "hops", {"1": 1, "2": 1, "4": 1})
    with pytest.raises(ConfigError, match="every weight is 0"):
        check_balance(examples, "hops", {"1": 0, "2": 0, "3": 0})
    # a hop count written as text would be drawn with the unlabelled episodes: refused,
    # by the episode's file and line; drawing by type does not read it
    odd = [*examples[:3], SFTExample([1, 2], [0, 1], "oracle.jsonl:7", {"type": "bridge",
                                                                         "hops": "2"})]
    for by in ("hops", "kind"):
        with pytest.raises(DataError, match=r"oracle.jsonl:7: field 'metadata.hops': .*'2'"):
            check_balance(odd, by, None)
    assert check_balance(odd, "type", None) == {"single": 3, "bridge": 1}
    assert check_balance(examples[:3] + [SFTExample([1], [1], "x:1", {"hops": None})],
                         "hops", None) == {"1": 3, "-": 1}


def test_the_config_keys():
    cfg = SFTConfig(data="x.jsonl")
    assert cfg.plan_weight == 1.0 and cfg.balance_types is None and cfg.type_weights is None
    cfg = SFTConfig(data="x.jsonl", balance_types="hops", type_weights={1: 2, 2: 1, 3: 1})
    assert cfg.type_weights == {"1": 2.0, "2": 1.0, "3": 1.0}   # YAML's int keys read as labels
    for bad in ({"plan_weight": -1}, {"type_weights": {"1": 1}},
                {"balance_types": "hops", "type_weights": {"1": -1}},
                {"balance_types": "colour"}):
        with pytest.raises(ValueError):
            SFTConfig(data="x.jsonl", **bad)


# --- in a run -------------------------------------------------------------------------

def _sft(world, out, **keys):
    return SFTConfig(**{"data": str(world["oracle"]), "out": str(out), "max_steps": 2,
                        "batch_size": 2, "grad_accum": 2, "max_info_tokens": 64,
                        "save_every": 1, "keep_last": 1,
                        "optim": {"lr": 1e-3, "warmup_steps": 1}, **keys})


def test_a_weighted_balanced_run_logs_the_plan_and_resumes_exactly(world, tiny, tmp_path,
                                                                    monkeypatch):
    """plan_weight and balance_types in a run: the plan's own loss logged beside the
    weighted one; stopped after step 1 and resumed, the same weights as a straight run."""
    import seekrl.recipes.sft as sft_module
    from seekrl.recipes.setup import Interrupted

    model, tok = tiny
    keys = {"plan_weight": 5.0, "balance_types": "hops", "max_steps": 3}
    straight = run_sft(_sft(world, tmp_path / "a", **keys), model=copy.deepcopy(model),
                       tokenizer=tok)
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all({"plan_loss", "token_loss"} <= set(r) for r in rows)
    real, calls = sft_module.sft_loss, []

    def stop_in_step_2(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sft_module, "sft_loss", stop_in_step_2)
    with pytest.raises(Interrupted):
        run_sft(_sft(world, tmp_path / "b", **keys), model=copy.deepcopy(model), tokenizer=tok)
    monkeypatch.setattr(sft_module, "sft_loss", real)
    resumed = run_sft(_sft(world, tmp_path / "b", **keys), model=copy.deepcopy(model),
                      tokenizer=tok, resume=True)
    from seekrl.models import load_policy
    a, b = load_policy(straight["final"])[0], load_policy(resumed["final"])[0]
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    assert [json.loads(x)["loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text()
            .splitlines()] == [r["loss"] for r in rows]


def test_resume_refuses_episodes_labelled_otherwise_when_drawn_by_them(world, tiny, tmp_path,
                                                                       monkeypatch):
    """The resume's digest covered the episodes' tokens only: the same file with its hops
    labels changed resumed, and the balanced draw then picked other episodes than a
    straight run."""
    import seekrl.recipes.sft as sft_module
    from seekrl.recipes.setup import Interrupted

    model, tok = tiny
    data = tmp_path / "oracle.jsonl"
    data.write_text(world["oracle"].read_text())
    keys = {"balance_types": "hops", "max_steps": 3, "data": str(data)}
    restore = interrupt_at_call(monkeypatch, sft_module, "sft_loss", 3)   # in step 2
    with pytest.raises(Interrupted):
        run_sft(_sft(world, tmp_path / "b", **keys), model=copy.deepcopy(model), tokenizer=tok)
    restore()
    records = [json.loads(x) for x in data.read_text().splitlines()]
    for r in records:   # the same turns, the hops relabelled
        r["metadata"]["hops"] = 5 - int(r["metadata"]["hops"]) if int(
            r["metadata"]["hops"]) in (2, 3) else r["metadata"]["hops"]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ConfigError, match="hops labels .* differ"):
        run_sft(_sft(world, tmp_path / "b", **keys), model=copy.deepcopy(model),
                tokenizer=tok, resume=True)


def test_resume_refuses_changed_plan_weight_and_balance(world, tiny, tmp_path):
    """The new keys change what is trained: --resume with another value is refused,
    naming the key."""
    model, tok = tiny
    out = tmp_path / "r"
    run_sft(_sft(world, out), model=copy.deepcopy(model), tokenizer=tok)
    for keys, named in [({"plan_weight": 2.0}, "plan_weight: 1.0 -> 2.0"),
                        ({"balance_types": "hops"}, "balance_types: None -> 'hops'"),
                        ({"balance_types": "hops", "type_weights": {"1": 1, "2": 1, "3": 1}},
                         "type_weights: ")]:
        with pytest.raises(ConfigError, match="--resume: the run in .* was trained with other "
                           "settings: .*" + named):
            run_sft(_sft(world, out, **keys), model=copy.deepcopy(model), tokenizer=tok,
                    resume=True)
    # a run saved before the keys existed resumes at their defaults, not at others
    import yaml
    saved = yaml.safe_load((out / "config.yaml").read_text())
    for key in ("plan_weight", "balance_types", "type_weights"):
        del saved[key]
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match="plan_weight: None -> 2.0"):
        run_sft(_sft(world, out, plan_weight=2.0), model=copy.deepcopy(model), tokenizer=tok,
                resume=True)
    done = run_sft(_sft(world, out, max_steps=2), model=copy.deepcopy(model), tokenizer=tok,
                   resume=True)
    assert done["steps"] == 2


def test_plan_weight_on_episodes_without_a_plan_is_refused(world, tiny, tmp_path):
    model, tok = tiny
    rec = json.loads(world["oracle"].read_text().splitlines()[0])
    rec["oracle_complete"] = True
    first = rec["turns"][0]["content"]
    rec["turns"][0]["content"] = first.replace(first.split(PLAN_LEAD)[1].split(". ")[0] + ". ",
                                               "").replace(PLAN_LEAD, "")
    data = tmp_path / "noplan.jsonl"
    data.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ConfigError, match="no episode .* states a lookup plan"):
        run_sft(_sft(world, tmp_path / "o", data=str(data), plan_weight=3.0),
                model=copy.deepcopy(model), tokenizer=tok)


def test_sft_curve_passes_the_keys_and_keeps_their_points_apart():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from sft_curve import _sft_keys, _tag

    keys = _sft_keys(["plan_weight=10", "balance_types=hops", "type_weights={1: 2, 2: 1, 3: 1}"])
    assert keys == {"plan_weight": 10, "balance_types": "hops",
                    "type_weights": {"1": 2, "2": 1, "3": 1}}   # as point.json keeps them
    assert _tag(keys) == "-plan_weight=10-balance_types=hops-type_weights=1:2,2:1,3:1"
    assert _tag({}) == ""   # the recipe as it is: today's folders
    SFTConfig(data="x.jsonl", **keys)
    with pytest.raises(SystemExit, match="expected KEY=VALUE"):
        _sft_keys(["plan_weight"])


def test_sft_curve_keeps_a_judgement_and_turn_limit_apart_and_writes_their_oracle_once(
        tmp_path):
    """`--judge ordered` and `--max-new-tokens` are part of a point's settings (its folder and
    `settings`), the default leaves today's folders; the ordered judgement is refused at a
    turn limit that would cut its comparisons; its oracle episodes are written once."""
    import argparse
    import sys
    from pathlib import Path

    from conftest import build_world_and_index

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from sft_curve import _oracle, _tag, _variant

    from seekrl.recipes.pipeline import DemoConfig

    assert _variant("values", None) == {}
    variant = _variant("ordered", 160)
    assert variant == {"judge": "ordered", "max_new_tokens": 160}
    assert _tag({"plan_weight": 10, **variant}) == "-plan_weight=10-judge=ordered-max_new_tokens=160"
    with pytest.raises(SystemExit, match="--max-new-tokens 160"):
        _variant("ordered", None)
    with pytest.raises(SystemExit, match="--max-new-tokens 160"):
        _variant("ordered", 128)

    _, paths, index_dir = build_world_and_index(tmp_path / "world", seed=5, difficulty="medium",
                                                entities=200, n_train=40, n_dev=4, n_test=4)
    demo = DemoConfig(rollout={"max_new_tokens": 160})
    assert (demo.rollout.topk, demo.rollout.max_info_tokens) == (2, 256)   # the demo's still
    args = argparse.Namespace(judge="values", work_dir=tmp_path)
    assert _oracle(args, demo, tmp_path / "world", index_dir) == tmp_path / "oracle_train.jsonl"
    args.judge = "ordered"
    out = _oracle(args, demo, tmp_path / "world", index_dir)
    assert out == tmp_path / "oracle_train-judge=ordered.jsonl"
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(episodes) == 40
    assert any("From smallest to largest: " in e["turns"][-1]["content"] for e in episodes)
    out.write_text("kept\n")   # written once: a second call reads what is there
    assert _oracle(args, demo, tmp_path / "world", index_dir).read_text() == "kept\n"


def test_sft_curve_report_reads_the_points_of_the_questions_asked(tmp_path, capsys):
    """--on dev points (point-dev.json) and test points sit in the same folders; each
    report reads its own, with the hop decision per type."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from sft_curve import _report

    def point(on, em):
        return {"steps": 50, "em": em, "f1": em, "valid_format": 1.0, "searches": 2.0,
                "minutes": 1.0, "n_test": 100, "em_by_type": {"bridge": em},
                "searches_by_type": {"bridge": 2.1}, "planned_by_type": {"bridge": 1.9},
                "on": on}

    (tmp_path / "sft-50").mkdir()
    (tmp_path / "sft-50" / "point.json").write_text(json.dumps(point("test", 0.3)))
    (tmp_path / "sft-50" / "point-dev.json").write_text(json.dumps(point("dev", 0.4)))
    _report(tmp_path, 0.0, "float32", None, "dev")
    out = capsys.readouterr().out
    assert "em_sft50=0.4000" in out and "searches_sft50_bridge=2.10" in out
    assert "planned_sft50_bridge=1.90" in out and "on 100 dev questions" in out
    assert (tmp_path / "sft_curve-dev.png").is_file()
    _report(tmp_path, 0.0, "float32", None, "test")
    assert "em_sft50=0.3000" in capsys.readouterr().out
