"""The measured versions of the dense kernels, read from the consolidated version records
(`params.version`, `change`, `outcome`, `role`, `origin`, `round`; see that run's run.json).

A record's role is `version` (the change being tried), `reference` (the kernel it was timed
against in the same process or alternation on one machine), `variant` (another arm of the
same experiment) or `baseline` (another implementation in the same run). Values at a shape are
medians over a run's repeats."""
from __future__ import annotations

import re
import statistics

import matplotlib.pyplot as plt

# (B, D): the cells of the targets that show each design best: 8 batch columns a cluster at
# D = 512 and 1024, 16 columns at B = 64, and the grid design at D = 2048.
KEY_SHAPES = ((4, 512), (4, 1024), (16, 1024), (64, 1024), (64, 2048))


def _cells(recs: list[dict], role: str) -> dict[tuple[int, str], dict[tuple[int, int], float]]:
    """(version, origin) -> (B, D) -> median forward us per step of the records of `role`."""
    vals: dict[tuple[int, str], dict[tuple[int, int], list[float]]] = {}
    for r in recs:
        p = r["params"]
        if (p.get("measure") == "cell" and "version" in p and p.get("role") == role
                and r["impl"] == "cuda:persistent"):
            vals.setdefault((p["version"], p["origin"]), {}).setdefault(
                (p["B"], p["D"]), []).append(r["metrics"]["per_step_us"])
    return {k: {s: statistics.median(v) for s, v in by.items()} for k, by in vals.items()}


def commit_label(commit: str) -> str:
    """A record's commit as the table shows it: the hash; a development build's flag code
    named as such; a tree that was never committed as 'uncommitted'."""
    m = re.fullmatch(r"([0-9a-f]{7,40})([-+]flags\d*)?", commit)
    if not m:
        return "uncommitted"
    return m[1][:7] + (" + flag code" if m[2] else "")


def rows(recs: list[dict]) -> list[dict]:
    """One row per (version, source run) with measurements of the version itself: number,
    commit, date, change, outcome and the median forward us per step at each shape."""
    first: dict[tuple[int, str], dict] = {}
    for r in recs:
        p = r["params"]
        if "version" in p:
            first.setdefault((p["version"], p["origin"]), r)
    out = []
    for key, cells in _cells(recs, "version").items():
        r = first[key]
        out.append({"version": key[0], "commit": commit_label(str(r["env"].get("commit"))), "date": r["time"][:10],
                    "change": r["params"]["change"], "outcome": r["params"]["outcome"],
                    "origin": key[1], "us": cells})
    return sorted(out, key=lambda row: (row["version"], row["date"], row["origin"]))


def _shape(B: int, D: int) -> str:
    return f"B={B} D={D}"


def table(recs: list[dict], shapes: tuple[tuple[int, int], ...] = KEY_SHAPES) -> str:
    """The measured versions as a markdown table: forward us per step at `shapes` ('—' where
    a version was not measured at a shape)."""
    head = "| version | commit | date | change | outcome | " + " | ".join(_shape(*s) for s in shapes) + " |"
    lines = [head, "|---|---|---|---|---|" + "---|" * len(shapes)]
    for row in rows(recs):
        vals = [f"{row['us'][s]:.2f}" if s in row["us"] else "—" for s in shapes]
        lines.append(f"| {row['version']} | `{row['commit']}` | {row['date']} | {row['change']} | "
                     f"{row['outcome']} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def effects(recs: list[dict], versions: tuple[int, ...] | None = None,
            shapes: tuple[tuple[int, int], ...] = KEY_SHAPES) -> list[dict]:
    """Each version against its reference measured in the same run (same machine, same
    process or alternation): before and after (median us per step) and the relative change."""
    ref, new = _cells(recs, "reference"), _cells(recs, "version")
    change = {}
    for r in recs:
        if "version" in r["params"]:
            change[r["params"]["version"]] = (r["params"]["change"], r["params"]["outcome"])
    out = []
    for (v, origin), cells in sorted(new.items()):
        if versions is not None and v not in versions:
            continue
        for s in shapes:
            if s in cells and s in ref.get((v, origin), {}):
                before, after = ref[(v, origin)][s], cells[s]
                out.append({"version": v, "change": change[v][0], "outcome": change[v][1], "B": s[0],
                            "D": s[1], "before": before, "after": after, "rel": after / before - 1.0,
                            "origin": origin})
    return out


