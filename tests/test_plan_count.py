"""bench/plan_count.py: bad input is named before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "plan_count.py"


def test_questions_without_hops_are_named_by_file_and_line(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "a", "metadata": {"type": "bridge", "hops": 2}})
                         + "\n" + json.dumps({"id": "b", "metadata": {"type": "single"}}) + "\n")
    episodes = tmp_path / "e.jsonl"
    episodes.write_text("")
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", str(tmp_path / "absent"),
                           "--episodes", str(episodes), "--questions", str(questions)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"{questions}:2: expected metadata.type and metadata.hops" in done.stderr
