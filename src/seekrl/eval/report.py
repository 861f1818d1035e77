"""Reports of an eval run: the markdown metrics tables and the self-contained HTML viewer.

`seekrl inspect RUN_DIR` reads what `seekrl eval` wrote there:

- `metrics.json` — the scores (see `seekrl.eval.evaluate.score_trajectories`) and the config;
- `trajectories.jsonl` — one `Trajectory` per episode (token ids, loss mask, steps, hits);
- `episodes.jsonl` (optional) — the same episodes as decoded text segments, written at eval
  time by `decode_segments` so the viewer needs no tokenizer. Without it the viewer shows
  each turn's generated text (`Step.text`) and the retrieved titles only, unless a
  tokenizer is given to decode the token spans then and there.

The viewer is one HTML file with inline CSS and JS and no external assets, so it can be
mailed or opened from a CI artifact. Model output is untrusted: every piece of text goes
through `html.escape`, and the JS reads only `data-` attributes, never the episode text.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from seekrl.agent.trajectory import Trajectory, read_trajectories, title_keys
from seekrl.data.jsonl import iter_jsonl
from seekrl.data.qa import given_titles
from seekrl.errors import DataError
from seekrl.rewards.metrics import exact_match, f1_score

__all__ = ["decode_segments", "episode_key", "metric_columns", "metrics_markdown",
           "read_episodes", "render_viewer", "write_viewer"]

METRICS_FILE, TRAJECTORIES_FILE, EPISODES_FILE = "metrics.json", "trajectories.jsonl", \
    "episodes.jsonl"
# what `seekrl eval` (and `seekrl inspect`) write into a run folder: an `--overwrite`
# removes them all, so no viewer of the old run stays beside the new metrics
EVAL_RUN_FILES = (METRICS_FILE, "metrics.md", TRAJECTORIES_FILE, EPISODES_FILE, "viewer.html")

# (key in a metrics row, column label, format); pass@k columns are added per run.
_BASE_COLUMNS: list[tuple[str, str, str]] = [
    ("questions", "questions", "{:d}"),
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "cover-EM", "{:.3f}"),
    ("valid_format", "valid format", "{:.3f}"),
    ("searches", "searches", "{:.2f}"),
    ("generated_tokens", "gen. tokens", "{:.1f}"),
    ("evidence_recall", "evidence recall", "{:.3f}"),
    ("em_evidence_complete", "EM, all gold found", "{:.3f}"),
]


def metric_columns(metrics: dict) -> list[tuple[str, str, str]]:
    """The table columns for a metrics dict: the base ones, then pass@k where present."""
    columns = list(_BASE_COLUMNS)
    if (metrics.get("n_samples") or 1) > 1:
        columns[1] = ("em", f"EM (mean of {metrics['n_samples']})", "{:.3f}")
    for k in metrics.get("pass_ks") or []:
        columns.append((f"pass@{k}", f"pass@{k}", "{:.3f}"))
    rows = [row for _, row in _table_rows(metrics)] + [
        row for types in (metrics.get("by_type") or {}).values() for row in types.values()]
    if any(row.get("planned_lookups") is not None for row in rows):
        # the hop decision, where the policy states its plan (the synthetic world's)
        at = [k for k, _, _ in columns].index("searches") + 1
        columns[at:at] = [("one_search", "one search", "{:.3f}"),
                          ("planned_lookups", "planned lookups", "{:.2f}")]
    if any(row.get("answered_yes") is not None for row in rows):
        # on yes/no questions: an agent that says yes (or no) whatever it read shows here
        columns += [("answered_yes", "says yes", "{:.3f}"), ("gold_yes", "gold yes", "{:.3f}")]
    return columns


def cell(row: dict, key: str, fmt: str) -> str:
    """One table cell: the row's value formatted, "n/a" when it is missing (shared with the
    training report)."""
    value = row.get(key)
    if value is None:
        return "n/a"
    return fmt.format(int(value) if fmt == "{:d}" else value)


def _table_rows(metrics: dict) -> list[tuple[str, dict]]:
    rows = list((metrics.get("datasets") or {}).items())
    if "average" in metrics and len(rows) > 1:
        rows.append(("average", metrics["average"]))
    return rows


def metrics_markdown(metrics: dict) -> str:
    """metrics.md: the config line, a row per dataset plus the macro average, and the
    per-question-type breakdown where the data has `metadata.type`."""
    columns = metric_columns(metrics)
    lines = ["# Evaluation", ""]
    cfg = metrics.get("config") or {}
    if cfg:
        lines += [config_line(cfg), ""]
    lines += ["| dataset | " + " | ".join(label for _, label, _ in columns) + " |",
              "|---|" + "---:|" * len(columns)]
    for name, row in _table_rows(metrics):
        label = "**average**" if name == "average" else _md(name)
        lines.append(f"| {label} | " + " | ".join(cell(row, k, f) for k, _, f in columns)
                     + " |")
    by_type = metrics.get("by_type") or {}
    if by_type:
        lines += ["", "## By question type", "",
                  "| dataset | type | " + " | ".join(label for _, label, _ in columns) + " |",
                  "|---|---|" + "---:|" * len(columns)]
        for name, types in by_type.items():
            for type_name, row in types.items():
                lines.append(f"| {_md(name)} | {_md(type_name)} | "
                             + " | ".join(cell(row, k, f) for k, _, f in columns) + " |")
    if metrics.get("hops"):
        lines += ["", "## Search-R1 / FlashRAG layout", "",
                  suite_table([("EM", metrics), ("F1", metrics)], keys=["em", "f1"])]
    lines.append("")
    if any(row.get("evidence_recall") is None for _, row in _table_rows(metrics)):
        lines.append("evidence recall: n/a where the data has neither `metadata.gold_doc_ids` "
                     "nor `metadata.supporting_titles`.")
    return "\n".join(lines) + "\n"


def check_metrics(metrics: Any, path: str | Path) -> dict:
    """`metrics` (a metrics.json read from `path`) as `seekrl eval` writes it, else a
    DataError naming the file and field: the tables index into it by shape."""
    if not isinstance(metrics, dict):
        raise DataError("expected an object of metrics (written by `seekrl eval`), got "
                        f"{type(metrics).__name__}", path=str(path))

    def objects(value: Any, field: str, depth: int) -> None:
        if not isinstance(value, dict):
            raise DataError(f"expected an object, got {type(value).__name__}",
                            path=str(path), field=field)
        for k, v in value.items() if depth else ():
            objects(v, f"{field}.{k}", depth - 1)

    # datasets: name -> row; average: a row; by_type: dataset -> type -> row
    for key, depth in (("datasets", 1), ("average", 0), ("by_type", 2)):
        if metrics.get(key) is not None:
            objects(metrics[key], key, depth)
    n = metrics.get("n_samples")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise DataError(f"expected a count of samples, got {n!r}", path=str(path),
                        field="n_samples")
    ks = metrics.get("pass_ks")
    if ks is not None and (not isinstance(ks, list) or not all(
            isinstance(k, int) and not isinstance(k, bool) for k in ks)):
        raise DataError(f"expected a list of k values, got {ks!r}", path=str(path),
                        field="pass_ks")
    return metrics


def suite_table(runs: Sequence[tuple[str, dict]], keys: Sequence[str] | None = None,
                key: str = "em") -> str:
    """The table layout of the Search-R1 / FlashRAG papers, as markdown: a row per run
    (label, metrics.json dict), a column per data set (the standard suite in its usual
    order, then any others), then the single-hop, multi-hop and overall macro averages.
    `keys` gives each row its own metric (for EM and F1 rows of one run); else `key`."""
    from seekrl.data.benchmarks import BENCHMARKS, hop_averages

    names: list[str] = []
    for _, m in runs:
        names += [n for n in (m.get("datasets") or {}) if n not in names]
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    names.sort(key=lambda n: order.get(n, len(order)))
    keys = list(keys) if keys is not None else [key] * len(runs)
    lines = ["| | " + " | ".join([*(_md(n) for n in names), "single-hop avg.",
                                  "multi-hop avg.", "avg."]) + " |",
             "|---|" + "---:|" * (len(names) + 3)]
    partial = False
    for (label, m), k in zip(runs, keys):
        datasets = m.get("datasets") or {}
        hops = hop_averages(datasets, [k])
        cells = [cell(datasets.get(n, {}), k, "{:.3f}") for n in names]
        if all(n in datasets for n in names):
            cells += [cell(hops.get(h, {}), k, "{:.3f}") for h in ("single", "multi")]
            cells.append(cell(m.get("average", {}), k, "{:.3f}"))
        else:   # its averages would be over other sets than the other rows'
            partial = True
            cells += ["n/a"] * 3
        lines.append(f"| {_md(label)} | " + " | ".join(cells) + " |")
    if partial:
        lines += ["", "averages: n/a for a run that lacks some of the table's sets (averages "
                  "over different sets do not compare)."]
    return "\n".join(lines)


def run_label(metrics: dict, fallback: str) -> str:
    """`method · model` for a run's row in a comparison table. A model folder with a
    generic name (`final`, `step-N`, `checkpoint-N`, as every seekrl run writes) is named
    with its run folder: `agent · sft/final`, `agent · rl/final`."""
    cfg = metrics.get("config") or {}
    method = (cfg.get("rollout") or {}).get("method")
    parts = [x for x in str(cfg.get("model") or "").replace("\\", "/").split("/") if x]
    model = "/".join(parts[-2:]) if len(parts) > 1 and _GENERIC.fullmatch(parts[-1]) \
        else (parts[-1] if parts else "")
    return " · ".join(x for x in (method, model) if x) or fallback


def unique_labels(labels: list[str], names: list[str]) -> list[str]:
    """Labels that repeat get their run folder's name added: `agent · final (eval-3)`."""
    seen = {x: labels.count(x) for x in labels}
    return [f"{x} ({n})" if seen[x] > 1 else x for x, n in zip(labels, names)]


