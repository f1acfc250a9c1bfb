"""The book builds with no warning (-W -n) from the committed notebooks, every page of the
TOC becomes HTML, the E0/E1 chapters show a table and a plot, and math is served by the
local MathJax copy, never a CDN. The built pages read as a book (checked statically here;
scripts/check_pages.py measures them in a headless browser): code cells collapsed, no
injected-parameters cell, wide tables inside a scroll container, no host path, no link out
of the repository; the Variants page lists every variant and baseline."""
from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from book_pages import ROOT, chapters, is_placeholder, toc_pages

JUPYTER_BOOK = Path(sys.executable).with_name("jupyter-book")
MATHJAX = "_static/mathjax/tex-chtml-full.js"
CDN_MATHJAX = re.compile(r"cdn\.jsdelivr\.net|mathjax@|cdnjs\.cloudflare\.com/ajax/libs/mathjax"
                         r"|unpkg\.com/mathjax|polyfill\.io", re.IGNORECASE)


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    """Build the book from the working tree into a temporary folder; return its html/."""
    assert JUPYTER_BOOK.is_file(), f"{JUPYTER_BOOK} is missing: run `make venv`"
    out = tmp_path_factory.mktemp("book")
    proc = subprocess.run(
        [str(JUPYTER_BOOK), "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"book build failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return out / "_build" / "html"


def test_every_toc_page_has_html(html: Path):
    pages = toc_pages()
    assert len(pages) >= 2
    for page in pages:
        built = html / page.with_suffix(".html")
        assert built.is_file(), f"{page} produced no HTML ({built} missing)"
        assert "<h1" in built.read_text(), f"{built} has no title"


@pytest.mark.parametrize("chapter", ["book/chapters/e00_stock_elman.ipynb",
                                     "book/chapters/e01_gated_elman.ipynb"])
def test_variant_chapter_shows_table_and_plot(html: Path, chapter: str):
    if is_placeholder(Path(chapter)):
        pytest.skip(f"{chapter} is still the placeholder (metadata elman.placeholder); "
                    "the table and plot check starts when the real chapter lands")
    text = (html / Path(chapter).with_suffix(".html")).read_text()
    missing = [what for what, tag in (("a table (the parity table)", "<table"),
                                      ("an image (a benchmark plot)", "<img")) if tag not in text]
    assert not missing, (f"{chapter} renders without {' and '.join(missing)}: commit the "
                         "notebook as papermill executed it (scripts/gpu_pass.sh)")


def test_math_uses_local_mathjax(html: Path):
    pages = sorted(html.rglob("*.html"))
    assert pages
    with_math = []
    for page in pages:
        text = page.read_text()
        hit = CDN_MATHJAX.search(text)
        assert hit is None, f"{page.relative_to(html)} loads from a CDN: {hit.group(0)!r}"
        if 'class="math notranslate' in text:
            with_math.append(page.relative_to(html))
            assert re.search(r'<script[^>]+src="[./]*' + re.escape(MATHJAX), text), \
                f"{page.relative_to(html)} has math but does not load the local MathJax"
    assert toc_pages()[0].with_suffix(".html") in with_math, "the intro's math was not rendered"
    assert (html / MATHJAX).is_file()
    fonts = list((html / "_static/mathjax/output/chtml/fonts/woff-v2").glob("*.woff"))
    assert len(fonts) >= 20, "the MathJax CHTML fonts were not copied"


HOST_PATH = re.compile(r"(?<![\w.])(/work/|/tmp/|/home/|/root/|/opt/|/Users/)[\w.-]+")
SCROLLERS = {"table-scroll", "pst-scrollable-table-container", "cell_output"}
NARROW_COLUMNS = 6  # a table of at most this many columns fits the column at laptop width


class _Tables(HTMLParser):
    """Each <table> of a page: its column count and whether a scrolling container holds it."""

    def __init__(self):
        super().__init__()
        self.stack: list[set[str]] = []
        self.tables: list[dict] = []
        self._cols: int | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "img", "hr", "meta", "link", "input", "col", "source", "wbr"):
            return
        classes = set((dict(attrs).get("class") or "").split())
        self.stack.append(classes)
        if tag == "table":
            held = any(SCROLLERS & c for c in self.stack[:-1])
            self.tables.append({"held": held, "columns": 0})
            self._cols = 0
        elif tag in ("th", "td") and self._cols is not None:
            self._cols += 1

    def handle_endtag(self, tag):
        if tag in ("br", "img", "hr", "meta", "link", "input", "col", "source", "wbr"):
            return
        if tag == "tr" and self._cols is not None and self.tables:
            self.tables[-1]["columns"] = max(self.tables[-1]["columns"], self._cols)
            self._cols = 0
        if tag == "table":
            self._cols = None
        if self.stack:
            self.stack.pop()


def _pages(html: Path) -> list[tuple[Path, str]]:
    return [(page, (html / page.with_suffix(".html")).read_text()) for page in toc_pages()]


def test_pages_load_the_layout_css(html: Path):
    css = (ROOT / "book/_static/custom.css").read_text()
    assert re.search(r"\.table-scroll\s*\{[^}]*overflow-x:\s*auto", css)
    assert (html / "_static/custom.css").is_file()
    for page, text in _pages(html):
        assert "_static/custom.css" in text, f"{page} does not load custom.css"


def test_wide_tables_scroll(html: Path):
    for page, text in _pages(html):
        parser = _Tables()
        parser.feed(text)
        loose = [t for t in parser.tables if not t["held"] and t["columns"] > NARROW_COLUMNS]
        assert not loose, (f"{page}: {len(loose)} table(s) of more than {NARROW_COLUMNS} columns "
                           "outside a scroll container (wrap them in a `table-scroll` container)")


def test_code_cells_collapsed(html: Path):
    for page, text in _pages(html):
        cells = re.findall(r'<div class="(cell (?:tag_[^" ]+ )*docutils container)"', text)
        assert "tag_injected-parameters" not in text, f"{page} shows papermill's injected parameters"
        shown = [c for c in cells if "tag_hide-input" not in c and "tag_show-input" not in c]
        assert not shown, f"{page}: {len(shown)} code cell(s) shown open (run scripts/tag_chapters.py)"


def test_no_host_path_in_pages(html: Path):
    for page, text in _pages(html):
        hits = sorted(set(m.group(0) for m in HOST_PATH.finditer(text)))
        assert not hits, f"{page} shows host paths: {hits[:5]}"


def test_nothing_points_outside_the_repository(html: Path):
    for page, text in _pages(html):
        assert "../shared" not in text and "VARIANTS.md" not in text, f"{page} points outside the repository"
    for doc in ("README.md", "CONTRIBUTING.md", "book/intro.md", "book/chapters/variants.md"):
        text = (ROOT / doc).read_text()
        assert "../shared" not in text and "VARIANTS.md" not in text, f"{doc} points outside the repository"


def test_chapter_tags_and_parameters():
    """Every chapter is tagged as scripts/tag_chapters.py would, and its parameters cell
    holds no run folder (chapters read book/runs.yml)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/tag_chapters.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for chapter in chapters():
        nb = nbformat.read(ROOT / chapter, as_version=4)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert params and "runs_dir" not in params[0].source, f"{chapter}: a runs_dir parameter"


SPEC_VARIANTS = ("E0", "E1", "E4", "E5", "E14", "E23", "E33", "E34", "E36", "E37", "E37v2", "E38",
                 "E39", "E42", "E56", "E61", "E62", "E63", "E64", "E65", "E66", "E67", "E68",
                 "E70", "E71", "E72", "E73", "E73cp", "E74", "E75", "E88")
SPEC_BASELINES = ("mamba2", "fla-gdn", "llama", "cudagru", "cudalstm", "gru", "lstm", "mingru",
                  "minlstm")


def test_variants_page_lists_everything():
    from elman import registry

    text = (ROOT / "book/chapters/variants.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| Variant")
            and not line.startswith("| Baseline")]
    firsts = " ".join(r.split("|")[1] for r in rows)
    for name in SPEC_VARIANTS:
        assert re.search(rf"\b{name}\b", firsts), f"Variants at a glance has no row for {name}"
    for name in SPEC_BASELINES:
        assert f"`{name}`" in firsts, f"Variants at a glance has no row for baseline {name}"
    for entry in list(registry.variants()) + list(registry.baselines()):
        link = f"({Path(entry.chapter).name})"
        row = next((r for r in rows if re.search(rf"`{re.escape(entry.name)}`", r.split("|")[1])), None)
        assert row is not None, f"registered {entry.name} has no row"
        assert link in row, f"the row of {entry.name} does not link its chapter {entry.chapter}"
