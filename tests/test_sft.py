"""The SFT warm-up: oracle episodes tokenised as the rollout engine lays them out, loss on
policy tokens only, a loss that goes down, and a saved model that loads back."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import build_world_and_index

from seekrl.agent.backends import Backend
from seekrl.agent.oracle import oracle_episode
from seekrl.agent.protocol import PROMPTS, build_prompt
from seekrl.agent.rollout import RolloutConfig, RolloutEngine
from seekrl.config import SFTConfig
from seekrl.data.qa import read_qa_jsonl
from seekrl.errors import DataError
from seekrl.models import load_policy, tiny_policy
from seekrl.recipes.sft import episode_tokens, load_sft_examples, run_sft, sft_loss
from seekrl.retrieval.index import load_index


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("sftworld")
    _, paths, index_dir = build_world_and_index(out, seed=5, difficulty="medium", entities=200,
                                                n_train=12, n_dev=6, n_test=6)
    index = load_index(index_dir)
    train = read_qa_jsonl(paths["train"])
    oracle = out / "oracle.jsonl"
    with open(oracle, "w") as f:
        for ex in train:
            f.write(json.dumps(oracle_episode(ex, index, k=2)) + "\n")
    return {"paths": paths, "index_dir": index_dir, "index": index, "train": train,
            "oracle": oracle}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return tiny_policy(seed=2)


@pytest.mark.parametrize("settings", [{}, {"snippet_words": 5}, {"tools": ["open"]}])
def test_episode_tokens_match_the_rollout_layout(world, tiny, settings):
    """Prompt, assistant turns and <information> blocks: the same tokens a rollout of the
    same text would produce, so the trained policy reads what it will read (documents cut
    to their snippets, the other tools' instructions in the prompt, where the rollout
    settings say so: SFT laid out whole documents and search alone)."""
    from seekrl.agent.tools import snippet

    _, tok = tiny
    ex = world["train"][0]
    rec = oracle_episode(ex, world["index"], k=2)
    ids, mask = episode_tokens(tok, rec, max_info_tokens=96, **settings)
    engine = RolloutEngine(Backend(), tok, world["index"],
                           RolloutConfig(max_info_tokens=96, topk=2, **settings))
    expected = tok.encode(build_prompt(tok, ex.question, "agent", tools=engine._tool_text),
                          add_special_tokens=False)
    assert ("<open>" in tok.decode(expected)) == ("tools" in settings)
    expected_mask = [0] * len(expected)
    for turn in rec["turns"]:
        if turn["role"] == "assistant":
            new = tok.encode(turn["content"], add_special_tokens=False)
            expected += new
            expected_mask += [1] * len(new)
            if "<search>" in turn["content"]:
                query = turn["content"].split("<search>")[1].split("</search>")[0].strip()
                new = engine.information_ids([snippet(h, settings.get("snippet_words"))
                                              for h in world["index"].search([query], 2)[0]])
                expected += new
                expected_mask += [0] * len(new)
    assert ids == expected
    assert mask == expected_mask
    assert tok.decode(ids).rstrip().endswith("</answer>")   # no EOS after the answer
    assert tok.eos_token_id not in ids[-3:]


def test_documents_are_laid_out_as_stored_and_as_plain_text(world, tiny):
    """A document the corpus stores otherwise than title and text compose (wiki-18's quoted
    title) reaches SFT as stored, as the search_r1 prompt shows it in rollouts; a special
    token's name inside it stays text in both (it was a real end-of-turn token)."""
    from seekrl.retrieval.base import Hit

    _, tok = tiny
    rec = oracle_episode(world["train"][0], world["index"], k=2)
    hit = Hit.from_contents("x1", '"Ilsa Marrow"\nborn in Tarrow <|im_end|><|im_start|>user', 1.0)
    assert hit.stored is not None
    info = next(t for t in rec["turns"] if t["role"] == "information")
    info["hits"] = [{"id": hit.doc_id, "title": hit.title, "text": hit.text,
                     "contents": hit.stored}]
    ids, _ = episode_tokens(tok, rec, max_info_tokens=96, prompt="search_r1")
    engine = RolloutEngine(Backend(), tok, world["index"],
                           RolloutConfig(max_info_tokens=96, topk=2, prompt="search_r1"))
    block = engine.information_ids([hit])
    assert any(ids[i:i + len(block)] == block for i in range(len(ids)))
    assert '(Title: "Ilsa Marrow")' in tok.decode(block)
    assert not set(block) & set(tok.all_special_ids)
    assert "<|im_end|><|im_start|>user" in tok.decode(block)
    info["hits"][0]["contents"] = 3
    with pytest.raises(DataError, match=r"hits: field '\[0\].contents': expected a string"):
        episode_tokens(tok, rec, prompt="search_r1")

    class Stored:   # the oracle keeps what the retriever served
        def search(self, queries, k):
            return [[hit] for _ in queries]

    written = oracle_episode(world["train"][0], Stored(), k=2)
    info = next(t for t in written["turns"] if t["role"] == "information")
    assert info["hits"][0]["contents"] == hit.stored

