"""Findings on the seed study's claims, computed from the leaderboard's boards
(`leaderboard.board`): each says what the records show, or that its rows are not measured yet,
beside the seed study's own figures (book/data/seed_results.csv)."""
from __future__ import annotations

from dataclasses import dataclass

from . import training
from .leaderboard import Board, bits, bits_text, gap


@dataclass(frozen=True)
class Claim:
    text: str                 # what the seed study says
    subject: str              # the level it names
    group: tuple[str, ...]    # the levels it is ranked among (itself included)
    tables: tuple[str, ...]   # the boards that test it


SIMPLE = ("E0", "E1", "E33", "E34", "E36", "E37v2", "E39", "E42", "E56")
E33_E42 = ("E33", "E34", "E36", "E37v2", "E39", "E42")
VECTOR = ("E1", "E42", "E56", "E61", "E62", "E63", "E64", "E65", "E66", "E67", "E68")
CLAIMS = (
    Claim("E1 is the best simple model", "E1", SIMPLE, ("50m", "100m")),
    Claim("E42 is the best of E33-E42", "E42", E33_E42, ("50m",)),
    Claim("E68 is the best vector-state model", "E68", VECTOR, ("100m",)),
)
MATRIX = "E88"                      # any E88 level of the 100M table
MATRIX_RIVALS = ("fla-gdn", "mamba2")
MATRIX_TABLE = "100m"


def _lower(levels) -> set[str]:
    return {lv.lower() for lv in levels}


def seed_line(levels: list[str], configs: tuple[str, ...] | None) -> str:
    """The seed study's last-100 losses of `levels` (in `configs`; None: any config, named),
    lowest first, as one sentence; '' where it has none."""
    figs = [r for r in training.seed_results() if r["level"].lower() in _lower(levels)
            and r["metric"].startswith("last-100 loss") and (configs is None or r["config"] in configs)]
    if not figs:
        return ""
    by_level: dict[tuple[str, str], list[float]] = {}
    for r in figs:
        by_level.setdefault((r["level"], r["config"]), []).append(r["value"])
    parts = sorted(by_level.items(), key=lambda kv: min(kv[1]))
    text = ", ".join(f"{lv} {'–'.join(f'{v:g}' for v in sorted(set(vs)))}" + ("" if configs else f" ({cfg})")
                     for (lv, cfg), vs in parts)
    return f"The seed study's last-100 (nats/byte, their corpus, about our last-1000): {text}."


def noise_phrase(g: dict) -> str:
    se = ("" if g["beyond_se"] is None else
          f"{'beyond' if g['beyond_se'] else 'within'} the evaluation noise (2 se = {g['two_se']:.4f})")
    seed = ("no model has two seeds yet" if g["beyond_seed"] is None else
            f"{'beyond' if g['beyond_seed'] else 'within'} the largest seed-to-seed difference")
    return "; ".join(x for x in (se, seed) if x)


def within_noise(g: dict) -> bool:
    """A gap that the evaluation's or the seeds' noise could explain decides nothing."""
    return g["beyond_se"] is False or g["beyond_seed"] is False


def best(claim: Claim, b: Board) -> str:
    """Whether claim.subject ranks first of claim.group on board b."""
    head = f"**{claim.text}** ({b.table.title})"
    group = [lv for lv in claim.group if lv.lower() in _lower(b.table.levels)]
    rows = [r for r in b.ranked if r["level"].lower() in _lower(group) and bits(r) is not None]
    done = _lower(r["level"] for r in rows)
    missing = [lv for lv in group if lv.lower() not in done]
    seed = seed_line(group, b.table.seed_configs)
    subject = next((r for r in rows if r["level"].lower() == claim.subject.lower()), None)
    if subject is None or len(rows) < 2:
        why = f"not run yet: {', '.join(missing)}" if missing else "no other model of the claim in this table"
        return f"{head}: not measured yet ({why}). {seed}".strip()
    first = rows[0] is subject
    g = gap(subject, rows[1], b.noise) if first else gap(rows[0], subject, b.noise)
    standing = (f"{subject['name']} ranks first, {g['gap']:.4f} bits/byte ahead of {rows[1]['name']}"
                if first else f"{rows[0]['name']} ranks first, {subject['name']} is number "
                f"{rows.index(subject) + 1}, {g['gap']:.4f} bits/byte behind")
    verdict = (f"{'undecided' if within_noise(g) else 'holds' if first else 'does not hold'} "
               f"among the {len(rows)} measured: {standing}")
    verdict += f" ({noise_phrase(g)})"
    if missing:
        verdict += f"; not run yet: {', '.join(missing)}"
    return f"{head}: {verdict}. {seed}".strip()


def matrix(b: Board) -> str:
    """The best E88 row of the board against each of the rivals."""
    head = f"**E88 against {' and '.join(MATRIX_RIVALS)}** ({b.table.title})"
    seed = seed_line([lv for lv in b.table.levels if lv.lower().startswith(MATRIX.lower())]
                     + [MATRIX, *MATRIX_RIVALS], None)
    measured = [r for r in b.ranked if bits(r) is not None]
    e88 = next((r for r in measured if r["level"].lower().startswith(MATRIX.lower())), None)
    rivals = [r for r in measured if r["level"].lower() in _lower(MATRIX_RIVALS)]
    have = _lower(r["level"] for r in rivals)
    missing = ([] if e88 else [MATRIX]) + [lv for lv in MATRIX_RIVALS if lv.lower() not in have]
    if e88 is None or not rivals:
        return f"{head}: not measured yet (not run yet: {', '.join(missing)}). {seed}".strip()
    parts = []
    for r in rivals:
        ahead, behind = (e88, r) if bits(e88) <= bits(r) else (r, e88)
        g = gap(ahead, behind, b.noise)
        side = "ahead of" if ahead is e88 else "behind"
        parts.append(f"{g['gap']:.4f} bits/byte {side} {r['name']} ({noise_phrase(g)})")
    text = f"{e88['name']} at {bits_text(e88)} bits/byte is " + "; ".join(parts)
    if missing:
        text += f"; not run yet: {', '.join(missing)}"
    return f"{head}: {text}. {seed}".strip()


def findings(boards: list[Board]) -> list[str]:
    """One markdown paragraph a claim and table, in the order of CLAIMS, then E88's."""
    by_key = {b.table.key: b for b in boards}
    out = [best(c, by_key[k]) for c in CLAIMS for k in c.tables if k in by_key]
    if MATRIX_TABLE in by_key:
        out.append(matrix(by_key[MATRIX_TABLE]))
    return out
