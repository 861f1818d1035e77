"""The process reward model: it reads each step at its last token, batched scoring equals
scoring one prefix at a time, its losses fall on a fixed batch, the quality figures, and the
train -> save -> load -> score round trip on labels from the MCTS."""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import replace
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seekrl.agent.trajectory import Trajectory
from seekrl.config import LabelConfig, PRMConfig
from seekrl.errors import DataError
from seekrl.recipes.labels import LabelSet, PairLabel, PointLabel, read_labels
from seekrl.recipes.mcts import run_labelling
from seekrl.recipes.prm import (
    auc,
    pairwise_loss,
    pointwise_loss,
    prm_metrics,
    train_prm,
)
from seekrl.rewards.prm import (
    PRM_MARKER,
    PRMScorer,
    ProcessRewardModel,
    load_scorer,
    prm_folder,
)
from tests.test_mcts import OPTIONS, Dice, dice_engine, questions
from tests.test_rollout import Docs


@pytest.fixture(scope="module")
def episodes(tiny):
    _, tok = tiny
    trajs = [t for t in dice_engine(tok, seed=3).run(questions(8)) if len(t.steps) >= 2]
    assert len(trajs) >= 2      # the seed is fixed: this holds, or the engine changed
    return trajs


def random_prm(model, seed: int = 0) -> ProcessRewardModel:
    prm = ProcessRewardModel(copy.deepcopy(model))
    torch.manual_seed(seed)
    torch.nn.init.normal_(prm.head.weight, std=1.0)
    return prm.eval()


def test_head_reads_the_step_end_token(tiny, episodes):
    model, tok = tiny
    scorer = PRMScorer(random_prm(model), tok)
    t = episodes[0]
    base = scorer.logits([t])[0]
    s0 = t.steps[0]
    after = replace(t, token_ids=list(t.token_ids))
    after.token_ids[s0.end] = (after.token_ids[s0.end] + 7) % len(tok)   # first token after it
    moved = scorer.logits([after])[0]
    assert moved[0] == pytest.approx(base[0], abs=1e-6)      # step 0 never sees what follows
    at_end = replace(t, token_ids=list(t.token_ids))
    at_end.token_ids[s0.end - 1] = (at_end.token_ids[s0.end - 1] + 7) % len(tok)
    assert abs(scorer.logits([at_end])[0][0] - base[0]) > 1e-6  # its own last token counts


def test_batched_scores_equal_one_prefix_at_a_time(tiny, episodes):
    model, tok = tiny
    scorer = PRMScorer(random_prm(model), tok, batch_size=3)
    together = scorer.logits(episodes)
    for t, row in zip(episodes, together):
        assert len(row) == len(t.steps)
        for i, s in enumerate(t.steps):
            prefix = replace(t, token_ids=t.token_ids[:s.end], loss_mask=t.loss_mask[:s.end],
                             steps=t.steps[:i + 1])
            assert scorer.logits([prefix])[0][i] == pytest.approx(row[i], abs=1e-4)


def test_bf16_mixed_scorer_casts_weights_once_and_keeps_the_scores(tiny, episodes):
    """A `dtype: bf16-mixed` run scores under autocast with the weights cast once a call:
    the same bits as autocast alone, near float32's, and the float32 weights back after."""
    from seekrl.models import mixed_precision

    model, tok = tiny
    prm = random_prm(model)
    full = PRMScorer(prm, tok, batch_size=3).score_steps(episodes)
    mixed = copy.deepcopy(prm)
    mixed_precision(mixed.lm)
    weights = {n: p.clone() for n, p in mixed.named_parameters()}
    cast = PRMScorer(mixed, tok, batch_size=3).score_steps(episodes)

    class Uncast(PRMScorer):                   # autocast, every weight cast on every forward
        def _rows(self, trajectories, *, probabilities):
            with mock.patch("seekrl.rewards.prm.cast_weights", contextlib.nullcontext):
                return super()._rows(trajectories, probabilities=probabilities)

    assert Uncast(mixed, tok, batch_size=3).score_steps(episodes) == cast
    assert all(p.dtype == torch.float32 and torch.equal(p, weights[n])
               for n, p in mixed.named_parameters())
    drift = max(abs(a - b) for ra, rb in zip(cast, full) for a, b in zip(ra, rb))
    assert 0 < drift < 0.05                    # bfloat16 rounding, not another model