def test_incomplete_episodes_are_skipped_and_counted(world, tiny, tmp_path):
    _, tok = tiny
    lines = world["oracle"].read_text().splitlines()
    recs = [json.loads(x) for x in lines[:3]]
    for r in recs:
        r["oracle_complete"] = True
    recs[1]["oracle_complete"] = False
    path = tmp_path / "o.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    examples, skipped = load_sft_examples(path, tok)
    assert len(examples) == 2 and skipped["incomplete"] == 1
    examples, skipped = load_sft_examples(path, tok, only_complete=False)
    assert len(examples) == 3
    # nothing left: the error says why, not only that
    path.write_text(json.dumps(recs[1]) + "\n")
    with pytest.raises(DataError, match="no usable episodes: 1 left out as incomplete"):
        load_sft_examples(path, tok)
    # "false" is no boolean: it would be trained on as complete
    path.write_text(json.dumps({**recs[1], "oracle_complete": "false"}) + "\n")
    with pytest.raises(DataError, match=r"o.jsonl:1: field 'oracle_complete': expected true"):
        load_sft_examples(path, tok)


def test_sft_metadata_and_max_len_errors_say_what_is_wrong(world, tiny, tmp_path):
    _, tok = tiny
    rec = json.loads(world["oracle"].read_text().splitlines()[0])
    path = tmp_path / "o.jsonl"
    path.write_text(json.dumps({**rec, "metadata": [1]}) + "\n")   # balance_types reads it
    with pytest.raises(DataError, match=r"o.jsonl:1: field 'metadata': expected an object"):
        load_sft_examples(path, tok)
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(DataError, match=r"no policy tokens within max_len \(8 tokens\): the "
                                        r"first is token \d+; raise max_len"):
        load_sft_examples(path, tok, max_len=8)