_GENERIC = re.compile(r"final|model|best|last|(step|checkpoint|ckpt)[-_]?\d+")


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def config_line(cfg: dict) -> str:
    """A run's config in one line (model, method, rollout settings, retriever)."""
    rollout = cfg.get("rollout") or {}
    parts = [f"model `{cfg['model']}`"] if cfg.get("model") else []
    parts.append(f"method `{rollout.get('method', '?')}`")
    retriever = cfg.get("retriever")
    if isinstance(retriever, dict):
        where = retriever.get("url") or retriever.get("path") or retriever.get("type")
        parts.append(f"retriever `{_without_secrets(where)}`")
    for key, label in (("n_samples", "samples"), ("topk", "top-k"), ("max_turns", "max turns"),
                       ("max_new_tokens", "max new tokens")):
        if key in rollout:
            parts.append(f"{label} {rollout[key]}")
    if rollout.get("greedy"):
        parts.append("greedy")
    elif "temperature" in rollout:
        parts.append(f"temperature {rollout['temperature']}")
    if "seed" in rollout:
        parts.append(f"seed {rollout['seed']}")
    if cfg.get("limit"):
        parts.append(f"limit {cfg['limit']}")
    kept = cfg.get("kept")
    if isinstance(kept, dict):   # a training step's rollouts filtered by dynamic sampling
        parts.append(f"{kept.get('episodes')} of the {kept.get('played')} episodes played "
                     f"({kept.get('why')})")
    return "Run: " + ", ".join(parts) + "."


