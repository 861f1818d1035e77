"""The label format of process supervision, written and read in one place: `seekrl mcts`
appends whole chunks to `nodes.jsonl`, `labels.jsonl` (episodes with a soft label Q on
their steps) and `pairs.jsonl` (sibling pairs) and records them in `progress.json`; the PRM
and step-DPO read them back up to what was recorded, every record checked field by field
(a bad one names its file, line and field)."""

from __future__ import annotations

import json
import logging
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seekrl.agent.trajectory import Trajectory, checked_trajectory, is_number
from seekrl.data.jsonl import iter_jsonl
from seekrl.errors import ConfigError, DataError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- the output folder
@dataclass
class SearchStats:
    simulations: int = 0
    rollouts: int = 0                # episodes generated
    generated_tokens: int = 0        # policy tokens generated (the compute)
    rounds: int = 0
    seconds: float = 0.0


@dataclass
class Labels:
    """What one chunk of questions produced, as JSON-ready records."""
    nodes: list[dict] = field(default_factory=list)
    labels: list[dict] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1


LABEL_FILES = ("nodes.jsonl", "labels.jsonl", "pairs.jsonl")


class LabelWriter:
    """Appends whole chunks to `nodes.jsonl`, `labels.jsonl`, `pairs.jsonl` and records them
    in `progress.json` (atomically, after the data is on disk). Opening an existing folder
    with `resume` cuts the files back to the last recorded chunk and remembers which
    questions are done; without `resume`, an existing folder is refused."""

    def __init__(self, out: str | Path, *, resume: bool = False, settings: dict | None = None):
        self.out = Path(out)
        self.progress_path = self.out / "progress.json"
        if self.progress_path.exists() and not resume:
            raise FileExistsError(f"{self.out} already holds labels; resume them (--resume) "
                                  "or choose another folder")
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress: dict = {"done": [], "bytes": {f: 0 for f in LABEL_FILES},
                               "stats": {}, "rejected": {}, "settings": settings or {}}
        if resume and self.progress_path.exists():
            self.progress = _read_progress(self.progress_path)
            before = self.progress.get("settings") or {}
            # keys both runs recorded: a key one side lacks was added to (or removed from)
            # LabelConfig since, and its value in the old run is not known
            differ = sorted(k for k in set(settings) & set(before)
                            if settings[k] != before[k]) if settings and before else []
            if differ:
                raise ValueError(f"{self.out}: resuming with other settings than the run "
                                 f"that wrote it (differ: {', '.join(differ)})")
        for name in LABEL_FILES:   # drop whatever a killed run wrote after its last chunk
            path = self.out / name
            recorded = self.progress["bytes"].get(name, 0)
            size = path.stat().st_size if path.exists() else 0
            if size < recorded:   # a missing file too: truncate() would fill it with zeros
                raise ValueError(f"{path}: {size if path.exists() else 'missing'} "
                                 f"{'bytes' if path.exists() else 'file'}, but {recorded} "
                                 "bytes were recorded as written; the folder was changed "
                                 "since, label into a new one")
            with open(path, "ab") as f:
                f.truncate(recorded)

    @property
    def done(self) -> set[str]:
        return set(self.progress["done"])

    def check_tokenizer(self, fingerprint: str) -> None:
        """The labels hold token ids: a resumed folder keeps one tokenizer, and the PRM
        trained on them must read the same one (`models.tokenizer_fingerprint`)."""
        had = self.progress.get("tokenizer")
        if had is not None and had != fingerprint:
            raise ValueError(f"{self.out}: labelled with another tokenizer (fingerprint {had}, "
                             f"this policy's is {fingerprint}); label into a new folder")
        self.progress["tokenizer"] = fingerprint

    def write(self, question_ids: Sequence[str], labels: Labels, stats: SearchStats) -> None:
        for name, records in zip(LABEL_FILES, (labels.nodes, labels.labels, labels.pairs)):
            path = self.out / name
            with open(path, "a", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.progress["bytes"][name] = path.stat().st_size
        self.progress["done"] += list(question_ids)
        total = self.progress["stats"]
        for k, v in vars(stats).items():
            total[k] = round(total.get(k, 0) + v, 3)
        total["pairs"] = total.get("pairs", 0) + len(labels.pairs)
        total["labelled_episodes"] = total.get("labelled_episodes", 0) + len(labels.labels)
        total["nodes"] = total.get("nodes", 0) + len(labels.nodes)
        for k, v in labels.rejected.items():
            self.progress["rejected"][k] = self.progress["rejected"].get(k, 0) + v
        self.save_progress()

    def save_progress(self) -> None:
        """`progress.json` replaced whole (after the chunk it records is on disk)."""
        tmp = self.progress_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.progress, indent=1))
        os.replace(tmp, self.progress_path)