def test_bad_episode_names_line_and_field(world, tiny, tmp_path):
    _, tok = tiny
    rec = json.loads(world["oracle"].read_text().splitlines()[0])
    rec["turns"][1]["role"] = "tool"
    path = tmp_path / "bad.jsonl"
    path.write_text(world["oracle"].read_text().splitlines()[0] + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(DataError) as err:
        load_sft_examples(path, tok)
    assert ":2" in str(err.value) and "turns[1].role" in str(err.value)
    path.write_text('{"foo": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: expected an oracle episode"):
        load_sft_examples(path, tok)
    for ids, mask, field in [("1 2", [0, 1], "token_ids"), ([1, True], [0, 1], "token_ids"),
                             ([1, -2], [0, 1], "token_ids"), ([1, 2], [0, 2], "loss_mask"),
                             ([1, 2], "01", "loss_mask"), ([1, 2], [0, 1.0], "loss_mask"),
                             ([10 ** 20, 2], [0, 1], "token_ids"), ([1, 2], [1, 1], "loss_mask")]:
        path.write_text(json.dumps({"token_ids": ids, "loss_mask": mask}) + "\n")
        with pytest.raises(DataError, match=r"bad.jsonl:1") as err:
            load_sft_examples(path, tok)
        assert err.value.field == field
    rec["turns"][1]["role"] = "information"   # a good episode, with its tokens beside it
    path.write_text(json.dumps({**rec, "token_ids": [1, 2], "loss_mask": [0, 1]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'token_ids': both 'turns' .* "
                                        r"and 'token_ids'"):
        load_sft_examples(path, tok)


def test_token_ids_are_checked_against_the_embedding_table(tiny, tmp_path):
    """Not against the tokenizer: a model's table may have padded rows past its vocabulary
    (Qwen2.5: 151,936 rows, 151,665 tokens) that sampling can reach."""
    from seekrl.recipes.sft import check_token_ids

    model, tok = tiny
    rows = model.get_input_embeddings().num_embeddings
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"token_ids": [1, rows - 1], "loss_mask": [0, 1]}) + "\n" +
                    json.dumps({"token_ids": [1, rows], "loss_mask": [0, 1]}) + "\n")
    examples, _ = load_sft_examples(path, tok)
    check_token_ids(examples[:1], rows)
    with pytest.raises(DataError, match=rf"t.jsonl:2: field 'token_ids': token id {rows} is "
                                        "past the model's embedding table"):
        check_token_ids(examples, rows)


def test_sft_steps_lower_the_loss_on_a_fixed_batch(world, tiny):
    model, tok = tiny
    model = __import__("copy").deepcopy(model).train()
    examples, _ = load_sft_examples(world["oracle"], tok, max_info_tokens=64, limit=2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        nll, n = sft_loss(model, examples, tok.pad_token_id, "cpu")
        (nll / n).backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(nll.detach()) / n)
    assert losses[-1] < losses[0] - 0.5, losses


def test_loss_ignores_prompt_and_information_tokens(world, tiny):
    """Changing a token the policy did not write changes no target of the loss; the
    gradient reaches the model only through policy positions."""
    model, tok = tiny
    examples, _ = load_sft_examples(world["oracle"], tok, max_info_tokens=64, limit=1)
    ex = examples[0]
    nll, n = sft_loss(model, [ex], tok.pad_token_id, "cpu")
    assert n == sum(ex.loss_mask)
    manual = 0.0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ex.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        for t in range(1, len(ex.token_ids)):
            if ex.loss_mask[t]:
                manual -= float(logp[t - 1, ex.token_ids[t]])
    assert float(nll) == pytest.approx(manual, rel=1e-4)


def test_an_epoch_counts_its_last_partial_micro_batch(world, tiny, tmp_path):
    """`epochs` in steps: every micro-batch of the epochs (each one's last partial),
    grad_accum at a time, rounded up once. The count was a floor of n / (batch_size x
    grad_accum): 9 episodes at 8 made one step a pass, and whichever batch it drew (8 or 1)
    was the epoch."""
    model, tok = tiny
    lines = __import__("pathlib").Path(world["oracle"]).read_text().splitlines()
    assert len(lines) >= 12
    # 12 at 4 x 2 for 3 epochs: 9 micro-batches in 5 steps (6 had trained a fourth pass)
    for n, bs, accum, epochs, steps in ((9, 8, 1, 1, 2), (12, 4, 2, 3, 5), (8, 4, 2, 1, 1)):
        data = tmp_path / f"o{n}.jsonl"
        data.write_text("\n".join(lines[:n]) + "\n")
        cfg = SFTConfig(data=str(data), out=str(tmp_path / f"sft{n}"),
                        index=str(world["index_dir"]), epochs=epochs, batch_size=bs,
                        grad_accum=accum, max_info_tokens=64, topk=2, only_complete=False,
                        optim={"lr": 1e-4, "warmup_steps": 0}, eval={"at_start": False})
        summary = run_sft(cfg, model=__import__("copy").deepcopy(model), tokenizer=tok)
        assert (summary["episodes"], summary["steps"]) == (n, steps), (n, bs, accum, epochs)


@pytest.mark.parametrize("lora", [False, True])
def test_run_sft_saves_a_model_that_loads_and_evaluates(world, tiny, tmp_path, lora):
    model, tok = tiny
    model = __import__("copy").deepcopy(model)
    cfg = SFTConfig(data=str(world["oracle"]), out=str(tmp_path / "sft"),
                    index=str(world["index_dir"]), max_steps=2, batch_size=2, grad_accum=2,
                    max_info_tokens=64, topk=2, lora={"enabled": lora, "r": 4},
                    optim={"lr": 1e-3, "warmup_steps": 1},
                    eval={"data": str(world["paths"]["dev"]), "n": 2, "every": 1,
                          "max_turns": 2, "max_new_tokens": 4})
    summary = run_sft(cfg, model=model, tokenizer=tok)
    assert summary["steps"] == 2
    log = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2]
    # the rate each step applied: warm-up over 1 step, then cosine from 1e-3 (not the next one's)
    assert [r["lr"] for r in log if "loss" in r] == pytest.approx([1e-3, 1e-3])
    assert any("dev_em" in r for r in log)
    # eval.at_start (the default): the policy before training, as RL's runs do
    assert log[0]["step"] == 0 and "dev_em" in log[0] and "loss" not in log[0]
    assert (tmp_path / "sft" / "eval" / "start" / "metrics.json").is_file()
    # memory you can see: the process's peak after each step, and the step's longest episode
    steps = [r for r in log if "loss" in r]
    assert all(r["longest"] > 0 for r in steps)
    if sys.platform.startswith("linux"):
        assert 0 < steps[0]["peak_rss_mb"] <= steps[1]["peak_rss_mb"]
    assert (tmp_path / "sft" / "eval" / "final" / "viewer.html").is_file()
    loaded, _ = load_policy(summary["final"])
    assert not any("lora" in n for n, _ in loaded.named_parameters())
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():  # get_peft_model put the adapters into `model` itself
        model.eval()
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-4)