# ------------------------------------------------------------------ decoded episode segments


def episode_key(dataset: str, example_id: str, sample_index: int) -> str:
    """How an `episodes.jsonl` record finds its trajectory."""
    return json.dumps([dataset, example_id, sample_index])


def decode_segments(traj: Trajectory, tokenizer) -> list[dict[str, Any]]:
    """The episode as consecutive text segments that tile `token_ids`.

    Each segment: `kind` (prompt / generated / information / correction / other), `step`
    (the turn it belongs to, or None), `tokens` (how many), `trained` (all its tokens have
    loss_mask 1) and `text` (decoded on its own; a multi-byte character cut at a segment
    border shows as U+FFFD, a cosmetic loss accepted for exact token spans)."""
    spans: list[tuple[int, int, str, int | None]] = [(0, traj.prompt_len, "prompt", None)]
    for i, step in enumerate(traj.steps):
        spans.append((step.start, step.end, "generated", i))
        if step.info_start is not None and step.info_end is not None:
            kind = "correction" if step.action == "invalid" else "information"
            spans.append((step.info_start, step.info_end, kind, i))
    spans.sort(key=lambda s: (s[0], s[1]))
    segments, pos, n = [], 0, len(traj.token_ids)

    def add(a: int, b: int, kind: str, step: int | None) -> None:
        if b <= a:
            return
        ids = traj.token_ids[a:b]
        segments.append({"kind": kind, "step": step, "tokens": b - a,
                         "trained": all(traj.loss_mask[a:b]),
                         "text": tokenizer.decode(ids, skip_special_tokens=False)})

    for a, b, kind, step in spans:
        a, b = max(a, pos), min(b, n)
        add(pos, a, "other", None)  # tokens no span claims: shown, never hidden
        add(a, b, kind, step)
        pos = max(pos, b)
    add(pos, n, "other", None)
    return segments