def effect_table(recs: list[dict], versions: tuple[int, ...] | None = None,
                 shapes: tuple[tuple[int, int], ...] = KEY_SHAPES) -> str:
    """`effects` as a markdown table: one row per version and run, 'before -> after (change)'
    at each shape where both were measured."""
    by: dict[tuple[int, str], dict] = {}
    for e in effects(recs, versions, shapes):
        row = by.setdefault((e["version"], e["origin"]), {"outcome": e["outcome"]})
        row[(e["B"], e["D"])] = f"{e['before']:.3f} → {e['after']:.3f} ({100 * e['rel']:+.1f} %)"
    used = [s for s in shapes if any(s in row for row in by.values())]
    lines = ["| version | outcome | " + " | ".join(_shape(*s) for s in used) + " |",
             "|---|---|" + "---|" * len(used)]
    for (v, _), row in sorted(by.items()):
        lines.append(f"| {v} | {row['outcome']} | " + " | ".join(row.get(s, "—") for s in used) + " |")
    return "\n".join(lines)


def steps(recs: list[dict], B: int, D: int) -> list[dict]:
    """Along the main line at (B, D): each kept version's us per step and its change from
    the kept version before it (different runs, so machine and clock differ between rows)."""
    change = {r["params"]["version"]: r["params"]["change"] for r in recs if "version" in r["params"]}
    line = main_line(recs, B, D)
    return [{"version": v, "change": change[v], "us": us, "previous": prev,
             "rel": None if prev is None else us / prev - 1.0}
            for (v, us), prev in zip(line, [None] + [u for _, u in line[:-1]])]


def largest_steps(recs: list[dict], B: int, D: int, n: int = 5) -> str:
    """The `n` kept versions that took the most off a step at (B, D) along the main line, as
    a markdown table."""
    best = sorted((s for s in steps(recs, B, D) if s["rel"] is not None), key=lambda s: s["rel"])[:n]
    lines = [f"| version | change | us per step before → after (B={B}, D={D}) | change |",
             "|---|---|---|---|"]
    lines += [f"| {s['version']} | {s['change']} | {s['previous']:.2f} → {s['us']:.2f} | "
              f"{100 * s['rel']:+.0f} % |" for s in sorted(best, key=lambda s: s["version"])]
    return "\n".join(lines)


def main_line(recs: list[dict], B: int, D: int) -> list[tuple[int, float]]:
    """(version, us per step) of the kept versions measured at (B, D), in version order: the
    kernel's main line (a version with several runs shows its first)."""
    seen, out = set(), []
    for row in rows(recs):
        if row["outcome"].startswith("kept") and (B, D) in row["us"] and row["version"] not in seen:
            seen.add(row["version"])
            out.append((row["version"], row["us"][(B, D)]))
    return out


def plot(recs: list[dict], shapes: tuple[tuple[int, int], ...] = KEY_SHAPES):
    """Forward us per step by version, one colour per shape: filled markers joined by a line
    for kept versions, open markers for the versions that were not kept."""
    table_rows = rows(recs)
    panels = [[s for s in shapes if s[1] <= 1024], [s for s in shapes if s[1] > 1024]]
    panels = [p for p in panels if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.8), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1][:len(panels)]})
    k = 0
    for ax, group in zip(axes[0], panels):
        for s in group:
            color = f"C{k}"
            k += 1
            kept = main_line(recs, *s)
            if kept:
                ax.plot(*zip(*kept), marker="o", color=color, label=_shape(*s))
            other = [(row["version"], row["us"][s]) for row in table_rows
                     if s in row["us"] and not row["outcome"].startswith("kept")]
            if other:
                ax.plot(*zip(*other), linestyle="none", marker="o", markerfacecolor="none", color=color)
        ax.set_xlabel("version")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("forward per step (us)")
    fig.tight_layout()
    return fig
