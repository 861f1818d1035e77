"""The documentation: the site builds strictly, the configuration reference is the schema's,
the README stays short and names only what exists, and the own-data page runs as written
(at a tiny size)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def _fenced(text: str, lang: str) -> list[str]:
    """The bodies of the ```lang blocks of a markdown text, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _seekrl_commands(block: str) -> list[list[str]]:
    """The `seekrl ...` command lines of a shell block (continuations joined), as words."""
    text = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"&&|;|\|", line):
            words = part.split()
            while words and ("=" in words[0] and not words[0].startswith("-")):
                words = words[1:]   # VAR=value before the command
            if words and words[0] in ("seekrl", ".venv/bin/seekrl"):
                out.append(words)
    return out


def test_config_reference_is_the_schemas():
    """docs/reference/configuration.md is what tools/gen_config_docs.py writes from
    config.py now (in a fresh process: the registries it lists are the built-in ones)."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_config_docs.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, (r.stderr or r.stdout) + \
        "\nrun: .venv/bin/python tools/gen_config_docs.py"


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, or a page missing from the nav,
    fails the build (mkdocs.yml's `validation:`)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed "
                                           "(pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site"), "--config-file", str(ROOT / "mkdocs.yml")],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "own-data" / "index.html").is_file()
    assert (tmp_path / "site" / "bench" / "RESULTS" / "index.html").is_file()


def test_every_page_is_in_the_nav():
    """Also without mkdocs installed: every page under docs/ is named in mkdocs.yml's nav,
    and every page the nav names exists (or is the dated log the hook adds)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)   # !!python tags
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"]

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for v in node.values() for p in pages(v)]
        return []

    named = set(pages(nav))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk - named == set(), "pages missing from mkdocs.yml's nav"
    assert named - on_disk == {"bench/RESULTS.md"}, "nav names pages that do not exist"
    assert (ROOT / "bench" / "RESULTS.md").is_file()


def test_the_readme_is_short_and_true():
    """The README stays under 300 lines; its relative links name files of the repository,
    its `seekrl` commands name real commands and options, its `make` targets exist."""
    from typer.main import get_command

    from seekrl.cli import app

    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
        # its anchors: test_heading_links_open_on_github_and_on_the_site
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"(?:^|`)make ([a-z][\w-]*)", text, re.M)):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}"

    cli = get_command(app)
    texts = [text] + [p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md"))]
    checked = 0
    for doc in texts:
        for block in _fenced(doc, "bash"):
            for words in _seekrl_commands(block):
                command, rest = cli, words[1:]
                while rest and hasattr(command, "commands") and rest[0] in command.commands:
                    command, rest = command.commands[rest[0]], rest[1:]
                assert not hasattr(command, "commands"), f"not a command: {' '.join(words)}"
                options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
                for word in rest:
                    if word.startswith("--"):
                        assert word.split("=")[0] in options, \
                            f"{' '.join(words[:3])}: no option {word}"
                checked += 1
    assert checked > 40


def _github_slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, each space a hyphen (two
    spaces around a dropped dash give two hyphens)."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_heading_links_open_on_github_and_on_the_site():
    """A link into a page's heading (docs/*.md and the README, into any .md) names an anchor
    that GitHub and the site (mkdocs' slugify) both give the heading: "A — B" gives
    `a--b` on GitHub and `a-b` on the site, so a link to it breaks on one of them."""
    from markdown.extensions.toc import slugify

    pages = [README, *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([^)\s]+)\)", text):
            heads = re.findall(r"^#+ (.+)$", (page.parent / target).read_text(encoding="utf-8"),
                               re.M)
            both = {_github_slug(h) for h in heads} & {slugify(re.sub(r"[`*]", "", h), "-")
                                                       for h in heads}
            if anchor not in both:
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, "anchors that one of GitHub and the site lacks:\n" + "\n".join(broken)


@pytest.mark.slow
def test_the_own_data_page_runs_as_written(tmp_path):
    """Every shell block of docs/own-data.md, in order, in one bash, with the tiny random
    model in place of the bundled one and the step counts cut to a few: each substitution
    below must find its text in the page, so a change to the page that escapes them fails
    here rather than running at full size."""
    from seekrl.models import tiny_policy

    page = (DOCS / "own-data.md").read_text(encoding="utf-8")
    script = "\n".join(_fenced(page, "bash"))
    model, tok = tiny_policy(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    tiny = str(tmp_path / "tiny")
    # (pattern in the page, what the test runs instead)
    smaller = [(r"\bsmollm2-135m\b", tiny),
               (r"(?<![\w.])max_steps=20\b", "max_steps=1"),
               (r"(?<![\w.])steps=10\b", "steps=1"),
               (r"(?<![\w.])samples=8\b", "samples=1"),
               (r"(?<![\w.])questions_per_step=8\b", "questions_per_step=2"),
               (r"(?<![\w.])group_size=4\b", "group_size=2"),
               (r"(?<![\w.])train_layers=16\b", "train_layers=1")]
    for pattern, instead in smaller:
        script, n = re.subn(pattern, instead, script)
        assert n, f"docs/own-data.md no longer holds {pattern!r}: update this test"
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "configs"):   # the page runs from the repository root
        (work / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    assert shutil.which("seekrl", path=env["PATH"]), "no seekrl command beside this python"
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    # the page says so: RL on the questions the warm-up passed over is warned about
    assert "training questions are in" in " ".join((r.stdout + r.stderr).split())
    own = work / "runs" / "own"
    for path in ("index/manifest.json", "eval-start/metrics.json", "rft/rft_data.jsonl",
                 "oracle.jsonl", "sft/final", "rl/final", "rl/metrics.jsonl",
                 "eval-rl/metrics.json", "eval-rl/viewer.html", "rl/report.html"):
        assert (own / path).exists(), path
    assert len((own / "oracle.jsonl").read_text().splitlines()) == 8