def _without_secrets(where: Any) -> Any:
    """A retriever URL as a shared page may show it: no user, password or query string."""
    if not isinstance(where, str) or "://" not in where:
        return where
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(where)
        host = u.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = host + (f":{u.port}" if u.port else "")
    except ValueError:   # not a URL after all
        return where
    return urlunsplit((u.scheme, netloc, u.path, "", ""))


def read_episodes(path: str | Path) -> dict[str, list[dict]]:
    """episodes.jsonl -> {episode_key: segments}."""
    out: dict[str, list[dict]] = {}
    for line_no, obj in iter_jsonl(path):
        try:
            key = episode_key(obj["dataset"], obj["example_id"], obj["sample_index"])
            segments = obj["segments"]
        except (KeyError, TypeError) as err:
            raise DataError(f"not an episode record (missing {err})", path=str(path),
                            line=line_no) from None
        if not isinstance(segments, list) or not all(isinstance(s, dict) for s in segments):
            raise DataError("expected a list of segment objects", path=str(path),
                            line=line_no, field="segments")
        if key in out:   # two records of one episode: the viewer would show the last only
            raise DataError(f"episode {key} is written twice", path=str(path), line=line_no)
        out[key] = segments
    return out


# ------------------------------------------------------------------------------- the viewer

_TAG = re.compile(r"&lt;(/?)(think|search|answer|information)&gt;")


def escape_html(text: Any) -> str:
    """Text made safe for HTML (None is empty)."""
    return html.escape("" if text is None else str(text), quote=True)


def _esc_tags(text: str) -> str:
    """Escape, then colour the protocol tags. Runs on escaped text and only matches the
    four fixed tag names, so nothing the model wrote can become markup."""
    return _TAG.sub(lambda m: f'<span class="tag">&lt;{m.group(1)}{m.group(2)}&gt;</span>',
                    escape_html(text))


