#!/usr/bin/env python3
"""Check the built book in a headless browser at laptop width.

For every page of `_toc.yml`, Chromium (Debian's `chromium` package; run as root it needs
`--no-sandbox`, which this script passes) loads a copy of the built page with a measuring
script appended, at a window width of 1366 px (a common laptop), and reports:

- **wide**: visible elements that reach past the page's content column, unless a scroll
  container that fits the column holds them (the `table-scroll` class, the theme's table
  wrapper, a scrolling code block), and whether the whole page scrolls sideways;
- **paths**: absolute host paths (/work/, /tmp/, /home/, /root/, /opt/, /Users/) in the
  text a reader sees, open or collapsed;
- **open code**: code cell sources shown open (a chapter's code cells are collapsed by the
  `hide-input` tag; a cell tagged `show-input` is allowed open);
- a screenshot of the top of each page (`--shots`, default `_build/pages/`), to look at.

    make book && python scripts/check_pages.py              # _build/html, 1366 px
    python scripts/check_pages.py --html /tmp/b/_build/html --width 1280

Exit status 1 if any page fails a check.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tag_chapters import ROOT, toc_names  # noqa: E402

MARK = "page-check"
PROBE = r"""
<script>
(function () {
  const HOST = /(\/work\/|\/tmp\/|\/home\/|\/root\/|\/opt\/|\/Users\/)[\w.\-\/]+/g;
  function name(el) {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (el.classList.length) s += "." + Array.from(el.classList).slice(0, 3).join(".");
    const text = (el.innerText || "").trim().replace(/\s+/g, " ").slice(0, 60);
    return text ? s + " '" + text + "'" : s;
  }
  function scrolls(el) {
    const x = getComputedStyle(el).overflowX;
    return x === "auto" || x === "scroll" || x === "hidden";
  }
  function run() {
    const col = document.querySelector("article.bd-article") || document.querySelector("main");
    const box = col.getBoundingClientRect();
    const wide = [];
    for (const el of col.querySelectorAll("*")) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.height === 0) continue;
      if (r.right <= box.right + 1 && r.left >= box.left - 1) continue;
      let p = el.parentElement, held = false;
      while (p && p !== col) {
        if (scrolls(p) && p.getBoundingClientRect().right <= box.right + 1) { held = true; break; }
        p = p.parentElement;
      }
      if (!held) wide.push(name(el) + " right=" + Math.round(r.right) + " > " + Math.round(box.right));
    }
    const text = document.body.textContent;
    const paths = Array.from(new Set(text.match(HOST) || [])).slice(0, 20);
    const open = [];
    for (const input of document.querySelectorAll("div.cell div.cell_input")) {
      const cell = input.closest("div.cell");
      if (cell.classList.contains("tag_show-input")) continue;
      if (input.closest("details:not([open])")) continue;
      if (input.getBoundingClientRect().height > 0) open.push(name(input));
    }
    const out = {
      column: [Math.round(box.left), Math.round(box.right)],
      page_scrolls: document.documentElement.scrollWidth > window.innerWidth + 1,
      wide: wide.slice(0, 30), wide_count: wide.length, paths: paths, open_code: open,
      code_cells: document.querySelectorAll("div.cell div.cell_input").length,
    };
    const pre = document.createElement("pre");
    pre.id = "page-check";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  window.addEventListener("load", function () { setTimeout(run, 1500); });
})();
</script>
"""


def toc_html(html_dir: Path) -> list[Path]:
    """The built page of every `_toc.yml` entry."""
    return [html_dir / f"{n}.html" for n in toc_names()]


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    raise SystemExit("no chromium on PATH: apt-get install -y chromium")


def chrome(exe: str, width: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={width},1200", "--virtual-time-budget=8000", *args],
                          capture_output=True, text=True, timeout=120)


def measure(exe: str, page: Path, width: int) -> dict:
    probe = page.with_name(page.stem + f".{MARK}.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        dom = chrome(exe, width, "--dump-dom", probe.as_uri()).stdout
    finally:
        probe.unlink()
    hit = re.search(r'<pre id="page-check">(.*?)</pre>', dom, re.S)
    if not hit:
        return {"error": "the measuring script did not report (page failed to load?)"}
    return json.loads(html.unescape(hit.group(1)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    p.add_argument("--width", type=int, default=1366)
    p.add_argument("--shots", type=Path, default=ROOT / "_build" / "pages")
    args = p.parse_args(argv)
    exe = browser()
    args.shots.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "html"
        shutil.copytree(args.html, site)
        for page in toc_html(site):
            rel = page.relative_to(site)
            if not page.is_file():
                print(f"FAIL {rel}: not built")
                failed += 1
                continue
            r = measure(exe, page, args.width)
            shot = args.shots / (str(rel.with_suffix("")).replace("/", "_") + ".png")
            chrome(exe, args.width, f"--screenshot={shot}", page.as_uri())
            problems = []
            if "error" in r:
                problems.append(r["error"])
            else:
                if r["page_scrolls"]:
                    problems.append("the page scrolls sideways")
                if r["wide_count"]:
                    problems.append(f"{r['wide_count']} element(s) wider than the column: "
                                    + "; ".join(r["wide"][:5]))
                if r["paths"]:
                    problems.append(f"host paths: {r['paths']}")
                if r["open_code"]:
                    problems.append(f"{len(r['open_code'])} code cell(s) open: "
                                    + "; ".join(r["open_code"][:3]))
            status = "FAIL" if problems else "ok  "
            cells = r.get("code_cells", 0)
            print(f"{status} {rel} ({cells} code cells, column {r.get('column')}, screenshot {shot.name})")
            for line in problems:
                print(f"       {line}")
            failed += bool(problems)
    print(f"{failed} page(s) failed at {args.width} px" if failed else f"every page passes at {args.width} px")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
