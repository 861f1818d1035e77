"""The HTML trajectory viewer: segments, escaping of untrusted text, self-containment, and a
render in headless Chromium (skipped where no browser is installed)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from seekrl.agent.trajectory import Step, Trajectory
from seekrl.eval.evaluate import score_trajectories, write_run
from seekrl.eval.report import decode_segments, read_episodes, render_viewer, write_viewer

EVIL_ANSWER = '<script>alert("pwned")</script>'
EVIL_QUESTION = "Who <img src=x onerror=alert(1)> wrote it?"
EVIL_TITLE = '"><svg onload=alert(2)>'


class WordTokenizer:
    """A stand-in tokenizer: one token per word (with its trailing space)."""

    def __init__(self):
        self.vocab: list[str] = []
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in re.findall(r"\S+\s*|\s+", text):
            if piece not in self.ids:
                self.ids[piece] = len(self.vocab)
                self.vocab.append(piece)
            out.append(self.ids[piece])
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.vocab[i] for i in ids)


def episode(tok: WordTokenizer, dataset: str, qid: str, question: str, golds: list[str],
            turns: list[dict], *, gold_docs=(), type_=None, sample=0) -> Trajectory:
    """A trajectory from text: the prompt, then per turn its generated text and, after a
    search (or an invalid action), the environment's block."""
    ids = tok.encode(f"<|im_start|>user Answer. Question: {question} <|im_end|> ")
    mask = [0] * len(ids)
    prompt_len, steps, answer, finish = len(ids), [], None, "max_turns"
    for turn in turns:
        gen = tok.encode(turn["text"])
        step = Step(start=len(ids), end=len(ids) + len(gen), action=turn["action"],
                    text=turn["text"], query=turn.get("query"), answer=turn.get("answer"),
                    reason=turn.get("reason"))
        ids += gen
        mask += [1] * len(gen)
        if turn["action"] == "answer":
            answer, finish = turn["answer"], "answer"
        else:
            hits = turn.get("hits", [])
            step.hits = [d for d, _ in hits]
            step.hit_titles = [t for _, t in hits]
            step.gold_hit = bool(set(gold_docs) & set(step.hits)) if gold_docs else None
            info = " <information>" + " ".join(f"Doc {i} (Title: {t}) about {t}."
                                               for i, (_, t) in enumerate(hits, 1)) \
                + "</information> " if turn["action"] == "search" else \
                " <information>That was not a valid action.</information> "
            block = tok.encode(info)
            step.info_start = len(ids)
            ids += block
            mask += [0] * len(block)
            step.info_end = len(ids)
        steps.append(step)
    t = Trajectory(example_id=qid, group_id=qid, question=question, golden_answers=golds,
                   token_ids=ids, loss_mask=mask, prompt_len=prompt_len, steps=steps,
                   answer=answer, finish_reason=finish, sample_index=sample, dataset=dataset,
                   metadata={"type": type_} if type_ else {}, gold_doc_ids=list(gold_docs))
    t.check()
    return t


def sample_run(tok: WordTokenizer) -> list[Trajectory]:
    runs = [
        episode(tok, "nq", "q1", "Who wrote The Crimson Orchard?", ["Shoustis Polley"], [
            {"action": "search", "query": "The Crimson Orchard author",
             "text": "<think> find the novel </think> <search> The Crimson Orchard author "
                     "</search>", "hits": [("doc-157", "The Crimson Orchard"),
                                           ("doc-160", "The Winter Orchard")]},
            {"action": "answer", "answer": "Shoustis Polley",
             "text": "<think> the novel names its author </think> <answer> Shoustis Polley "
                     "</answer>"},
        ], gold_docs=["doc-157"], type_="single"),
        episode(tok, "hotpotqa", "q2", EVIL_QUESTION, ["Tarrow"], [
            {"action": "invalid", "reason": "no <search> or <answer> tag",
             "text": "I think </pre><script>alert(3)</script>"},
            {"action": "search", "query": "<b>bold</b>", "text": "<search> <b>bold</b> </search>",
             "hits": [("doc-1", EVIL_TITLE), ("doc-2", "Tarrow")]},
            {"action": "answer", "answer": EVIL_ANSWER,
             "text": f"<answer> {EVIL_ANSWER} </answer>"},
        ], gold_docs=["doc-2"], type_="bridge"),
        episode(tok, '"><b>x', "q3", "What is 2+2?", ["4"], [
            {"action": "answer", "answer": "4", "text": "<answer> 4 </answer>"}]),
    ]
    for t in runs:
        t.outcome_reward = 1.0 if t.answer in t.golden_answers else 0.0
    return runs


