"""Tables for the book's pages: a markdown table shown as HTML inside a horizontal scroll
container (the `table-scroll` class of book/_static/custom.css), so a wide table fits a
laptop-width page instead of being cut at its edge."""
from __future__ import annotations

import html
import re

SCROLL_CLASS = "table-scroll"


def _cell(text: str) -> str:
    """One cell's markdown as HTML: escaped, with `code` and **bold** kept."""
    out = html.escape(text.strip())
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _split(line: str) -> list[str]:
    return line.strip().strip("|").split("|")


def to_html(markdown: str) -> str:
    """A pipe table (header, separator, rows) as an HTML table in a scroll container; any
    lines before or after the table are kept as paragraphs."""
    lines = markdown.splitlines()
    rows = [i for i, line in enumerate(lines) if line.lstrip().startswith("|")]
    if len(rows) < 2:
        return "".join(f"<p>{html.escape(line)}</p>" for line in lines if line.strip())
    first, last = rows[0], rows[-1]
    head = "".join(f"<th>{_cell(c)}</th>" for c in _split(lines[first]))
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in _split(lines[i])) + "</tr>"
                   for i in range(first + 2, last + 1))
    before = "".join(f"<p>{html.escape(t)}</p>" for t in lines[:first] if t.strip())
    after = "".join(f"<p>{html.escape(t)}</p>" for t in lines[last + 1:] if t.strip())
    return (f'{before}<div class="{SCROLL_CLASS}"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>{after}")


class Wide:
    """A markdown table that notebooks and the book show as scrollable HTML; `str()` gives
    the markdown back (for a terminal or a test)."""

    def __init__(self, markdown: str):
        self.markdown = markdown

    def _repr_html_(self) -> str:
        return to_html(self.markdown)

    def __str__(self) -> str:
        return self.markdown
