"""Tables for the book's pages: a markdown table inside the horizontal scroll container of
book/_static/custom.css (`table-scroll`), so a wide table fits a laptop-width page instead of
being cut at its edge. MyST renders the markdown inside the container."""
from __future__ import annotations

from IPython.display import Markdown

SCROLL_CLASS = "table-scroll"


def scrolled(table: str) -> Markdown:
    """`table` (markdown) inside the book's sideways-scrolling container."""
    return Markdown(f"```{{container}} {SCROLL_CLASS}\n{table}\n```")
