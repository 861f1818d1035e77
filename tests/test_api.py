"""The public Python API: `from seekrl import ...` for what a notebook needs."""

from __future__ import annotations

import gc

import pytest

import seekrl


def test_every_public_name_resolves():
    for name in seekrl.__all__:
        assert getattr(seekrl, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        seekrl.nope  # noqa: B018


def test_an_index_from_documents_in_memory_searches_and_cleans_up():
    from pathlib import Path

    docs = [{"id": "d1", "contents": "Tarrow\nTarrow is a city on the river Ilse."},
            ("d2", "Ilsa Marrow\nIlsa Marrow was born in Tarrow in 1901."),
            {"id": "d3", "contents": "Noise\nNothing to see here."}]
    index = seekrl.index_documents(docs)
    hits = index.search(["Where was Ilsa Marrow born?"], 2)[0]
    assert hits[0].doc_id == "d2" and hits[0].title == "Ilsa Marrow"
    folder = Path(index.path).parent
    assert folder.is_dir()
    del index, hits
    gc.collect()
    assert not folder.exists()
    with pytest.raises(seekrl.SeekrlError, match="document 1"):
        seekrl.index_documents([{"id": 1, "contents": "x"}])


@pytest.mark.slow
def test_the_readme_python_example_runs():
    """The "From Python" block of docs/getting-started.md, as written, with the real
    bundled model."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
    (code,) = re.findall(r"```python\n(import seekrl\n.*?)```", page.read_text(), re.S)
    scope: dict = {}
    exec(compile(code, str(page), "exec"), scope)
    episodes = scope["episodes"]
    assert len(episodes) == 4 and all(t.finish_reason for t in episodes)
