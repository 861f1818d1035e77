"""A records folder's evaluation episodes folded into one `episodes.tar.xz`: every
`*/episodes.jsonl.gz` under the folder goes in decompressed, as `./RUN/EVAL/episodes.jsonl`,
and its `.gz` is removed. The files share their questions and prompts, so one xz stream
holds them in a small part of their gzipped size apart, which keeps the tracked tree
(what every GPU call ships) small. An archive already there is kept and added to; a file
folded again replaces its earlier copy.

    .venv/bin/python bench/fold_episodes.py bench/records/longdemo

Put back with `tar xJf bench/records/longdemo/episodes.tar.xz -C bench/records/longdemo`
(`bench/answer_reading.py` reads `episodes.jsonl` or `.gz`). Prints what it folded; the last
line a summary.
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import os
import tarfile
from pathlib import Path

ARCHIVE = "episodes.tar.xz"


def fold(folder: Path) -> tuple[int, int, int]:
    """Fold `folder`'s episode files into its archive: (files folded, their gzipped bytes,
    the archive's bytes). The archive is written beside and renamed over, and only then
    are the `.gz` files removed, so a stop never loses an episode."""
    found = sorted(p for p in folder.rglob("episodes.jsonl.gz") if p.is_file())
    members: dict[str, bytes] = {}
    archive = folder / ARCHIVE
    if archive.is_file():
        with tarfile.open(archive, "r:xz") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    members[m.name] = tar.extractfile(m).read()
    for p in found:
        try:
            members[f"./{p.parent.relative_to(folder).as_posix()}/episodes.jsonl"] = \
                gzip.decompress(p.read_bytes())
        except (OSError, EOFError) as err:
            raise SystemExit(f"{p}: not a readable gzip file ({err}); nothing was folded") from None
    if not found:
        return 0, 0, archive.stat().st_size if archive.is_file() else 0
    tmp = archive.with_name(ARCHIVE + ".tmp")
    # preset 9 with a window that spans the files: their shared text compresses once
    with lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, \
            tarfile.open(fileobj=xz, mode="w") as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(members[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(members[name]))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, archive)
    gz_bytes = sum(p.stat().st_size for p in found)
    for p in found:
        p.unlink()
    return len(found), gz_bytes, archive.stat().st_size


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a records folder (e.g. bench/records/longdemo)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"{args.folder}: no such folder")
    n, gz_bytes, xz_bytes = fold(args.folder)
    print(f"fold_episodes: folded={n} gz_bytes={gz_bytes} archive_bytes={xz_bytes} "
          f"archive={args.folder / ARCHIVE}")


if __name__ == "__main__":
    main()
