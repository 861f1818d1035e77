"""Terminal rendering of retrieved documents (used by `seekrl search` and the demo)."""

from __future__ import annotations

from collections.abc import Collection

from rich.console import Console
from rich.markup import escape

from seekrl.retrieval.base import Hit


def print_hits(console: Console, query: str, hits: list[Hit], *,
               gold: Collection[str] = (), width: int = 160) -> None:
    console.print(f"[bold]query:[/] {escape(query)}")
    if not hits:
        console.print("  (no documents matched)")
    for rank, h in enumerate(hits, 1):
        mark = "[green]GOLD[/] " if h.doc_id in gold else ""
        text = h.text if len(h.text) <= width else h.text[: width - 3] + "..."
        console.print(f"  {rank}. {mark}[cyan]{escape(h.title)}[/] [dim]({escape(h.doc_id)}, "
                      f"score {h.score:.3f})[/]\n     {escape(text)}")