def _fmt(value: Any, fmt: str = "{:.3f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def metrics_table_html(metrics: dict) -> str:
    """The metrics of an evaluation run as an HTML table, one row per data set."""
    columns = metric_columns(metrics)
    head = "".join(f"<th>{escape_html(label)}</th>" for _, label, _ in columns)
    body = []
    for name, row in _table_rows(metrics):
        cls = ' class="avg"' if name == "average" else ""
        cells = "".join(f"<td>{escape_html(cell(row, k, f))}</td>" for k, _, f in columns)
        body.append(f"<tr{cls}><th>{escape_html(name)}</th>{cells}</tr>")
    parts = [(f'<table class="metrics"><thead><tr><th>dataset</th>{head}</tr></thead>'
              f'<tbody>{"".join(body)}</tbody></table>')]
    by_type = metrics.get("by_type") or {}
    if by_type:
        rows = []
        for name, types in by_type.items():
            for type_name, row in types.items():
                cells = "".join(f"<td>{escape_html(cell(row, k, f))}</td>" for k, _, f in columns)
                rows.append(f"<tr><th>{escape_html(name)}</th><th>{escape_html(type_name)}</th>{cells}</tr>")
        parts.append(f'<h3>By question type</h3><table class="metrics"><thead><tr>'
                     f'<th>dataset</th><th>type</th>{head}</tr></thead>'
                     f'<tbody>{"".join(rows)}</tbody></table>')
    return "".join(parts)


def _hits_html(ids: Sequence[str], titles: Sequence[str], gold: set[str],
               by_title: bool = False) -> str:
    """The documents, gold ones marked: `gold` holds ids, or with `by_title` normalised
    supporting titles (HotpotQA, 2Wiki, MuSiQue), matched as `Trajectory.evidence_keys`
    matches them."""
    if not ids:
        return '<div class="hits none">no documents</div>'
    items = []
    titles = list(titles) + [""] * (len(ids) - len(titles))
    keys = title_keys(ids, titles) if by_title else list(ids)
    for doc_id, title, key in zip(ids, titles, keys):
        is_gold = key is not None and key in gold
        mark = '<span class="goldmark" title="gold document">&#9733; gold</span> ' \
            if is_gold else ""
        items.append(f'<li class="{"gold" if is_gold else ""}">{mark}{escape_html(title)} '
                     f'<code>{escape_html(doc_id)}</code></li>')
    return f'<ol class="hits">{"".join(items)}</ol>'


def _segment_html(seg: dict) -> str:
    trained = bool(seg.get("trained"))
    cls = "trained" if trained else "masked"
    label = f'{seg.get("kind", "?")} · {seg.get("tokens", "?")} tokens · ' \
            f'{"trained (loss mask 1)" if trained else "masked (loss mask 0)"}'
    return (f'<div class="seg {cls} k-{escape_html(seg.get("kind", ""))}"><div class="seglabel">'
            f'{escape_html(label)}</div><pre>{_esc_tags(seg.get("text", ""))}</pre></div>')


def _episode_html(t: Trajectory, segments: list[dict] | None, index: int,
                  open_: bool) -> str:
    em = exact_match(t.answer, t.golden_answers)
    f1 = f1_score(t.answer, t.golden_answers)
    gold, by_title = t.evidence_keys()[0], not t.gold_doc_ids
    supporting = given_titles(t.metadata) if isinstance(t.metadata, dict) else []
    searches = t.n_searches
    # a null type is none given ("(no type)" in the metrics), not the type "None"
    kind = t.metadata.get("type") if isinstance(t.metadata, dict) else None
    type_name = "" if kind is None else str(kind)
    reward = _fmt(t.outcome_reward, "{:g}")
    verdict = '<span class="ok">&#10003;</span>' if em == 1 else '<span class="bad">&#10007;</span>'
    answer = escape_html(t.answer) if t.answer is not None else '<i>no answer</i>'
    golds = " | ".join(escape_html(g) for g in t.golden_answers)
    recall = t.evidence_recall()
    summary = (f'<summary>{verdict} <span class="ds">{escape_html(t.dataset)}</span> '
               f'<span class="q">{escape_html(t.question)}</span> '
               f'<span class="arrow">&rarr;</span> <span class="ans">{answer}</span> '
               f'<span class="gold-ans">gold: {golds}</span> '
               f'<span class="stats">EM {em:g} · F1 {f1:.2f} · reward {reward} · '
               f'{searches} search{"es" if searches != 1 else ""} · {escape_html(t.finish_reason)}'
               f'</span></summary>')
    meta = (f'<div class="meta">id <code>{escape_html(t.example_id)}</code> · '
            f'sample {escape_html(t.sample_index)}'
            f' · {t.n_generated} generated of {len(t.token_ids)} tokens'
            + (f' · type {escape_html(type_name)}' if type_name else "")
            + (f' · gold docs {" ".join(f"<code>{escape_html(d)}</code>" for d in t.gold_doc_ids)}'
               if t.gold_doc_ids else "")
            + (f' · supporting titles {escape_html(" | ".join(map(str, supporting)))}'
               if by_title and gold else "")
            + (f' · evidence recall {_fmt(recall)}' if recall is not None else "")
            + '</div>')
    body = [meta]
    if t.prompt_hits:
        body.append('<div class="turnhead">retrieved with the question (in the prompt)</div>'
                    + _hits_html(t.prompt_hits, t.prompt_hit_titles or [], gold, by_title))
    by_step: dict[int | None, list[dict]] = {}
    if segments is not None:
        for seg in segments:
            by_step.setdefault(seg.get("step"), []).append(seg)
        for seg in by_step.get(None, []):
            if seg.get("kind") == "prompt":
                body.append(f'<details class="prompt"><summary>prompt · '
                            f'{escape_html(seg.get("tokens"))} tokens · masked</summary>'
                            f'{_segment_html(seg)}</details>')
    else:
        body.append(f'<div class="seg masked k-prompt"><div class="seglabel">prompt · '
                    f'{t.prompt_len} tokens · masked (text not stored: question shown)</div>'
                    f'<pre>{escape_html(t.question)}</pre></div>')
    for i, step in enumerate(t.steps):
        head = [f"turn {i + 1}",
                f'<span class="act act-{escape_html(step.action)}">{escape_html(step.action)}</span>']
        if step.query is not None:
            head.append(f'query <span class="query">{escape_html(step.query)}</span>')
        if step.reason:
            head.append(f'invalid: {escape_html(step.reason)}')
        if step.gold_hit is not None:
            head.append('gold hit &#10003;' if step.gold_hit else 'no gold hit')
        if step.process_reward is not None:
            parts = ", ".join(f"{escape_html(k)} {v:+.3g}" for k, v in
                              (getattr(step, "process_parts", None) or {}).items()
                              if v is not None)   # None: the source does not judge this step
            head.append(f'<span class="preward">process reward {step.process_reward:+.3g}'
                        + (f" ({parts})" if parts else "") + "</span>")
        if step.value is not None:
            head.append(f'<span class="pvalue">value {step.value:.3g}</span>')
        turn = [f'<div class="turnhead">{" · ".join(head)}</div>']
        segs = by_step.get(i) if segments is not None else None
        if segs is None:
            segs = [{"kind": "generated", "tokens": step.end - step.start, "trained": True,
                     "text": step.text}]
        hits_shown = not step.hits
        for seg in segs:  # the hits go just before the block that shows their text
            if not hits_shown and seg.get("kind") in ("information", "correction"):
                turn.append(_hits_html(step.hits, step.hit_titles, gold, by_title))
                hits_shown = True
            turn.append(_segment_html(seg))
        if not hits_shown:  # no block (no episodes file, or the episode ran out of room)
            turn.append(_hits_html(step.hits, step.hit_titles, gold, by_title))
        body.append(f'<div class="turn">{"".join(turn)}</div>')
    for seg in by_step.get(None, []):
        if seg.get("kind") != "prompt":
            body.append(_segment_html(seg))
    body.append(f'<div class="verdict {"right" if em == 1 else "wrong"}">answer '
                f'<b>{answer}</b> · gold {golds} · EM {em:g} · F1 {f1:.2f} · '
                f'reward {reward} · finish {escape_html(t.finish_reason)}</div>')
    attrs = (f'data-dataset="{escape_html(t.dataset)}" data-correct="{int(em == 1)}" '
             f'data-searches="{searches}" data-type="{escape_html(type_name)}" '
             f'data-text="{escape_html((t.question + " " + (t.answer or "")).lower())}"')
    return (f'<details class="ep" id="ep{index}" {attrs}{" open" if open_ else ""}>'
            f'{summary}<div class="body">{"".join(body)}</div></details>')


VIEWER_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#1d232a;background:#fff}
header{background:#1f3a5f;color:#fff;padding:14px 22px}
header h1{margin:0;font-size:20px}header .cfg{font-size:12.5px;opacity:.9;margin-top:4px}
main{padding:14px 22px}
table.metrics{border-collapse:collapse;margin:6px 0 14px;font-size:13px}
table.metrics th,table.metrics td{border:1px solid #c9d2dc;padding:4px 9px;text-align:right}
table.metrics thead th{background:#e8eef5;text-align:center}
table.metrics tbody th{text-align:left;background:#f5f7fa}
table.metrics tr.avg td,table.metrics tr.avg th{font-weight:700;background:#fff6df}
.legend span{display:inline-block;padding:1px 8px;margin-right:8px;border-radius:3px}
.filters{position:sticky;top:0;background:#f5f7fa;border:1px solid #d8dee6;padding:8px 10px;
 margin:10px 0;display:flex;gap:14px;flex-wrap:wrap;align-items:center;z-index:2}
.filters input[type=search]{width:220px}
details.ep{border:1px solid #d8dee6;border-radius:5px;margin:6px 0;background:#fff}
details.ep>summary{cursor:pointer;padding:6px 10px;list-style-position:outside}
details.ep[open]>summary{background:#f1f4f8;border-bottom:1px solid #d8dee6}
.ok{color:#1a7f37;font-weight:700}.bad{color:#c62828;font-weight:700}
.ds{background:#e3e9f2;border-radius:3px;padding:0 6px;font-size:12px}
.q{font-weight:600}.ans{color:#0b4f9c;font-weight:600}.gold-ans{color:#555;font-size:12.5px}
.stats{color:#666;font-size:12px;margin-left:6px}
.body{padding:8px 12px}.meta{color:#555;font-size:12.5px;margin-bottom:6px}
.turn{border-left:3px solid #9db4d0;padding:2px 0 2px 10px;margin:8px 0}
.turnhead{font-size:12.5px;color:#333;margin:4px 0}
.act{font-weight:700;padding:0 5px;border-radius:3px}
.act-search{background:#dbeafe}.act-answer{background:#dcfce7}.act-invalid{background:#fee2e2}
.query{font-family:ui-monospace,monospace;background:#eef2ff;padding:0 4px}
.preward{background:#f3ecff;padding:0 4px;border-radius:3px}
.pvalue{background:#e8f6ee;padding:0 4px;border-radius:3px}
.seg{border-radius:4px;margin:4px 0;padding:3px 8px}
.seg pre{margin:2px 0;white-space:pre-wrap;word-break:break-word;
 font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
.seglabel{font-size:11px;color:#555}
.trained{background:#e6f6e6;border:1px solid #a7d8a7}
.masked{background:#eef0f3;border:1px solid #d3d8de}
.k-information.masked,.k-correction.masked{background:#f3efe6;border-color:#dccfae}
.tag{color:#8a3ffc;font-weight:700}
ol.hits{margin:3px 0 3px 18px;padding:0;font-size:12.5px}ol.hits li.gold{background:#fff3c4}
.goldmark{color:#a36b00;font-weight:700}.hits.none{color:#777;font-size:12.5px}
details.prompt>summary{cursor:pointer;font-size:12.5px;color:#555}
.verdict{margin-top:6px;padding:4px 8px;border-radius:4px;font-size:13px}
.verdict.right{background:#dcfce7}.verdict.wrong{background:#fde2e2}
code{font-size:12px;background:#f2f2f2;padding:0 3px;border-radius:2px}
.note{color:#777;font-size:12.5px}
"""

_JS = """
(function(){
  var eps=[].slice.call(document.querySelectorAll('details.ep'));
  var wrong=document.getElementById('f-wrong'),ds=document.getElementById('f-dataset'),
      ns=document.getElementById('f-searches'),ty=document.getElementById('f-type'),
      q=document.getElementById('f-text'),count=document.getElementById('f-count');
  // the filter state lives in the URL hash (#wrong=1&dataset=nq&searches=2&type=&q=),
  // so a filtered view can be shared as a link
  function readHash(){
    var h={};
    location.hash.replace(/^#/,'').split('&').forEach(function(kv){
      var i=kv.indexOf('=');
      try{ if(i>0) h[decodeURIComponent(kv.slice(0,i))]=
        decodeURIComponent(kv.slice(i+1).replace(/[+]/g,' ')); }
      catch(e){}   // a malformed %-escape (a hand-edited link): that filter left unset
    });
    wrong.checked=h.wrong==='1';
    [[ds,'dataset'],[ns,'searches'],[ty,'type'],[q,'q']].forEach(function(p){
      if(p[0]&&h[p[1]]!==undefined) p[0].value=h[p[1]]; });
  }
  function writeHash(){
    var parts=[];
    if(wrong.checked) parts.push('wrong=1');
    [[ds,'dataset'],[ns,'searches'],[ty,'type'],[q,'q']].forEach(function(p){
      if(p[0]&&p[0].value) parts.push(p[1]+'='+encodeURIComponent(p[0].value)); });
    try{ history.replaceState(null,'',parts.length?'#'+parts.join('&'):location.pathname); }
    catch(e){}
  }
  function apply(){
    var n=0,text=q.value.trim().toLowerCase();
    eps.forEach(function(el){
      var d=el.dataset,s=parseInt(d.searches,10);
      var ok=(!wrong.checked||d.correct==='0')&&(!ds.value||d.dataset===ds.value)&&
        (ns.value===''||(ns.value==='3+'?s>=3:s===parseInt(ns.value,10)))&&
        (!ty||!ty.value||d.type===ty.value)&&(!text||d.text.indexOf(text)>=0);
      el.hidden=!ok; if(ok) n++;
    });
    count.textContent=n+' of '+eps.length+' episodes shown';
  }
  function changed(){ apply(); writeHash(); }
  [wrong,ds,ns,ty,q].forEach(function(el){ if(el){ el.addEventListener('input',changed);
    el.addEventListener('change',changed);} });
  window.addEventListener('hashchange',function(){ readHash(); apply(); });
  document.getElementById('f-open').addEventListener('click',function(){
    eps.forEach(function(el){ if(!el.hidden) el.open=true; }); });
  document.getElementById('f-close').addEventListener('click',function(){
    eps.forEach(function(el){ el.open=false; }); });
  readHash(); apply();
})();
"""


def _select(id_: str, label: str, options: Iterable[tuple[str, str]]) -> str:
    opts = "".join(f'<option value="{escape_html(v)}">{escape_html(text)}</option>' for v, text in options)
    return f'<label>{escape_html(label)} <select id="{id_}"><option value="">all</option>{opts}' \
           f'</select></label>'


def render_viewer(trajectories: Sequence[Trajectory], metrics: dict | None = None,
                  episodes: dict[str, list[dict]] | None = None, *, title: str = "seekrl run",
                  open_first: int = 3, max_episodes: int | None = None) -> str:
    """The viewer page as one HTML string (inline CSS and JS, no external assets).

    `episodes` maps `episode_key(...)` to decoded segments (see `decode_segments`); an
    episode without them shows its generated text and retrieved titles only."""
    shown = list(trajectories if max_episodes is None else trajectories[:max_episodes])
    datasets = list(dict.fromkeys(t.dataset for t in shown))
    searches = sorted({t.n_searches for t in shown})
    types = sorted({str(t.metadata.get("type")) for t in shown
                    if isinstance(t.metadata, dict) and t.metadata.get("type") is not None})
    search_opts = [(str(s), str(s)) for s in searches if s < 3]
    if any(s >= 3 for s in searches):
        search_opts.append(("3+", "3 or more"))
    filters = [
        '<label><input type="checkbox" id="f-wrong"> wrong only</label>',
        _select("f-dataset", "dataset", [(d, d) for d in datasets]),
        _select("f-searches", "searches", search_opts),
    ]
    if types:
        filters.append(_select("f-type", "type", [(t, t) for t in types]))
    filters += [('<label>text <input type="search" id="f-text" '
                 'placeholder="question or answer"></label>'),
                '<button id="f-open" type="button">expand shown</button>',
                '<button id="f-close" type="button">collapse all</button>',
                '<span id="f-count" class="note"></span>']
    cfg_line = ""
    if metrics and metrics.get("config"):
        cfg_line = f'<div class="cfg">{escape_html(config_line(metrics["config"]))}</div>'
    parts = [f'<header><h1>{escape_html(title)}</h1>{cfg_line}</header><main>']
    if metrics:
        parts.append("<h2>Metrics</h2>" + metrics_table_html(metrics))
    parts.append('<div class="legend">tokens: <span class="trained">policy-generated, trained '
                 '(loss mask 1)</span><span class="masked">prompt, masked</span>'
                 '<span class="seg k-information masked">information / correction from the '
                 'environment, masked</span><span style="background:#fff3c4">&#9733; gold '
                 'document</span></div>')
    note = "" if max_episodes is None or len(trajectories) <= max_episodes else \
        f' <span class="note">(first {max_episodes} of {len(trajectories)}: `seekrl inspect` ' \
        'with a higher --limit for more)</span>'
    parts.append(f'<h2>Episodes{note}</h2><div class="filters">{"".join(filters)}</div>')
    for i, t in enumerate(shown):
        segs = None if episodes is None else \
            episodes.get(episode_key(t.dataset, t.example_id, t.sample_index))
        parts.append(_episode_html(t, segs, i, i < open_first))
    parts.append("</main>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{escape_html(title)}"
            f"</title><style>{VIEWER_CSS}</style></head><body>{''.join(parts)}"
            f"<script>{_JS}</script></body></html>\n")


def write_viewer(run_dir: str | Path, out: str | Path | None = None, *, tokenizer=None,
                 max_episodes: int | None = None) -> Path:
    """Render RUN_DIR (metrics.json, trajectories.jsonl, episodes.jsonl) to one HTML file;
    default RUN_DIR/viewer.html. `tokenizer` decodes episodes when episodes.jsonl is absent."""
    run_dir = Path(run_dir)
    traj_path = run_dir / TRAJECTORIES_FILE
    if not traj_path.is_file():
        raise FileNotFoundError(f"{traj_path}: no trajectories (is {run_dir} an eval run?)")
    trajectories = read_trajectories(traj_path)
    metrics = None
    if (run_dir / METRICS_FILE).is_file():
        try:
            metrics = json.loads((run_dir / METRICS_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise DataError(f"not valid JSON ({err.msg})", path=str(run_dir / METRICS_FILE),
                            line=err.lineno) from None
        metrics = check_metrics(metrics, run_dir / METRICS_FILE)   # the viewer indexes it
    episodes = None
    if (run_dir / EPISODES_FILE).is_file():
        episodes = read_episodes(run_dir / EPISODES_FILE)
    elif tokenizer is not None:
        episodes = {episode_key(t.dataset, t.example_id, t.sample_index):
                    decode_segments(t, tokenizer) for t in trajectories}
    out = Path(out) if out is not None else run_dir / "viewer.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    page = render_viewer(trajectories, metrics, episodes, title=f"seekrl run: {run_dir.name}",
                         max_episodes=max_episodes)
    out.write_text(page, encoding="utf-8")
    return out