def test_losses_fall_on_a_fixed_batch(tiny, episodes):
    model, tok = tiny
    prm = ProcessRewardModel(copy.deepcopy(model)).train()
    pad = tok.pad_token_id
    points = [PointLabel(t, i, float(i % 2)) for t in episodes for i in range(len(t.steps))]
    pairs = [PairLabel(episodes[0], episodes[1], 0, 1.0)]
    opt = torch.optim.Adam(prm.parameters(), lr=1e-2)
    first = None
    for _ in range(15):
        loss = pointwise_loss(prm, points, pad, "cpu") + pairwise_loss(prm, pairs, pad, "cpu")
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.7 * first


def test_auc_and_quality_figures(tiny, episodes):
    assert auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    assert auc([0.5, 0.5], [True, False]) == 0.5 and auc([1.0], [True]) is None
    model, tok = tiny

    class Fixed:   # scores: 0.9 on step 0, 0.2 later
        def score_steps(self, trajs):
            return [[0.9] + [0.2] * (len(t.steps) - 1) for t in trajs]

        def logits(self, trajs):
            return self.score_steps(trajs)

    labelled = []
    for t in episodes[:2]:
        t = Trajectory.from_dict(t.to_dict())
        for i, s in enumerate(t.steps):
            s.value = 1.0 if i == 0 else 0.0
        labelled.append(t)
    labels = LabelSet([PointLabel(t, i, t.steps[i].value) for t in labelled
                       for i in range(len(t.steps))], [], labelled)
    m = prm_metrics(Fixed(), labels)
    assert m["auc"] == 1.0 and m["first_error_accuracy"] == 1.0
    assert m["first_error_baseline"] == 0.0      # truth: the second step, in both episodes


def test_train_save_load_score_on_mcts_labels(tiny, tmp_path):
    model, tok = tiny
    summary = run_labelling(
        LabelConfig(data="unused", out=str(tmp_path / "labels"),
                    search={"simulations": 6, "expansions": 3, "min_visits": 1, "min_gap": 0.01},
                    rollout={"max_turns": 3}),
        backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(), questions=questions(6))
    assert summary["pairs"] > 0
    labels = read_labels([tmp_path / "labels"])
    # MCTS nodes shared by several labelled paths count once
    node_count = sum(1 for _ in open(tmp_path / "labels" / "nodes.jsonl"))
    assert 0 < len(labels.points) <= node_count - 6
    cfg = PRMConfig(labels=str(tmp_path / "labels"), out=str(tmp_path / "prm"), steps=4,
                    batch_size=4, dev_share=0.3, save_every=1, keep_last=2, eval_every=2)
    result = train_prm(cfg, model=copy.deepcopy(model), tokenizer=tok)
    # checkpoints along the way (the newest two kept), each a PRM the scorer loads
    saved = sorted(p.name for p in (tmp_path / "prm" / "checkpoints").iterdir())
    assert saved == ["latest", "step-2", "step-3"]
    assert (tmp_path / "prm" / "checkpoints" / "latest").read_text() == "step-3"
    saved = saved[1:]
    assert load_scorer(tmp_path / "prm" / "checkpoints" / "step-3").score_steps(
        labels.episodes[:1])[0]
    # and each names its labels like final/ does (so a benchmark can count their tokens),
    # with the held-out figures of its step where that step was evaluated
    marks = {s: json.loads((tmp_path / "prm" / "checkpoints" / s / PRM_MARKER).read_text())
             for s in saved}
    assert all(m["labels"] == [str(tmp_path / "labels")] for m in marks.values())
    # the threshold its held-out figures were taken at, for `seekrl prm eval` to reuse
    final_mark = json.loads((tmp_path / "prm" / "final" / PRM_MARKER).read_text())
    assert final_mark["threshold"] == marks["step-2"]["threshold"] == cfg.threshold
    assert set(marks["step-2"]["dev"]) >= {"points", "pairs"} and "dev" not in marks["step-3"]
    assert result["train_points"] > 0 and set(result["dev"]) >= {"points", "pairs"}
    scorer = load_scorer(result["final"])
    # the run folder names its final PRM too
    assert prm_folder(tmp_path / "prm") == tmp_path / "prm" / "final"
    trajs = [t for t in labels.episodes[:3]]
    scores = scorer.score_steps(trajs)
    assert [len(r) for r in scores] == [len(t.steps) for t in trajs]
    assert all(0.0 < v < 1.0 for r in scores for v in r)
    with pytest.raises(FileNotFoundError, match="not a process reward model"):
        load_scorer(tmp_path / "labels")
    from seekrl.config import ConfigError
    with pytest.raises(ConfigError, match="already holds a run .* --overwrite"):
        train_prm(cfg, model=copy.deepcopy(model), tokenizer=tok)   # never silently replaced