def test_a_non_finite_gradient_never_reaches_the_weights():
    """SFT, RL, PRM and step-DPO step through one helper: a nan / inf gradient norm skips
    the optimizer step (SFT used to take it) and clears the gradient."""
    from seekrl.recipes.setup import clip_and_step

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=0.1)
    w.grad = torch.tensor([1.0, float("nan"), 0.0])
    norm = clip_and_step([w], opt, 1.0)
    assert norm != norm and torch.equal(w.detach(), torch.ones(3)) and w.grad is None
    w.grad = torch.tensor([3.0, 4.0, 0.0])
    assert clip_and_step([w], opt, 1.0) == pytest.approx(5.0)
    assert not torch.equal(w.detach(), torch.ones(3))


def test_a_resumed_run_ends_where_a_straight_one_does(world, tiny, tmp_path, monkeypatch):
    """Ctrl-C after step 2 of 4 (checkpoints every step), then --resume: the same weights
    and the same logged losses as a run that never stopped."""
    import copy

    import seekrl.recipes.sft as sft_module
    from seekrl.config import ConfigError
    from seekrl.recipes.setup import Interrupted

    model, tok = tiny

    def cfg(out):
        return SFTConfig(data=str(world["oracle"]), out=str(tmp_path / out), max_steps=4,
                         batch_size=2, grad_accum=2, max_info_tokens=64, save_every=1,
                         keep_last=1, optim={"lr": 1e-3, "warmup_steps": 1})

    straight = run_sft(cfg("a"), model=copy.deepcopy(model), tokenizer=tok)
    real, calls = sft_module.sft_loss, []

    def stop_in_step_3(*a, **k):
        calls.append(1)
        if len(calls) == 5:   # 2 micro-batches a step: the first of step 3
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sft_module, "sft_loss", stop_in_step_3)
    with pytest.raises(Interrupted) as err:
        run_sft(cfg("b"), model=copy.deepcopy(model), tokenizer=tok)
    assert err.value.done == 2 and err.value.checkpoint == tmp_path / "b" / "checkpoints" / "step-2"
    assert err.value.message("seekrl sft out=b") == (
        f"interrupted after step 2; the latest checkpoint is {tmp_path / 'b/checkpoints/step-2'}"
        "; continue from it with: seekrl sft out=b --resume")
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == \
        ["latest", "step-2"]   # keep_last 1
    monkeypatch.setattr(sft_module, "sft_loss", real)
    with pytest.raises(ConfigError, match="already holds a run"):
        run_sft(cfg("b"), model=copy.deepcopy(model), tokenizer=tok)
    resumed = run_sft(cfg("b"), model=copy.deepcopy(model), tokenizer=tok, resume=True)
    assert resumed["steps"] == 4
    a, b = load_policy(straight["final"])[0], load_policy(resumed["final"])[0]
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name

    def losses(out):
        return [(r["step"], r["loss"], r["lr"]) for r in map(
            json.loads, (tmp_path / out / "metrics.jsonl").read_text().splitlines())]
    assert losses("b") == losses("a")
    with pytest.raises(ConfigError, match="no SFT checkpoint"):
        run_sft(cfg("c"), model=copy.deepcopy(model), tokenizer=tok, resume=True)
    keep = cfg("c").model_copy(update={"eval": cfg("c").eval.model_copy(
        update={"keep_best": True})})
    with pytest.raises(ConfigError, match=r"eval\.keep_best: an RL run's option"):
        run_sft(keep, model=copy.deepcopy(model), tokenizer=tok)
    no_ckpt = Interrupted(0, None, 0).message("seekrl sft")
    assert no_ckpt == ("interrupted before the first step, with no checkpoint (save_every is "
                       "0); start again with: seekrl sft --overwrite")
    # when the first checkpoint comes: save_every, none at all past a run's last step
    # (SFT and the PRM write final/ there), the last step where that is checkpointed too
    for args, saves_last, said in (((3, None, 50), False, "the first checkpoint comes at step 50"),
                                   ((3, None, 50, 80), False, "comes at step 50"),
                                   ((3, None, 50, 30), False,
                                    "save_every 50 is not below the run's 30 steps"),
                                   ((3, None, 50, 30), True, "comes at step 30")):
        assert said in Interrupted(*args, saves_last=saves_last).message("seekrl sft")


