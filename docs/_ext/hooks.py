"""MkDocs hooks for the documentation build.

The committed benchmark results live in ``benchmarks/results/`` (written by
``consensus-lease bench``), outside ``docs/``. Rather than keep copies that go stale, the
build adds those files to the site as ``benchmarks/results/...``: the Markdown reports
become pages and the plots render from the benchmarks page. A plot that is renamed or
removed is then a broken link, which ``mkdocs build --strict`` fails on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
SUFFIXES = {".md", ".png", ".txt", ".json"}


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    for path in sorted(RESULTS.rglob("*")):  # with the runs in subfolders (w7/)
        if path.suffix in SUFFIXES and path.is_file():
            uri = f"benchmarks/results/{path.relative_to(RESULTS).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
