"""mkdocs hooks (mkdocs.yml `hooks:`): pages that live outside docs/ join the site.

The dated benchmark log stays where the benchmarks write it, `bench/RESULTS.md` (with the
figures it shows), and is served as the page `bench/RESULTS.md` of the site, so the
results page links into its sections and `mkdocs build --strict` checks those links. The
pages link to it as `../bench/RESULTS.md`, its place in the repository, so the links also
open on a code host; on the site they point at the served page.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
LOG = "bench/RESULTS.md"
IN_REPO = re.compile(r"\]\(\.\./bench/RESULTS\.md")   # a docs/ page's link to the log


def figures(log: Path = ROOT / LOG) -> list[str]:
    """The PNGs the log links to (relative to bench/), so a new figure needs no edit here."""
    return sorted({f"bench/{m}" for m in re.findall(r"\]\(([^)\s#]+\.png)\)", log.read_text())})


def on_files(files, config):
    for path in (LOG, *figures()):
        if (ROOT / path).is_file() and files.get_file_from_path(path) is None:
            files.append(File(path, src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    # the log sits at the site's bench/RESULTS.md, beside the pages of docs/ (not one up)
    if page.file.src_uri.count("/") == 0:
        return IN_REPO.sub("](" + LOG, markdown)
    return markdown