def _small_sft(world, out, **keys):
    return SFTConfig(**{"data": str(world["oracle"]), "out": str(out), "max_steps": 4,
                        "batch_size": 2, "grad_accum": 2, "max_info_tokens": 64,
                        "save_every": 1, "keep_last": 1,
                        "optim": {"lr": 1e-3, "warmup_steps": 1}, **keys})


def _same_weights(a_dir, b_dir):
    a, b = load_policy(a_dir)[0], load_policy(b_dir)[0]
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_sft_checkpoints_by_default():
    """A killed run must have something to resume from without the user asking for it."""
    assert SFTConfig(data="d.jsonl").save_every == 50


def test_a_run_killed_mid_save_resumes_from_its_last_complete_checkpoint(world, tiny,
                                                                         tmp_path,
                                                                         monkeypatch):
    """Killed while writing step 3's checkpoint (the model written, state.pt not yet), and
    again after step 4's folder was renamed into place but before `latest` named it: each
    time `latest` names a complete checkpoint, --resume goes on from it, and the run ends
    with the weights and losses of one that never stopped; nothing half-written stays."""
    import copy

    import seekrl.recipes.checkpoint as checkpoint_module
    import seekrl.recipes.sft as sft_module

    class Killed(BaseException):   # like SIGKILL: no handler of the recipe's runs
        pass

    model, tok = tiny
    straight = run_sft(_small_sft(world, tmp_path / "a", max_steps=5), model=copy.deepcopy(model),
                       tokenizer=tok)
    real_state, real_point = sft_module.training_state, checkpoint_module.point_latest

    def kill_at(step, real):
        def maybe(*a, **k):
            if (a[1] if real is real_state else int(a[1].name[len("step-"):])) == step:
                raise Killed
            return real(*a, **k)
        return maybe

    out, ckpts = tmp_path / "b", tmp_path / "b" / "checkpoints"
    monkeypatch.setattr(sft_module, "training_state", kill_at(3, real_state))
    with pytest.raises(Killed):
        run_sft(_small_sft(world, out, max_steps=5), model=copy.deepcopy(model), tokenizer=tok)
    half = [p for p in ckpts.iterdir() if p.name.startswith(".step-3.tmp")]
    assert len(half) == 1 and not (half[0] / "state.pt").exists()
    assert (ckpts / "latest").read_text() == "step-2"
    half[0].rename(ckpts / ".step-3.tmp999999")   # as another process (the killed one) left it
    monkeypatch.setattr(sft_module, "training_state", real_state)
    monkeypatch.setattr(checkpoint_module, "point_latest", kill_at(4, real_point))
    with pytest.raises(Killed):
        run_sft(_small_sft(world, out, max_steps=5), model=copy.deepcopy(model), tokenizer=tok,
                resume=True)
    assert (ckpts / "step-4" / "state.pt").is_file() and (ckpts / "latest").read_text() == "step-3"
    monkeypatch.setattr(checkpoint_module, "point_latest", real_point)
    resumed = run_sft(_small_sft(world, out, max_steps=5), model=copy.deepcopy(model),
                      tokenizer=tok, resume=True)
    _same_weights(straight["final"], resumed["final"])
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-4"]

    def losses(run):
        return [(r["step"], r["loss"]) for r in map(
            json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())]
    assert losses("b") == losses("a")


def test_resume_refuses_other_settings_and_other_data(world, tiny, tmp_path):
    """--resume with a setting that changes what is trained is refused, naming the key,
    before the model is touched; so are other episodes under the same or another path.
    Where the run saves, logs and is evaluated may change, and the data file may move."""
    import copy
    import shutil

    from seekrl.config import ConfigError

    model, tok = tiny
    out = tmp_path / "r"
    run_sft(_small_sft(world, out, max_steps=2), model=copy.deepcopy(model), tokenizer=tok)
    for keys, named in [({"optim": {"lr": 2e-3, "warmup_steps": 1}}, "optim.lr: 0.001 -> 0.002"),
                        ({"max_steps": 3}, "max_steps: 2 -> 3"),
                        ({"seed": 1}, "seed: 0 -> 1"),
                        ({"batch_size": 1}, "batch_size: 2 -> 1"),
                        ({"rollout": {"snippet_words": 20}}, "rollout.snippet_words: None -> 20"),
                        ({"rollout": {"tools": ["open"]}}, r"rollout.tools: \[\] -> \['open'\]")]:
        with pytest.raises(ConfigError, match="--resume: the run in .* was trained with other "
                           "settings: " + named.replace(".", r"\.")):
            run_sft(_small_sft(world, out, **{"max_steps": 2, **keys}),
                    model=copy.deepcopy(model), tokenizer=tok, resume=True)
    fewer = tmp_path / "fewer.jsonl"
    lines = world["oracle"].read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if json.loads(line)["oracle_complete"])
    fewer.write_text("".join(lines[:first] + lines[first + 1:]))   # one used episode less
    with pytest.raises(ConfigError, match=f"data: {fewer} holds other episodes"):
        run_sft(_small_sft(world, out, max_steps=2, data=str(fewer)),
                model=copy.deepcopy(model), tokenizer=tok, resume=True)
    moved = tmp_path / "moved.jsonl"
    shutil.copy(world["oracle"], moved)
    done = run_sft(_small_sft(world, out, max_steps=2, data=str(moved), log_every=2,
                              keep_last=2), model=copy.deepcopy(model), tokenizer=tok,
                   resume=True)
    assert done["steps"] == 2