def write_sample_run(run_dir: Path, with_episodes: bool = True) -> tuple[Path, list]:
    tok = WordTokenizer()
    trajs = sample_run(tok)
    metrics = {"config": {"model": "unit-test", "rollout": {"method": "agent"}},
               **score_trajectories(trajs)}
    write_run(run_dir, trajs, metrics, tok if with_episodes else None)
    return run_dir, trajs


def test_a_run_written_again_without_a_tokenizer_drops_the_old_episodes(tmp_path):
    """write_run without a tokenizer wrote no episodes.jsonl and left the old one: the
    viewer then showed the old run's turns beside the new run's answers."""
    run, _ = write_sample_run(tmp_path / "run")
    assert (run / "episodes.jsonl").exists()
    write_sample_run(run, with_episodes=False)
    assert not (run / "episodes.jsonl").exists()


def test_decode_segments_tile_the_tokens_and_follow_the_loss_mask():
    tok = WordTokenizer()
    t = sample_run(tok)[1]
    segs = decode_segments(t, tok)
    assert [s["kind"] for s in segs] == ["prompt", "generated", "correction", "generated",
                                         "information", "generated"]
    assert [s["step"] for s in segs] == [None, 0, 0, 1, 1, 2]
    assert sum(s["tokens"] for s in segs) == len(t.token_ids)
    assert [s["trained"] for s in segs] == [False, True, False, True, False, True]
    assert "".join(s["text"] for s in segs) == tok.decode(t.token_ids)
    assert segs[4]["text"].startswith(" <information>Doc 1 (Title: ")


def test_untrusted_text_is_escaped(tmp_path):
    run, _ = write_sample_run(tmp_path / "run")
    page = write_viewer(run).read_text()
    # our own inline script is the only one; nothing the model or data wrote became markup
    assert page.count("<script") == 1 and page.count("</script>") == 1
    assert "<img" not in page and "<svg" not in page
    assert "<b>bold</b>" not in page and "<b>x" not in page
    assert "</pre><script>" not in page
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&quot;&gt;&lt;svg onload=alert(2)&gt;" in page
    # attribute values (dataset names) cannot break out of their quotes either
    assert 'data-dataset="&quot;&gt;&lt;b&gt;x"' in page
    assert '<option value="&quot;&gt;&lt;b&gt;x">' in page


def test_viewer_shows_turns_hits_gold_and_shading(tmp_path):
    run, trajs = write_sample_run(tmp_path / "run")
    page = write_viewer(run, tmp_path / "out" / "view.html").read_text()
    assert (tmp_path / "out" / "view.html").is_file()
    # self-contained: no external scripts, styles, images or fonts
    assert not re.search(r"<(link|img|script|iframe)\b[^>]*\b(src|href)=", page)
    assert "url(" not in page and "@import" not in page
    # the metrics table (a row per data set and the average) and the type breakdown
    assert re.search(r"<tr class=\"avg\"><th>average</th><td>3</td>", page)
    assert "By question type" in page and "<th>bridge</th>" in page
    # filters and the episodes' data attributes they use
    for element in ('id="f-wrong"', 'id="f-dataset"', 'id="f-searches"', 'id="f-type"',
                    'id="f-text"'):
        assert element in page
    eps = re.findall(r'<details class="ep" id="ep\d+" data-dataset="([^"]*)" '
                     r'data-correct="(\d)" data-searches="(\d+)"', page)
    assert eps == [("nq", "1", "1"), ("hotpotqa", "0", "1"), ("&quot;&gt;&lt;b&gt;x", "1", "0")]
    # gold documents marked, others not; generated vs masked shading; decoded information
    assert re.search(r'<li class="gold">.*?The Crimson Orchard <code>doc-157</code>', page)
    assert '<li class="">The Winter Orchard <code>doc-160</code>' in page
    assert page.count('class="seg trained k-generated"') == sum(len(t.steps) for t in trajs)
    assert 'class="seg masked k-information"' in page and 'class="seg masked k-prompt"' in page
    assert "about The Winter Orchard." in page          # the information text itself
    assert '<span class="tag">&lt;search&gt;</span>' in page
    assert "gold: Shoustis Polley" in page and "reward 1" in page


