"""The pages of the book as `_toc.yml` lists them, for the book, chapter and registry tests."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from tag_chapters import toc_names  # noqa: E402  (scripts/ is no package)


def toc_pages() -> list[Path]:
    """Every page of `_toc.yml` (root first), as paths relative to the repository root."""
    return [_with_suffix(name) for name in toc_names(ROOT)]


def _with_suffix(name: str) -> Path:
    for suffix in ("", ".ipynb", ".md"):
        path = Path(name + suffix)
        if (ROOT / path).is_file():
            return path
    raise FileNotFoundError(f"_toc.yml lists {name!r}, but no {name}.ipynb or {name}.md exists")


def chapters() -> list[Path]:
    """The notebooks of the TOC."""
    return [p for p in toc_pages() if p.suffix == ".ipynb"]


def is_placeholder(notebook: Path) -> bool:
    """True while a chapter is the minimal stand-in (metadata `elman.placeholder`)."""
    nb = nbformat.read(ROOT / notebook, as_version=4)
    return bool(nb.metadata.get("elman", {}).get("placeholder", False))