# ---------------------------------------------------------------------- labelled data
@dataclass
class PointLabel:
    traj: Trajectory
    index: int          # which step
    label: float        # soft label in [0, 1] (Q)


@dataclass
class PairLabel:
    better: Trajectory
    worse: Trajectory
    index: int          # the differing step (both share the steps before it)
    gap: float


@dataclass
class LabelSet:
    points: list[PointLabel]
    pairs: list[PairLabel]
    episodes: list[Trajectory]     # every labelled episode (first-error localisation)


def _in_dev(example_id: str, dev_share: float) -> bool:
    return zlib.crc32(example_id.encode()) % 10_000 < dev_share * 10_000


def labelled_trajectory(obj: Any, path: Path, line: int, field: str = "", *,
                        labels: bool = True) -> Trajectory:
    """A labelled episode record checked field by field (`checked_trajectory`); `labels=False`
    for episodes to score (their step values are not read)."""
    return checked_trajectory(obj, path, line, field, labels=labels)


def read_episodes(path: str | Path) -> list[Trajectory]:
    """A trajectory file to score (`seekrl prm score`), every record checked like a label's."""
    path = Path(path)
    return [labelled_trajectory(obj, path, line, labels=False) for line, obj in iter_jsonl(path)]


def _read_progress(path: Path) -> dict:
    """A label folder's `progress.json`, its shape checked: a file cut short or edited is a
    DataError naming it, not a bare JSONDecodeError or KeyError."""
    try:
        progress = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"not JSON ({e}); written by `seekrl mcts`: label into a new folder",
                        path=str(path)) from None
    if not isinstance(progress, dict) or not isinstance(progress.get("bytes"), dict) \
            or not isinstance(progress.get("done"), list):
        raise DataError('expected {"done": [...], "bytes": {...}, ...} (written by `seekrl '
                        'mcts`)', path=str(path))
    return progress


def _recorded_lines(folder: Path, name: str):
    """`iter_jsonl` over a label file, up to the bytes `progress.json` records as written:
    the tail of a chunk a killed `seekrl mcts` left behind is not a label."""
    path = folder / name
    progress = folder / "progress.json"
    limit = None
    if progress.is_file():
        recorded = _read_progress(progress)["bytes"]
        limit = recorded.get(name)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise DataError("expected {\"bytes\": {\"%s\": N, ...}}, N a count of bytes "
                            "(written by `seekrl mcts`), got %r" % (name, limit),
                            path=str(progress), field="bytes")
        size = path.stat().st_size if path.exists() else 0
        if size < limit:   # a missing file too: its recorded labels would vanish unsaid
            raise DataError(f"{f'{size} bytes' if path.exists() else 'missing'}, but {limit} "
                            "bytes were recorded as written: the file was changed since; "
                            "label into a new folder", path=str(path))
        if size > limit:   # a run killed mid-write, or lines added by hand: not read
            log.warning("%s: reading the first %d bytes, which %s records as written; the "
                        "%d after them (a record cut off by a kill, or lines added since) "
                        "are left out", path, limit, progress, size - limit)
    yield from iter_jsonl(path, max_bytes=limit)


def _recorded_bytes(folder: Path, name: str) -> int:
    """The bytes of `name` the folder's `progress.json` records as written (0 without one)."""
    progress = folder / "progress.json"
    if not progress.is_file():
        return 0
    value = _read_progress(progress)["bytes"].get(name, 0)
    return value if isinstance(value, int) else 0


def read_labels(folders: Sequence[str | Path]) -> LabelSet:
    """Points, pairs and episodes of label folders (`labels.jsonl`, `pairs.jsonl`), up to
    what each folder's `progress.json` records as written. A malformed record raises
    `DataError` naming its file, line and field."""
    points: list[PointLabel] = []
    pairs: list[PairLabel] = []
    episodes: list[Trajectory] = []
    seen: set[tuple] = set()
    listed: dict[Path, str] = {}
    for folder in folders:
        folder = Path(folder)
        if folder.resolve() in listed:   # its labels would count twice
            raise ValueError(f"labels: {folder} is listed twice (as "
                             f"{listed[folder.resolve()]} too)")
        listed[folder.resolve()] = str(folder)
        if not (folder / "labels.jsonl").is_file():
            raise FileNotFoundError(f"{folder}: no labels.jsonl (write labels with "
                                    "`seekrl mcts`)")
        path = folder / "labels.jsonl"
        for line_no, obj in _recorded_lines(folder, "labels.jsonl"):
            t = labelled_trajectory(obj, path, line_no)
            episodes.append(t)
            node_ids = t.metadata.get("node_ids")
            for i, s in enumerate(t.steps):
                if s.value is None:
                    continue
                key = (str(folder), t.example_id, node_ids[i]) if node_ids and \
                    node_ids[i] is not None else (str(folder), line_no, i)
                if key not in seen:
                    seen.add(key)
                    points.append(PointLabel(t, i, float(s.value)))
        if (folder / "pairs.jsonl").is_file() or _recorded_bytes(folder, "pairs.jsonl"):
            path = folder / "pairs.jsonl"
            for line_no, rec in _recorded_lines(folder, "pairs.jsonl"):
                pairs.append(_pair_label(rec, path, line_no))
    return LabelSet(points, pairs, episodes)