def test_gold_known_by_title_is_marked_too():
    """HotpotQA, 2Wiki and MuSiQue name their gold passages by title: the viewer marks a
    hit whose title is one (normalised, as evidence recall matches it) and shows the
    recall, as for gold ids."""
    tok = WordTokenizer()
    t = episode(tok, "hotpotqa", "q9", "Who wrote it?", ["Polley"], [
        {"action": "search", "query": "author", "text": "<search> author </search>",
         "hits": [("w-1", "The  Crimson Orchard"), ("w-2", "The Winter Orchard")]},
        {"action": "answer", "answer": "Polley", "text": "<answer> Polley </answer>"}])
    t.metadata["supporting_titles"] = ["the crimson orchard", "Shoustis Polley"]
    page = render_viewer([t])
    assert re.search(r'<li class="gold">.*?The  Crimson Orchard <code>w-1</code>', page)
    assert '<li class="">The Winter Orchard <code>w-2</code>' in page
    assert "supporting titles the crimson orchard | Shoustis Polley" in page
    assert "evidence recall 0.50" in page


def test_one_supporting_title_and_a_null_type_are_shown_as_such():
    """A string `supporting_titles` (one title, as evidence recall reads it) was shown
    letter by letter; a null type as the type "None" (the metrics say "(no type)")."""
    tok = WordTokenizer()
    t = episode(tok, "hotpotqa", "q9", "Who wrote it?", ["Polley"], [
        {"action": "search", "query": "author", "text": "<search> author </search>",
         "hits": [("w-1", "The Crimson Orchard")]},
        {"action": "answer", "answer": "Polley", "text": "<answer> Polley </answer>"}])
    t.metadata["supporting_titles"] = "The Crimson Orchard"
    t.metadata["type"] = None
    page = render_viewer([t])
    assert "supporting titles The Crimson Orchard ·" in page
    assert "type None" not in page and 'data-type=""' in page


def test_a_metrics_file_of_another_shape_is_named(tmp_path):
    """`seekrl inspect` indexed metrics.json without checking it: a raw AttributeError or
    TypeError; now the file and the field are named (a null n_samples reads as absent)."""
    from seekrl.errors import DataError

    run, _ = write_sample_run(tmp_path / "run")
    good = json.loads((run / "metrics.json").read_text())
    for shape, field in (([1], None), ({"datasets": {"nq": None}}, "datasets.nq"),
                         ({**good, "n_samples": "4"}, "n_samples"),
                         ({**good, "pass_ks": 4}, "pass_ks")):
        (run / "metrics.json").write_text(json.dumps(shape))
        with pytest.raises(DataError) as err:
            write_viewer(run)
        assert "metrics.json" in str(err.value) and (field is None or err.value.field == field)
    (run / "metrics.json").write_text(json.dumps({**good, "n_samples": None, "pass_ks": None}))
    assert write_viewer(run).is_file()


def test_viewer_without_episodes_file_shows_step_text_and_titles(tmp_path):
    run, _ = write_sample_run(tmp_path / "run", with_episodes=False)
    assert not (run / "episodes.jsonl").exists()
    page = write_viewer(run).read_text()
    assert "text not stored" in page and "The Winter Orchard <code>doc-160</code>" in page
    assert "the novel names its author" in page
    assert "about The Winter Orchard." not in page      # no tokenizer: no information text
    # with a tokenizer, the spans are decoded then and there
    tok = WordTokenizer()
    sample_run(tok)  # same vocabulary order as the run's own tokenizer
    page = write_viewer(run, tokenizer=tok).read_text()
    assert "about The Winter Orchard." in page


def test_render_viewer_limits_episodes_and_works_without_metrics():
    tok = WordTokenizer()
    page = render_viewer(sample_run(tok), max_episodes=1)
    assert page.count('<details class="ep"') == 1 and "(first 1 of 3:" in page
    assert "<h2>Metrics</h2>" not in page


def test_the_viewers_a_run_writes_by_itself_are_capped(tmp_path, monkeypatch):
    # a training run writes a viewer at every dev evaluation and rollout step: a large dev
    # set must not make pages a browser cannot open; `seekrl inspect` writes every episode
    import seekrl.eval.evaluate as evaluate
    monkeypatch.setattr(evaluate, "AUTO_VIEWER_EPISODES", 2)
    tok = WordTokenizer()
    evaluate.write_rollouts(tmp_path / "step-1", sample_run(tok), tok, {"model": "unit-test"})
    page = (tmp_path / "step-1" / "viewer.html").read_text()
    assert page.count('<details class="ep"') == 2 and "(first 2 of 3" in page
    assert write_viewer(tmp_path / "step-1").read_text().count('<details class="ep"') == 3


