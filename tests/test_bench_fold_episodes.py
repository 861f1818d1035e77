"""bench/fold_episodes.py: a records folder's episode files folded into one archive, and
put back whole by `tar xJf`."""

from __future__ import annotations

import gzip
import subprocess
import tarfile

import pytest
from conftest import load_bench


def test_episodes_fold_into_one_archive_that_tar_puts_back(tmp_path, capsys):
    fold = load_bench("fold_episodes")
    records = tmp_path / "records"
    texts = {"hops-s0/eval-step-10": b'{"id": "q1", "answer": "Ann"}\n' * 50,
             "eval-sft-test": b'{"id": "q2", "answer": "Bo"}\n' * 50}
    for where, text in texts.items():
        (records / where).mkdir(parents=True)
        (records / where / "episodes.jsonl.gz").write_bytes(gzip.compress(text))
        (records / where / "metrics.json").write_text("{}")
    fold.main([str(records)])
    assert "folded=2" in capsys.readouterr().out
    assert not list(records.rglob("episodes.jsonl.gz"))
    assert (records / "hops-s0/eval-step-10/metrics.json").is_file()   # the rest stays
    # a later keep writes a run's files again, and a new run's: the archive is added to,
    # a file folded again replaces its copy
    texts["hops-s0/eval-step-10"] = b'{"id": "q1", "answer": "Cy"}\n'
    texts["hops-s1/eval-start"] = b'{"id": "q3", "answer": "Di"}\n'
    for where in ("hops-s0/eval-step-10", "hops-s1/eval-start"):
        (records / where).mkdir(parents=True, exist_ok=True)
        (records / where / "episodes.jsonl.gz").write_bytes(gzip.compress(texts[where]))
    fold.main([str(records)])
    with tarfile.open(records / "episodes.tar.xz") as tar:
        assert sorted(tar.getnames()) == sorted(f"./{w}/episodes.jsonl" for w in texts)
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["tar", "xJf", str(records / "episodes.tar.xz"), "-C", str(back)],
                   check=True)
    for where, text in texts.items():
        assert (back / where / "episodes.jsonl").read_bytes() == text
    # a damaged file is named, and nothing is folded or removed
    (records / "bad").mkdir()
    (records / "bad" / "episodes.jsonl.gz").write_bytes(b"not gzip")
    before = (records / "episodes.tar.xz").read_bytes()
    with pytest.raises(SystemExit, match="bad/episodes.jsonl.gz: not a readable gzip"):
        fold.main([str(records)])
    assert (records / "episodes.tar.xz").read_bytes() == before
    assert (records / "bad" / "episodes.jsonl.gz").is_file()