def _pair_label(rec: dict, path: Path, line: int) -> PairLabel:
    """A sibling-pair record: two episodes that share their steps before `depth` and
    differ at it, with `gap` = Q(better) - Q(worse)."""
    for key in ("better", "worse", "depth", "gap"):
        if key not in rec:
            raise DataError("missing (a sibling pair has better, worse, depth, gap)",
                            path=str(path), line=line, field=key)
    better = labelled_trajectory(rec["better"], path, line, "better")
    worse = labelled_trajectory(rec["worse"], path, line, "worse")
    depth, gap = rec["depth"], rec["gap"]
    if not isinstance(depth, int) or isinstance(depth, bool) or \
            not 0 <= depth < min(len(better.steps), len(worse.steps)):
        raise DataError(f"expected a step index below both episodes' step counts "
                        f"({len(better.steps)}, {len(worse.steps)}), got {depth!r}",
                        path=str(path), line=line, field="depth")
    if not is_number(gap) or not 0 < gap < math.inf:
        # the better step's Q minus the worse's: a pair whose gap is not above zero says
        # its "worse" is as good or better, and step-DPO would learn it the wrong way round
        raise DataError(f"expected Q(better) - Q(worse), a number above 0, got {gap!r}",
                        path=str(path), line=line, field="gap")
    if better.example_id != worse.example_id:
        raise DataError(f"better is an episode of {better.example_id!r}, worse of "
                        f"{worse.example_id!r}: a pair is two episodes of one question",
                        path=str(path), line=line, field="worse.example_id")
    shared = better.steps[depth].start
    if better.steps[depth].start != worse.steps[depth].start or \
            better.token_ids[:shared] != worse.token_ids[:shared]:
        raise DataError(f"better and worse differ before step {depth}: not siblings",
                        path=str(path), line=line, field="depth")
    return PairLabel(better, worse, depth, float(gap))


def split_labels(labels: LabelSet, dev_share: float) -> tuple[LabelSet, LabelSet]:
    """(train, dev) by question: all labels of a question fall on the same side."""
    def side(dev: bool) -> LabelSet:
        return LabelSet([p for p in labels.points if _in_dev(p.traj.example_id, dev_share) == dev],
                        [p for p in labels.pairs if _in_dev(p.better.example_id, dev_share) == dev],
                        [e for e in labels.episodes if _in_dev(e.example_id, dev_share) == dev])
    return side(False), side(True)


def labelling_policy(folders: Sequence[str | Path]) -> str:
    """The policy that wrote the first label folder (its config.yaml's `model`): the PRM's
    default backbone, as in ProRAG (the PRM starts from the SFT policy)."""
    import yaml

    path = Path(folders[0]) / "config.yaml"
    try:
        model = (yaml.safe_load(path.read_text()) or {}).get("model")
    except (OSError, yaml.YAMLError, AttributeError):
        model = None
    if not isinstance(model, str) or not model:
        raise ConfigError(f"model: the backbone to start the PRM from was not given, and "
                          f"{path} does not name the policy that wrote the labels; set "
                          f"model=PATH_OR_ID (usually the SFT checkpoint)")
    return model


def check_label_tokenizer(folders: Sequence[str | Path], tokenizer, who: str) -> None:
    """Labels are token ids: refuse a model whose tokenizer is not the one that wrote them
    (recorded in progress.json by `seekrl mcts`; folders without the record pass)."""
    from seekrl.models import tokenizer_fingerprint

    mine = tokenizer_fingerprint(tokenizer)
    for folder in folders:
        path = Path(folder) / "progress.json"
        if not path.is_file():
            continue
        try:
            theirs = json.loads(path.read_text()).get("tokenizer")
        except (ValueError, AttributeError):
            continue    # read_labels has already checked the file
        if theirs is not None and theirs != mine:
            raise ConfigError(f"{who}: its tokenizer (fingerprint {mine}) is not the one that "
                              f"wrote the labels in {folder} ({theirs}); a PRM reads the labels' "
                              "token ids, so its backbone must share the policy's tokenizer")