def test_a_steps_rollouts_with_a_question_drawn_twice_are_written(tmp_path):
    """A refill can bring a question back within a step: its 2G episodes beside others' G
    made the default pass@2G refuse the step, and the training run with it."""
    import seekrl.eval.evaluate as evaluate

    tok = WordTokenizer()
    first, second = sample_run(tok)[:2]
    step = [dataclasses.replace(t, sample_index=i, group_id=f"{t.example_id}/{g}")
            for g, t0 in enumerate([first, second, first]) for i, t in enumerate([t0, t0])]
    evaluate.write_rollouts(tmp_path / "step-1", step, tok, {"model": "unit-test"})
    metrics = json.loads((tmp_path / "step-1" / "metrics.json").read_text())
    assert metrics["average"]["pass@2"] is not None
    assert metrics["average"]["trajectories"] == 6


def test_a_steps_tree_rollouts_keep_their_lineage_when_renumbered(tmp_path):
    """Tree rollouts come back grouped by tree (root 0, its child 2, root 1, its child 3):
    numbering them afresh in list order had left `tree` and `parent` on the old numbers,
    so the second child named the first tree's child as its parent."""
    import seekrl.eval.evaluate as evaluate
    from seekrl.agent.trajectory import read_trajectories

    tok = WordTokenizer()
    t = sample_run(tok)[0]
    order = [(0, 0, None), (2, 0, 0), (1, 1, None), (3, 1, 1)]   # (index, tree, parent)
    draw = [dataclasses.replace(t, sample_index=i, tree=tree, parent=parent)
            for i, tree, parent in order]
    again = [dataclasses.replace(x, sample_index=x.sample_index) for x in draw[:2]]
    evaluate.write_rollouts(tmp_path / "step-1", draw + again, tok, {"model": "unit-test"})
    got = [(x.sample_index, x.tree, x.parent)
           for x in read_trajectories(tmp_path / "step-1" / "trajectories.jsonl")]
    # each child names its own tree's root; a refill's draw of the question its own numbers
    assert got == [(0, 0, None), (1, 0, 0), (2, 2, None), (3, 2, 2), (4, 4, None), (5, 4, 4)]

def test_bad_run_folders_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="trajectories.jsonl"):
        write_viewer(tmp_path)
    run, _ = write_sample_run(tmp_path / "run")
    (run / "metrics.json").write_text("{not json")
    with pytest.raises(ValueError, match="metrics.json"):
        write_viewer(run)
    (run / "metrics.json").unlink()
    twice = json.dumps({"dataset": "nq", "example_id": "q", "sample_index": 0, "segments": []})
    (run / "episodes.jsonl").write_text(twice + "\n" + twice + "\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:2: .*written twice"):
        read_episodes(run / "episodes.jsonl")
    (run / "episodes.jsonl").write_text(json.dumps({"dataset": "nq"}) + "\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:1.*example_id"):
        read_episodes(run / "episodes.jsonl")
    (run / "episodes.jsonl").write_text(json.dumps(
        {"dataset": "nq", "example_id": "q", "sample_index": 0, "segments": [1]}) + "\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:1.*segments.*segment objects"):
        read_episodes(run / "episodes.jsonl")


@pytest.mark.parametrize("field, value", [
    ("sample_index", "<img src=x onerror=alert(1)>"), ("sample_index", -1),
    ("steps.0.process_reward", "high"), ("steps.0.value", "0.5"),
    ("steps.0.process_parts", {"recall": "x"}), ("steps.0.process_parts", [1])])
def test_a_trajectory_field_the_viewer_shows_is_checked_as_read(tmp_path, field, value):
    """Shown in the page as markup, or formatted as a number: a wrong type there is named
    with its file, line and field when read (it became live markup, or a format error)."""
    from seekrl.agent.trajectory import checked_trajectory

    record = Trajectory(example_id="q", group_id="g", question="?", golden_answers=["a"],
                        token_ids=[1, 2, 3], loss_mask=[0, 1, 1], prompt_len=1,
                        steps=[Step(start=1, end=3, text="<answer>a</answer>",
                                    action="answer", answer="a")]).to_dict()
    checked_trajectory(record, "t.jsonl", 1)
    where = record
    *parents, last = field.split(".")
    for p in parents:
        where = where[int(p)] if p.isdigit() else where[p]
    where[last] = value
    name = ".".join(p for p in field.split(".") if not p.isdigit())
    with pytest.raises(ValueError, match=rf"t.jsonl:1.*{re.escape(name)}"):
        checked_trajectory(record, "t.jsonl", 1)


