"""The Leaderboard chapter's figures, from its boards (`leaderboard.board`) and the runs' logs:
loss curves against training bytes and wall-clock, validation loss against throughput, and the
validation loss per source of the held-out split."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from . import training
from .leaderboard import Board, bits, bits_se

LN2 = math.log(2)


def colors(b: Board) -> dict[str, tuple]:
    """One colour a model, by rank, the same in every figure of the board."""
    cmap = plt.get_cmap("tab20" if len(b.ranked) > 10 else "tab10")
    return {r["name"]: cmap(i % cmap.N) for i, r in enumerate(b.ranked)}


def curves(b: Board, runs: Path):
    """Training loss (log-interval means) and validation loss (dots) in bits/byte against
    training bytes and against training minutes (evaluation pauses excluded). `runs` holds the
    rows' run folders (`training.read_log`). None for a board with no row."""
    if not b.ranked:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    tail = []
    for row, color in zip(b.ranked, colors(b).values()):
        cols = training.read_log(runs, row)
        step = np.array(cols["step"], dtype=float)
        loss = np.array(cols["loss"], dtype=float) / LN2
        per_step = row["batch"] * row["seq"] / 1e6
        minutes = np.array([np.nan if e is None else e / 60 for e in cols["elapsed_s"]])
        val = np.array(cols["val_loss"], dtype=float) / LN2
        ax.plot(step * per_step, loss, color=color, lw=1)
        ax.plot(np.array(cols["val_step"]) * per_step, val, "o", color=color, ms=3)
        bx.plot(minutes, loss, color=color, lw=1, label=row["name"])
        if len(step) and not np.isnan(minutes).all():
            bx.plot(np.interp(cols["val_step"], step, minutes), val, "o", color=color, ms=3)
        tail.extend(loss[len(loss) // 5:])
    if tail:
        ax.set_ylim(min(tail) * 0.98, max(tail) * 1.05)
    ax.set_xlabel("million training bytes")
    bx.set_xlabel("training minutes (evaluation pauses excluded)")
    ax.set_ylabel("loss (bits per byte)")
    ax.set_title(f"{b.table.title}: training loss (lines), validation loss (dots)", fontsize=10)
    bx.set_title("the same against wall-clock", fontsize=10)
    bx.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def scatter(boards: list[Board]):
    """Validation bits/byte (± se) against tokens/s, one panel a board with rows; None if none."""
    shown = [b for b in boards if any(bits(r) is not None and r.get("tokens_per_s") for r in b.ranked)]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4), squeeze=False)
    for ax, b in zip(axes[0], shown):
        for row in b.ranked:
            if bits(row) is None or not row.get("tokens_per_s"):
                continue
            x = row["tokens_per_s"] / 1e3
            ax.errorbar(x, bits(row), yerr=bits_se(row) or 0, fmt="o", color=colors(b)[row["name"]], ms=5)
            ax.annotate(row["name"], (x, bits(row)), xytext=(4, 3), textcoords="offset points", fontsize=7)
        ax.set_xlabel("thousand tokens (bytes) per second, median, evaluation excluded")
        ax.set_ylabel("validation loss (bits per byte)")
        ax.set_title(f"{b.table.title} (lower right is better)", fontsize=10)
    fig.tight_layout()
    return fig


def per_source(b: Board):
    """Heatmap of validation bits/byte per source (columns) and model (rows), ranked; the colour
    is the distance from the source's best model, the number the loss itself. None if no row
    has per-source losses."""
    rows = [r for r in b.ranked if r.get("val_per_source")]
    if not rows:
        return None
    sources = list(dict.fromkeys(s for r in rows for s in r["val_per_source"]))
    values = np.array([[r["val_per_source"].get(s, np.nan) / LN2 for s in sources] for r in rows])
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(sources), 0.8 + 0.35 * len(rows)))
    behind = values - np.nanmin(values, axis=0)
    ax.imshow(behind, cmap="Reds", aspect="auto")
    dark = np.nanmax(behind) * 0.6 if np.isfinite(np.nanmax(behind)) else np.inf
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, "" if np.isnan(v) else f"{v:.3f}", ha="center", va="center", fontsize=7,
                color="white" if behind[i, j] > dark > 0 else "black")
    ax.set_xticks(range(len(sources)), sources, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=8)
    ax.set_title(f"{b.table.title}: bits/byte per source (darker: further from the best)", fontsize=10)
    fig.tight_layout()
    return fig