def test_sft_resume_refusals_at_the_command_line(tmp_path):
    """`seekrl sft --resume`: with --overwrite, or with a setting the run was not trained
    with, one line naming what is wrong and exit 2, in seconds (no model is loaded)."""
    from typer.testing import CliRunner

    from seekrl.cli import app
    from seekrl.config import dump_config

    data, out = tmp_path / "d.jsonl", tmp_path / "o"
    data.write_text('{"question": "q?", "turns": [{"role": "assistant", "content": "a"}]}\n')
    args = ["sft", f"data={data}", f"out={out}", "optim.lr=1e-3"]
    r = CliRunner().invoke(app, [*args, "--resume", "--overwrite"])
    assert r.exit_code == 2 and "give one of --resume" in r.output, r.output
    out.mkdir()
    dump_config(SFTConfig(data=str(data), out=str(out), optim={"lr": 1e-3}), out / "config.yaml")
    (out / "checkpoints" / "step-1").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step-1")
    r = CliRunner().invoke(app, [*args[:-1], "optim.lr=2e-3", "--resume"])
    assert r.exit_code == 2, r.output
    assert "optim.lr: 0.001 -> 0.002" in " ".join(r.output.split()), r.output


def test_episodes_past_the_rollouts_turns_or_tokens_are_reported():
    """A complete oracle episode of five turns, where rollouts play four (max_turns), or
    longer than max_total_tokens, teaches an ending the rollouts never reach: said (only
    the turn length was checked)."""
    from seekrl.recipes.sft import SFTExample, episode_limit_warning

    ex = [SFTExample([1] * 12, [0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0], "f.jsonl:1"),
          SFTExample([1] * 6, [0, 1, 0, 1, 0, 1], "f.jsonl:2")]
    assert episode_limit_warning(ex, max_turns=3, max_total_tokens=12) is None
    said = episode_limit_warning(ex, max_turns=2, max_total_tokens=11)
    assert said.startswith("of 2 episodes, 1 hold more than rollout.max_turns 2 turns "
                           "(first f.jsonl:2); 1 run past rollout.max_total_tokens 11 "
                           "(first f.jsonl:1)")


def test_turns_longer_than_the_rollout_limit_are_reported(world, tiny, tmp_path):
    """An episode whose turn is longer than the turn limit its rollouts will use teaches
    turns the rollouts cut mid-way (an invalid turn): SFT says so, naming the count, the
    longest turn and where it is, and its summary carries the figures."""
    from rich.console import Console

    from seekrl.recipes.sft import SFTExample, turn_limit_warning

    ex = [SFTExample([1] * 12, [0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0], "f.jsonl:1"),
          SFTExample([1] * 6, [0, 1, 1, 0, 1, 1], "f.jsonl:2")]
    assert [e.longest_turn for e in ex] == [5, 2]
    assert turn_limit_warning(ex, 5) is None
    said = turn_limit_warning(ex, 4)
    assert said.startswith("1 of 2 episodes (50%) hold a turn longer than the turn limit of "
                           "4 tokens (longest 5 tokens, f.jsonl:1)")
    model, tok = tiny
    examples, _ = load_sft_examples(world["oracle"], tok, max_info_tokens=64)
    longest = max(e.longest_turn for e in examples)
    console = Console(record=True, width=400)
    summary = run_sft(SFTConfig(data=str(world["oracle"]), out=str(tmp_path / "sft"),
                                max_steps=1, batch_size=1, grad_accum=1, max_info_tokens=64,
                                max_new_tokens=longest - 1),
                      model=__import__("copy").deepcopy(model), tokenizer=tok, console=console)
    assert summary["turn_limit"] == longest - 1 and summary["longest_turn"] == longest
    assert summary["turns_over_limit"] >= 1
    assert f"longer than the turn limit of {longest - 1} tokens" in console.export_text()
    # without max_new_tokens the evaluation's turn limit is the one checked
    quiet = Console(record=True, width=400)
    summary = run_sft(SFTConfig(data=str(world["oracle"]), out=str(tmp_path / "sft2"),
                                max_steps=1, batch_size=1, grad_accum=1, max_info_tokens=64,
                                eval={"max_new_tokens": longest}),
                      model=__import__("copy").deepcopy(model), tokenizer=tok, console=quiet)
    assert summary["turns_over_limit"] == 0 and "turn limit" not in quiet.export_text()


