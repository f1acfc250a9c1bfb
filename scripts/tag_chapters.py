#!/usr/bin/env python3
"""Tag the code cells of the book's chapters so that they read as a book.

Jupyter Book (myst-nb) renders a code cell tagged `hide-input` with its source collapsed
behind a toggle and its outputs shown, and drops a cell tagged `remove-cell`. The rules:

- every code cell gets `hide-input` (the `parameters` cell included), unless it is tagged
  `show-input` (a cell whose code is the point, shown open) or already removed;
- papermill's `injected-parameters` cell gets `remove-cell`: it repeats the parameters
  cell with the values of one execution and is no part of the chapter.

papermill copies the tags of the source notebook, but it adds the injected cell after the
tags were set, so run this after every papermill execution (scripts/gpu_pass.sh does):

    python scripts/tag_chapters.py                 # every chapter of _toc.yml, in place
    python scripts/tag_chapters.py NB.ipynb ...    # the given notebooks
    python scripts/tag_chapters.py --check         # exit 1 if any notebook needs a tag

Only cell metadata changes; sources and outputs are kept byte for byte.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
HIDE = "hide-input"
SHOW = "show-input"
REMOVE = "remove-cell"
INJECTED = "injected-parameters"
REMOVED = {"remove-cell", "remove_cell", "remove-input", "remove_input"}


def toc_names(root: Path = ROOT) -> list[str]:
    """Every page `_toc.yml` lists (root first), as paths without suffix from `root`."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    names: list[str] = [toc["root"]]

    def walk(items: list[dict]) -> None:
        for item in items:
            if "file" in item:
                names.append(item["file"])
            for key in ("chapters", "sections", "parts"):
                walk(item.get(key, []))

    walk(toc.get("chapters", []) + toc.get("parts", []))
    return names


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks `_toc.yml` lists, in order."""
    return [root / f"{n}.ipynb" for n in toc_names(root) if (root / f"{n}.ipynb").is_file()]


def wanted_tags(cell: nbformat.NotebookNode) -> list[str]:
    """The tags `cell` should carry: its own plus the ones the rules add, in order."""
    tags = list(cell.get("metadata", {}).get("tags", []))
    if cell.cell_type != "code":
        return tags
    if INJECTED in tags:
        return tags if REMOVE in tags else tags + [REMOVE]
    if SHOW in tags or HIDE in tags or REMOVED & set(tags):
        return tags
    return tags + [HIDE]


def tag(nb: nbformat.NotebookNode) -> int:
    """Apply the rules to `nb` in place; return how many cells changed."""
    changed = 0
    for cell in nb.cells:
        tags = wanted_tags(cell)
        if tags != list(cell.get("metadata", {}).get("tags", [])):
            cell.metadata["tags"] = tags
            changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter of _toc.yml")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a tag is missing")
    args = p.parse_args(argv)
    missing = 0
    for path in args.notebooks or toc_notebooks():
        nb = nbformat.read(path, as_version=4)
        changed = tag(nb)
        if changed and args.check:
            print(f"{path}: {changed} cell(s) need tags (run scripts/tag_chapters.py)")
            missing += changed
        elif changed:
            nbformat.write(nb, path)
            print(f"{path}: tagged {changed} cell(s)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