def test_the_config_line_shows_no_credentials_of_a_retriever_url():
    from seekrl.eval.report import config_line

    line = config_line({"retriever": {"url": "http://user:secret@search.lan:8000/retrieve?key=K"}})
    assert "secret" not in line and "key=K" not in line and "user" not in line
    assert "http://search.lan:8000/retrieve" in line
    assert "http://[::1]:8000/retrieve" in config_line({"retriever": {"url": "http://[::1]:8000/retrieve"}})
    assert "/data/index" in config_line({"retriever": {"path": "/data/index"}})


# ------------------------------------------------------------------ headless Chromium


def read_png(path: Path) -> np.ndarray:
    """A minimal PNG decoder (8-bit RGB/RGBA, not interlaced: what Chromium writes) -> an
    (height, width, 3) uint8 array. Kept here so the test needs no imaging library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and interlace == 0 and color in (2, 6), f"unsupported PNG {header}"
    bpp = 3 if color == 2 else 4
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    rows = rows.reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), dtype=np.int64)
    prior = np.zeros(width * bpp, dtype=np.int64)
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:].astype(np.int64)
        if kind == 0:
            cur = line
        elif kind == 1:
            cur = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) % 256
        elif kind == 2:
            cur = (line + prior) % 256
        else:  # average / Paeth depend on the pixel to the left: a plain-list loop
            cur, up = line.tolist(), prior.tolist()
            for x in range(width * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b = up[x]
                if kind == 3:
                    cur[x] = (cur[x] + (a + b) // 2) & 255
                else:
                    c = up[x - bpp] if x >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc
                                        else c)) & 255
            cur = np.array(cur, dtype=np.int64)
        out[y] = cur
        prior = cur
    return out.astype(np.uint8).reshape(height, width, bpp)[:, :, :3]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-quic", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


needs_chromium = pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser")),
    reason="no headless browser: install Debian's `chromium` package to render the viewer")


@needs_chromium
def test_viewer_renders_in_headless_chromium(tmp_path):
    run, _ = write_sample_run(tmp_path / "run")
    page = write_viewer(run)
    shot = tmp_path / "viewer.png"
    r = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1600",
                 page.resolve().as_uri())
    assert shot.is_file(), f"no screenshot; chromium said:\n{r.stderr[-2000:]}"
    pixels = read_png(shot)
    assert pixels.shape == (1600, 1200, 3)
    ink = (pixels.min(axis=2) < 235).mean()  # share of clearly non-white pixels
    assert ink > 0.05, f"the page looks blank ({ink:.1%} non-white pixels)"
    assert (pixels[5, 5] == [0x1F, 0x3A, 0x5F]).all()  # the header bar is drawn


@needs_chromium
def test_viewer_filters_run_in_the_browser(tmp_path):
    run, _ = write_sample_run(tmp_path / "run")
    uri = write_viewer(run).resolve().as_uri()
    shown = {}
    for fragment in ("#searches=1", "#searches=1&wrong=1", "#dataset=nq",
                     "#type=bridge&q=2%2B2", "#searches=1&q=%E0"):
        r = chromium(tmp_path, "--dump-dom", uri + fragment)
        match = re.search(r'id="f-count"[^>]*>(\d+) of (\d+) episodes shown<', r.stdout)
        assert match, f"the filter script did not run for {fragment!r}:\n{r.stderr[-2000:]}"
        shown[fragment] = int(match.group(1))
        assert int(match.group(2)) == 3
    # filters combine with AND; the text filter matches the question or the answer
    # a malformed %-escape (a hand-edited link) leaves its filter unset, not the script dead
    assert shown == {"#searches=1": 2, "#searches=1&wrong=1": 1, "#dataset=nq": 1,
                     "#type=bridge&q=2%2B2": 0, "#searches=1&q=%E0": 2}


def test_printed_hits_escape_every_field_as_markup():
    """A document id (or title, text, query) with rich markup in it prints as written."""
    from rich.console import Console

    from seekrl.eval.show import print_hits
    from seekrl.retrieval.base import Hit

    console = Console(record=True, width=200)
    print_hits(console, "q [/]", [Hit("x[/]", "T [bold]", "a[b]c", 1.0)], gold={"x[/]"})
    out = console.export_text()
    assert "x[/]" in out and "T [bold]" in out and "a[b]c" in out and "GOLD" in out