def _doc_examples() -> list[str]:
    """The ```jsonl blocks of docs/trajectory-format.md, one list of lines per block."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "trajectory-format.md").read_text()
    return re.findall(r"```jsonl\n(.*?)```", page, re.S)


def test_the_documented_formats_train_as_written(tiny, tmp_path):
    """The examples of docs/trajectory-format.md, copied into a file by hand: SFT reads
    every line (text turns laid out with the policy's tokens, a trajectory record used as
    it is) and trains on them."""
    model, tok = tiny
    blocks = _doc_examples()
    assert len(blocks) == 2
    turns, records = (tmp_path / "turns.jsonl"), (tmp_path / "records.jsonl")
    turns.write_text(blocks[0])
    records.write_text(blocks[1])
    examples, skipped = load_sft_examples(turns, tok)
    assert len(examples) == 2 and skipped == {"incomplete": 0, "truncated": 0}
    assert all(sum(e.loss_mask) > 0 for e in examples)
    first = json.loads(blocks[0].splitlines()[0])
    searched = tok.decode([t for t, m in zip(examples[0].token_ids, examples[0].loss_mask) if m])
    assert searched == "".join(t["content"] for t in first["turns"] if t["role"] == "assistant")
    (record,) = load_sft_examples(records, tok)[0]
    assert record.token_ids == json.loads(blocks[1])["token_ids"]
    both = tmp_path / "both.jsonl"
    both.write_text(blocks[0] + blocks[1])
    import copy
    done = run_sft(SFTConfig(data=str(both), out=str(tmp_path / "run"), max_steps=1,
                             batch_size=3, grad_accum=1), model=copy.deepcopy(model),
                   tokenizer=tok)
    assert done["episodes"] == 3 and done["loss"] > 0


@pytest.mark.parametrize("turns, field, said", [
    ([{"role": "assistant", "content": "The answer is Paris."}], "turns[0].content",
     "not a protocol turn (no complete <search> or <answer>)"),
    ([{"role": "assistant", "content": "<search> a </search>"},
      {"role": "information", "content": "Doc 1 (Title: A) a."},
      {"role": "assistant", "content": "So: <answer> b </answer>"}], "turns[2].content",
     "not a protocol turn (text outside the tags)"),
    ([{"role": "assistant", "content": "<search> a </search>"}], "turns[0].content",
     "an episode must end with an <answer> turn"),
    ([{"role": "user", "content": "hi"}], "turns[0].role", "expected 'assistant' or"),
    # turns and orders a rollout never plays (they were all taught)
    ([{"role": "assistant", "content": "<open> 2 </open>"},
      {"role": "information", "content": "x"},
      {"role": "assistant", "content": "<answer> b </answer>"}], "turns[0].content",
     "not a protocol turn (no <search> or <answer> tag)"),
    ([{"role": "assistant", "content": f"<search> {'a' * 600} </search>"},
      {"role": "information", "content": "x"},
      {"role": "assistant", "content": "<answer> b </answer>"}], "turns[0].content",
     "query longer than"),
    ([{"role": "assistant", "content": "<search> a </search>"},
      {"role": "assistant", "content": "<answer> b </answer>"}], "turns[0]",
     "a tool turn without the information turn"),
    ([{"role": "assistant", "content": "<answer> a </answer>"},
      {"role": "assistant", "content": "<answer> b </answer>"}], "turns[0].content",
     "an answer ends the episode"),
    ([{"role": "information", "content": "x"},
      {"role": "assistant", "content": "<answer> b </answer>"}], "turns[0]",
     "an information turn comes only after a search"),
    ([{"role": "assistant", "content": "<search> a </search>"},
      {"role": "information", "content": "x"}, {"role": "information", "content": "y"},
      {"role": "assistant", "content": "<answer> b </answer>"}], "turns[2]",
     "an information turn comes only after a search"),
])
def test_a_hand_written_episode_that_breaks_the_protocol_is_refused(tiny, tmp_path, turns,
                                                                    field, said):
    _, tok = tiny
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "q?", "turns": [
        {"role": "assistant", "content": "<answer> x </answer>"}]}) + "\n"
        + json.dumps({"question": "q?", "turns": turns}) + "\n")
    with pytest.raises(DataError) as err:
        load_sft_examples(path, tok)
    assert f"{path}:2" in str(err.value) and field in str(err.value) and said in str(err.value)


def test_a_parallel_search_laid_out_from_text_or_hits_reads_as_the_rollout_does(tiny):
    """A played episode converted to text (`episode_record`, RFT's "as text") had its block
    of two sub-queries cut at one query's budget (Query 2 and its documents lost), and an
    oracle turn's `Query i:` lines showed its stored queries as written, where the rollout
    heads them with the search turn's text, whitespace collapsed. Sub-queries past
    max_queries in a text block are refused as a rollout refuses them."""
    from seekrl.agent.protocol import query_sections
    from seekrl.retrieval.base import Hit

    _, tok = tiny
    docs = [[Hit(f"a{i}", f"Alpha {i}", ("alpha " * 12).strip(), 1.0) for i in range(2)],
            [Hit(f"b{i}", f"Beta {i}", ("beta " * 12).strip(), 1.0) for i in range(2)]]
    search = "<search> Ilsa  Marrow born ## Tarrow  country </search>"
    queries = ["Ilsa Marrow born", "Tarrow country"]
    text = "\n".join(query_sections(queries, docs, PROMPTS["seekrl"]))
    as_text = {"question": "q?", "turns": [
        {"role": "assistant", "content": search},
        {"role": "information", "content": text},
        {"role": "assistant", "content": "<answer> b </answer>"}]}
    ids, _ = episode_tokens(tok, as_text, max_info_tokens=64, max_queries=2)
    assert "Query 2: Tarrow country" in tok.decode(ids)
    hits = [[{"id": h.doc_id, "title": h.title, "text": h.text} for h in hs] for hs in docs]
    oracle = {"question": "q?", "turns": [
        as_text["turns"][0],
        {"role": "information", "content": "", "queries": ["Ilsa  Marrow born",
                                                           "Tarrow  country"], "hits": hits},
        as_text["turns"][2]]}
    laid, _ = episode_tokens(tok, oracle, max_info_tokens=64, max_queries=2)
    assert "Query 1: Ilsa Marrow born\n" in tok.decode(laid)
    assert "Query 1: Ilsa  Marrow" not in tok.decode(laid)
    assert laid == ids
    three = {**as_text, "turns": [{"role": "assistant", "content": "<search> a ## b ## c "
                                   "</search>"}, *as_text["turns"][1:]]}
    with pytest.raises(DataError, match="3 sub-queries; at most 2"):
        episode_tokens(tok, three, max_queries=2)


def test_sft_dev_evaluation_searches_eval_index_when_set(world, tiny, tmp_path):
    """`eval.index` overrides `index` for the dev evaluation; the world check pairs the dev
    questions with the index they will search, before anything trains."""
    from seekrl.errors import ConfigError
    from seekrl.recipes.sft import _eval_retriever
    from seekrl.retrieval.base import RetrievalError

    _, other, other_index = build_world_and_index(tmp_path / "o", seed=6, entities=200,
                                                  n_train=4, n_dev=4, n_test=4)
    ev = {"data": str(other["dev"]), "n": 1}
    cfg = SFTConfig(data=str(world["oracle"]), index=str(world["index_dir"]),
                    eval={**ev, "index": str(other_index)})
    first = json.loads(other["corpus"].read_text().splitlines()[0])["contents"]
    hit = _eval_retriever(cfg).search([first.split("\n", 1)[0]], 1)[0][0]
    assert hit.contents == first
    model, tok = tiny
    for n, (bad, error, match) in enumerate((
            ({"eval": ev}, RetrievalError, r"^index and eval.data: index .* another corpus"),
            ({"eval": {"index": str(other_index)}}, ConfigError, r"^eval.index: nothing"),
            ({"eval": {**ev, "index": str(world["index_dir"])}}, RetrievalError,
             r"^eval.index: index .* another corpus"))):
        out = tmp_path / f"sft-{n}"
        with pytest.raises(error, match=match):
            run_sft(SFTConfig(data=str(world["oracle"]), index=str(world["index_dir"]),
                              out=str(out), max_steps=1, **bad), model=model, tokenizer=tok)
        assert not out.exists()