def test_loading_and_saving_print_no_third_party_progress_bars(tiny, tmp_path, capfd):
    from seekrl.models import load_policy
    from seekrl.recipes.checkpoint import save_policy

    model, tok = tiny
    save_policy(model, tok, tmp_path / "m")
    load_policy(str(tmp_path / "m"))
    save_policy(model, tok, tmp_path / "m")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert "Writing model shards" not in captured.err + captured.out


def test_a_saved_policy_is_flushed_before_its_rename(tiny, tmp_path, monkeypatch):
    """final/ and best/ are flushed to disk before they take their name, and the rename
    after, as checkpoints are (a power cut left a named folder of unwritten files)."""
    import os

    from seekrl.recipes import checkpoint

    model, tok = tiny
    flushed, renamed = [], []
    real_fsync, real_replace = os.fsync, checkpoint.replace_dir
    monkeypatch.setattr(os, "fsync", lambda fd: flushed.append(
        os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    monkeypatch.setattr(checkpoint, "replace_dir", lambda tmp, target: renamed.append(
        len(flushed)) or real_replace(tmp, target))
    checkpoint.save_policy(model, tok, tmp_path / "final")
    before = flushed[:renamed[0]]
    assert any(f.endswith("model.safetensors") for f in before)
    assert any(f.endswith("tokenizer.json") or f.endswith("tokenizer_config.json")
               for f in before)
    assert flushed[-1] == str(tmp_path)   # the folder that holds the new name


def test_rollouts_of_one_question_share_the_prompt_pass(tiny, monkeypatch):
    from seekrl.agent.rollout import RolloutConfig, RolloutEngine
    from seekrl.rewards import prm as prm_module

    model, tok = tiny
    engine = RolloutEngine(Dice(tok, OPTIONS), tok, Docs(), RolloutConfig(max_turns=3,
                                                                          n_samples=3, seed=2))
    group = engine.run(questions(2))               # 2 questions x 3 rollouts
    scorer = PRMScorer(random_prm(model), tok, batch_size=6)
    calls = []
    real = prm_module.suffix_hidden
    monkeypatch.setattr(prm_module, "suffix_hidden",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    together = scorer.logits(group)
    assert calls                                   # the shared-prompt path ran
    for t, row in zip(group, together):
        alone = scorer.logits([t])[0]
        assert row == pytest.approx(alone, abs=1e-4)



def test_an_empty_first_turn_is_read_where_it_is_when_rows_share_a_prompt(tiny):
    """Old data's empty turn is read before the first policy token, inside the prompt the
    shared pass runs once: it was read at a negative suffix index (a token at the end)."""
    from seekrl.agent.rollout import RolloutConfig, RolloutEngine

    model, tok = tiny
    engine = RolloutEngine(Dice(tok, OPTIONS), tok, Docs(), RolloutConfig(max_turns=3, seed=2))
    t = next(t for t in engine.run(questions(4)) if len(t.steps) >= 2)
    first = t.steps[0]
    old = copy.deepcopy(t)                  # turn 0 written without its tokens
    old.steps[0] = replace(first, end=first.start)
    old.loss_mask = [0 if first.start <= i < first.end else m for i, m in enumerate(t.loss_mask)]
    scorer = PRMScorer(random_prm(model), tok, batch_size=4)
    alone = scorer.logits([old])[0]
    for row in scorer.logits([old, copy.deepcopy(old)]):
        assert row == pytest.approx(alone, abs=1e-4)

# ---------------------------------------------------------------- reading label folders
@pytest.fixture(scope="module")
def label_dir(tiny, tmp_path_factory):
    _, tok = tiny
    out = tmp_path_factory.mktemp("labels") / "labels"
    summary = run_labelling(
        LabelConfig(data="unused", out=str(out),
                    search={"simulations": 6, "expansions": 3, "min_visits": 1, "min_gap": 0.01},
                    rollout={"max_turns": 3}),
        backend=Dice(tok, OPTIONS), tokenizer=tok, retriever=Docs(), questions=questions(4))
    assert summary["pairs"] > 0
    return out


def _copy_labels(src, dst, progress: bool = True):
    import shutil
    shutil.copytree(src, dst)
    if not progress:
        (dst / "progress.json").unlink()
    return dst


def test_labels_are_read_up_to_the_recorded_bytes(label_dir, tmp_path, caplog):
    """A killed `seekrl mcts` may leave half a chunk after what progress.json records: it is
    not read (a torn last line would otherwise be a parse error, a whole one a label), and
    what is left out is said."""
    import json
    import logging

    whole = read_labels([label_dir])
    with pytest.raises(ValueError, match="is listed twice"):   # its labels would count twice
        read_labels([label_dir, label_dir / ".." / label_dir.name])
    d = _copy_labels(label_dir, tmp_path / "l")
    first_label = (d / "labels.jsonl").read_text().splitlines()[0]
    first_pair = (d / "pairs.jsonl").read_text().splitlines()[0]
    with open(d / "labels.jsonl", "a") as f:
        f.write(first_label.replace('"q0"', '"q-extra"') + "\n" + first_label[:40])
    with open(d / "pairs.jsonl", "a") as f:
        f.write(first_pair + "\n")
    with caplog.at_level(logging.WARNING, logger="seekrl"):
        got = read_labels([d])
    assert "labels.jsonl: reading the first" in caplog.text and "are left out" in caplog.text
    assert (len(got.points), len(got.pairs), len(got.episodes)) == \
        (len(whole.points), len(whole.pairs), len(whole.episodes))
    assert all(e.example_id != "q-extra" for e in got.episodes)
    (d / "labels.jsonl").write_bytes((d / "labels.jsonl").read_bytes()[:50])
    with pytest.raises(DataError, match="recorded as written"):
        read_labels([d])
    # a recorded count that is no count of bytes is a damaged progress.json, not "read 0"
    progress = json.loads((d / "progress.json").read_text())
    for bad in (-5, 10.7, "12", True, None):
        progress["bytes"]["labels.jsonl"] = bad
        (d / "progress.json").write_text(json.dumps(progress))
        with pytest.raises(DataError, match=r"progress.json: field 'bytes'.*a count of bytes"):
            read_labels([d])


def _set(record: dict, dotted: str, value):
    node = record
    keys = dotted.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is _DELETE:
        del node[last]
    else:
        node[last] = value


_DELETE = object()


@pytest.mark.parametrize("file,path,value,field", [
    ("labels", "steps.0.value", 1.5, "steps.value"),
    ("labels", "steps.0.value", [0.5], "steps.value"),
    ("labels", "steps.0.end", 10**6, "steps"),
    ("labels", "steps.0", "a step", None),
    ("labels", "token_ids.0", -3, "token_ids"),
    ("labels", "metadata", [1], "metadata"),
    ("labels", "metadata.node_ids", [1], "metadata.node_ids"),
    ("labels", "example_id", _DELETE, None),
    ("pairs", "depth", 99, "depth"),
    ("pairs", "depth", "0", "depth"),
    ("pairs", "gap", "big", "gap"),
    ("pairs", "gap", -0.8, "gap"),        # the worse step the better: DPO the wrong way round
    ("pairs", "gap", 0, "gap"),
    ("pairs", "worse.example_id", "another question", "worse.example_id"),
    ("pairs", "better", [1, 2], "better"),
    ("pairs", "worse.steps.0.value", 7, "worse.steps.value"),
    ("pairs", "worse", _DELETE, "worse"),
])
def test_a_malformed_label_record_names_file_line_and_field(label_dir, tmp_path, file, path,
                                                            value, field):
    import json

    d = _copy_labels(label_dir, tmp_path / "l", progress=False)
    lines = (d / f"{file}.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    _set(record, path, value)
    lines[1] = json.dumps(record)
    (d / f"{file}.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as err:
        read_labels([d])
    assert f"{file}.jsonl:2:" in str(err.value)
    if field is not None:
        assert err.value.field == field


def test_pairs_that_are_not_siblings_are_refused(label_dir, tmp_path):
    import json

    d = _copy_labels(label_dir, tmp_path / "l", progress=False)
    lines = (d / "pairs.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["worse"]["token_ids"][0] += 1    # the shared prompt differs
    lines[0] = json.dumps(record)
    (d / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="pairs.jsonl:1: field 'depth': better and worse differ"):
        read_labels([d])


def test_pairs_whose_differing_step_starts_elsewhere_are_refused(label_dir, tmp_path):
    """The same tokens, but the worse episode's steps are laid out differently: the step
    before `depth` (and its retrieved block) ends one token later, so step `depth` starts
    one token later. The layout is valid on its own (the steps tile the tokens, the mask
    follows), but the pair does not compare two choices at one point."""
    import json

    d = _copy_labels(label_dir, tmp_path / "l", progress=False)
    lines = (d / "pairs.jsonl").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)["depth"] >= 1)
    record = json.loads(lines[at])
    worse, depth = record["worse"], record["depth"]
    before, step = worse["steps"][depth - 1], worse["steps"][depth]
    assert step["end"] - step["start"] > 1
    mask = worse["loss_mask"]
    if before.get("info_start") is not None:
        mask[before["info_start"]] = 1     # the block's first token becomes the step's
        mask[before["info_end"]] = 0       # and the block takes the next one
        before["info_start"] += 1
        before["info_end"] += 1
    before["end"] += 1
    step["start"] += 1
    lines[at] = json.dumps(record)
    (d / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=f"pairs.jsonl:{at + 1}: field 'depth': better and "
                                        f"worse differ"):
        read_labels([d])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mangled_label_record_is_read_or_refused_in_one_line(label_dir, tmp_path, data):
    """Whatever a label line holds, reading it either works or raises DataError (with the
    file and line): never another exception from deeper in the code."""
    import json
    import shutil

    d = tmp_path / "mangled"
    shutil.rmtree(d, ignore_errors=True)
    _copy_labels(label_dir, d, progress=False)
    file = data.draw(st.sampled_from(["labels", "pairs"]))
    lines = (d / f"{file}.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    paths = []

    def walk(node, prefix):
        items = node.items() if isinstance(node, dict) else enumerate(node) \
            if isinstance(node, list) else ()
        for k, v in items:
            if isinstance(node, list) and k > 2:
                break
            paths.append(f"{prefix}{k}")
            walk(v, f"{prefix}{k}.")

    walk(record, "")
    _set(record, data.draw(st.sampled_from(paths)), data.draw(json_values))
    lines[0] = json.dumps(record)
    (d / f"{file}.jsonl").write_text("\n".join(lines) + "\n")
    try:
        read_labels([d])
    except DataError as err:
        assert f"{file}.jsonl:1:" in str(err)


def test_labels_remember_their_tokenizer_and_refuse_another(tiny, label_dir, tmp_path):
    """Labels are token ids: the PRM's backbone (and a resumed labelling) must read them
    with the tokenizer that wrote them."""
    import json

    from seekrl.config import ConfigError
    from seekrl.models import tokenizer_fingerprint
    from seekrl.recipes.labels import LabelWriter, check_label_tokenizer, labelling_policy

    model, tok = tiny
    progress = json.loads((label_dir / "progress.json").read_text())
    assert progress["tokenizer"] == tokenizer_fingerprint(tok)
    other = copy.deepcopy(tok)
    other.add_tokens(["<not-in-the-policy>"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tok)
    check_label_tokenizer([label_dir], tok, "model m")           # the same: passes
    with pytest.raises(ConfigError, match="model m: its tokenizer .* not the one that wrote"):
        check_label_tokenizer([label_dir], other, "model m")
    with pytest.raises(ConfigError, match="not the one that wrote"):
        train_prm(PRMConfig(labels=str(label_dir), out=str(tmp_path / "prm"), steps=1),
                  model=copy.deepcopy(model), tokenizer=other)
    # a PRM scoring the policy's episodes (RL's reward.prm, RFT's filter) shares its tokenizer
    from types import SimpleNamespace

    from seekrl.rewards.prm import check_scorer_tokenizer
    check_scorer_tokenizer(SimpleNamespace(tokenizer=tok), tok, "reward.prm p")
    check_scorer_tokenizer(SimpleNamespace(), tok, "a test's scorer")
    with pytest.raises(ConfigError, match="reward.prm p: the PRM has another tokenizer"):
        check_scorer_tokenizer(SimpleNamespace(tokenizer=other), tok, "reward.prm p")
    d = _copy_labels(label_dir, tmp_path / "l")
    with pytest.raises(ValueError, match="another tokenizer"):
        LabelWriter(d, resume=True).check_tokenizer(tokenizer_fingerprint(other))
    # the PRM's default backbone is the policy that wrote the labels
    assert PRMConfig(labels=str(d)).model is None
    assert labelling_policy([d]) == "smollm2-135m"
    (d / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="model: the backbone"):
        labelling_policy([d])


def test_label_warnings_say_what_the_labels_leave_out():
    """Training `both` on labels without pairs, or measuring on an empty dev split, is said
    (it trained on 0 pairs with `auc None` and no word)."""
    from seekrl.recipes.labels import LabelSet
    from seekrl.recipes.prm import label_warnings

    point, pair = object(), object()
    full = LabelSet(points=[point], pairs=[pair], episodes=[])
    assert label_warnings("both", full, full) == []
    no_pairs = LabelSet(points=[point], pairs=[], episodes=[])
    assert any("pointwise loss only" in n for n in label_warnings("both", no_pairs, full))
    assert label_warnings("pointwise", no_pairs, full) == []
    empty = LabelSet(points=[], pairs=[], episodes=[])
    assert any("dev split holds no labels" in n for n in label_warnings("pointwise", full, empty))
    only_pairs = LabelSet(points=[], pairs=[pair], episodes=[])
    assert any("no held-out AUC" in n for n in label_warnings("pairwise", full, only_pairs))


def test_a_resumed_prm_run_ends_where_a_straight_one_does(tiny, label_dir, tmp_path,
                                                         monkeypatch):
    """Ctrl-C in step 3 of 4 (checkpoints every step), then --resume: the same weights, the
    same head and the same logged losses and held-out figures as a run that never stopped."""
    import seekrl.recipes.prm as prm_module
    from seekrl.config import ConfigError
    from seekrl.models import load_policy
    from seekrl.recipes.setup import Interrupted

    model, tok = tiny

    def cfg(out):
        return PRMConfig(labels=str(label_dir), out=str(tmp_path / out), steps=4,
                         batch_size=4, dev_share=0.3, save_every=1, keep_last=1,
                         eval_every=2, optim={"lr": 1e-3, "warmup_steps": 1})

    straight = train_prm(cfg("a"), model=copy.deepcopy(model), tokenizer=tok)
    real, calls = prm_module.pointwise_loss, []

    def stop_in_step_3(*a, **k):
        calls.append(1)
        if len(calls) == 3:   # one pointwise batch a step
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(prm_module, "pointwise_loss", stop_in_step_3)
    with pytest.raises(Interrupted) as err:
        train_prm(cfg("b"), model=copy.deepcopy(model), tokenizer=tok)
    ckpt = tmp_path / "b" / "checkpoints" / "step-2"
    assert err.value.done == 2 and err.value.checkpoint == ckpt
    assert err.value.message("seekrl prm train out=b").endswith(
        "continue from it with: seekrl prm train out=b --resume")
    assert (ckpt / "state.pt").is_file() and load_scorer(ckpt).score_steps(
        read_labels([label_dir]).episodes[:1])[0]   # a checkpoint is a PRM as it is
    monkeypatch.setattr(prm_module, "pointwise_loss", real)
    with pytest.raises(ConfigError, match="already holds a run .*--resume"):
        train_prm(cfg("b"), model=copy.deepcopy(model), tokenizer=tok)
    with pytest.raises(ConfigError, match="not both"):
        train_prm(cfg("b"), model=copy.deepcopy(model), tokenizer=tok, resume=True,
                  overwrite=True)
    # other training labels (here another dev split) would be sampled otherwise: refused
    other = cfg("b").model_copy(update={"dev_share": 0.5})
    logged = (tmp_path / "b" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="other training labels than the run in"):
        train_prm(other, model=copy.deepcopy(model), tokenizer=tok, resume=True)
    assert (tmp_path / "b" / "metrics.jsonl").read_text() == logged   # refused untouched
    # a rate the checkpoint's optimizer state would put back (and config.yaml then record
    # as trained with): refused
    faster = cfg("b").model_copy(update={"head_lr_factor": 3.0})
    with pytest.raises(ConfigError, match=r"--resume: .*head_lr_factor: 10\.0 -> 3\.0"):
        train_prm(faster, model=copy.deepcopy(model), tokenizer=tok, resume=True)
    assert (tmp_path / "b" / "metrics.jsonl").read_text() == logged
    # other batches or a longer schedule were only warned about, and config.yaml rewritten
    # with them: refused, the record kept
    saved = (tmp_path / "b" / "config.yaml").read_text()
    for change in ({"batch_size": 2}, {"steps": 6}, {"loss": "pointwise"}):
        with pytest.raises(ConfigError, match="was trained with other settings: "
                                              f"{next(iter(change))}: "):
            train_prm(cfg("b").model_copy(update=change), model=copy.deepcopy(model),
                      tokenizer=tok, resume=True)
    assert (tmp_path / "b" / "config.yaml").read_text() == saved
    resumed = train_prm(cfg("b"), model=copy.deepcopy(model), tokenizer=tok, resume=True)
    # the held-out figures before training, measured before the stop, are still reported
    assert resumed["dev_at_start"] == straight["dev_at_start"] and straight["dev_at_start"]
    a, b = load_policy(straight["final"])[0], load_policy(resumed["final"])[0]
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    head = [torch.load(tmp_path / run / "final" / "prm_head.pt") for run in ("a", "b")]
    assert all(torch.equal(head[0][k], head[1][k]) for k in head[0])
    assert resumed["dev"] == straight["dev"]

    def log(out):
        return [json.loads(x) for x in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in log("b")] == \
        [{k: v for k, v in r.items() if k not in drop} for r in log("a")]
    with pytest.raises(ConfigError, match="no PRM checkpoint"):
        train_prm(cfg("c"), model=copy.deepcopy(model), tokenizer=tok, resume=True)
