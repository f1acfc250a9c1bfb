"""The matrix family's recurrence benchmark (bf16 q, k, v; fp32 decay and state), timed as
core.timing times: the raw op's forward, backward (from the forward's checkpoints) and
forward + backward, their ratio, the peak memory of one forward + backward, and the bytes the
recurrence must move (q, k, v, decay read and o written; the backward reads them again with
d_o and writes dq, dk, dv, d decay), from which `floor_ms` at a given bandwidth follows.

The whole layer (projections, norms, gates) is timed by `elman bench`'s layer records beside
the fla-gdn and mamba2 baselines: at the seed study's 480M shape that is
`elman bench --levels E88h83n32 fla-gdn mamba2 --B 16 --D 1920 --T 512`, whose cell records
(this module, B = 16, H = 83, n = v = 32) give the recurrence's forward, backward and ratio.
"""
from __future__ import annotations

import torch

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, rotation, timeit
from . import inputs, op


# Every matrix level's core runs the same op; these stand for the family in `elman bench` (the
# generic E88 and E75 levels and the seed study's 480M E88 geometry), which keeps the run short.
CELL_LEVELS = ("E88", "E88h83n32", "E75", "E75h4n32")


def has_cell(entry: Entry) -> bool:
    return entry.family == "matrix" and entry.name in CELL_LEVELS


def last_impl() -> str:
    return "cuda:matrix"


def impl_name(group: int, n: int, v: int, slots: int = 0) -> str:
    """'cuda:matrix:warp', 'cuda:matrix:ring', 'cuda:matrix:tiled' (each with ':slots<s>' where the
    backward's slots were set) or 'cuda:matrix:G4' (four threads a value column), the default
    resolved."""
    name = op.layout_name(n, v, group)
    return f"cuda:matrix:{name}" + (f":slots{slots}" if slots and name != "G4" else "")


def layouts(n: int, v: int, K: int) -> list[tuple[int, int]]:
    """(group, slots) of every layout timed at (n, v): the default, the default with K slots
    (one recompute a chunk) where it keeps its states on chip, the tiled kernels where the warp
    kernels are the default (and the warp kernels fed by their cp.async ring), and the column
    groups."""
    out = [(0, 0)]
    if op.layout_name(n, v) != "G4":
        out.append((0, K))
    if op.warp(n, v):
        out.append((op.RING, 0))
    if op.warp(n, v) and op.TILED in op.layouts(n, v):
        out.append((op.TILED, 0))
    return out + [(op.COLUMNS, 0)]


def geometry(entry: Entry, D: int) -> tuple[int, int, int, str]:
    """(H, n, v, decay kind) of the entry's layer at width D (built on the meta device)."""
    with torch.device("meta"):
        layer = entry.layer(D, 1.0, backend="reference")
    H, n = layer.H, layer.n
    return H, n, getattr(layer, "v", n), getattr(entry.reference, "decay_kind", "scalar")


def traffic_bytes(T: int, B: int, H: int, n: int, v: int, column: bool, dtype_bytes: int = 2) -> dict[str, int]:
    """Bytes the recurrence cannot avoid moving: forward reads q, k, v and the decay and writes
    o; backward reads q, k, v, decay, d_o and writes dq, dk, dv, d decay (state and checkpoints
    excluded: they stay on chip or are T / K times smaller)."""
    decay = 4 * (v if column else 1)
    step_in = B * H * ((2 * n + v) * dtype_bytes + decay)
    return {"fwd_bytes": T * (step_in + B * H * v * dtype_bytes),
            "bwd_bytes": T * (2 * step_in + B * H * v * dtype_bytes)}


def _sets(T, B, H, n, v, decay, count, dtype):
    g = torch.Generator(device="cuda").manual_seed(1234)
    names = ("q", "k", "v", "decay", "h0")
    out = []
    for _ in range(count):
        kw = inputs.random_inputs(T, B, H, n, v, names, "cuda", g, decay)
        s = {k: t.detach().to(dtype if k in ("q", "k", "v") else torch.float32).contiguous()
             for k, t in kw.items()}
        s["d_o"] = torch.randn(T, B, H, v, device="cuda", dtype=dtype, generator=g)
        s["d_ST"] = torch.randn(B, H, n, v, device="cuda", generator=g)
        out.append(s)
    return out


def cell_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                 quick: bool = False, gate: dict[str, bool] | None = None,
                 K: int = op.CHECKPOINT) -> list[dict]:
    """Measure 'recurrence' at batch B, the entry's heads and state at width D."""
    core = [ok for impl, ok in (gate or {}).items() if impl.startswith("cuda:core")]
    if gate is not None and not (core and all(core)):
        print(f"bench: skipping {entry.name} recurrence: the core has no passing parity in this run")
        return []
    H, n, v, decay = geometry(entry, D)
    if not op.supported(n, v):
        print(f"bench: skipping {entry.name} at D={D}: n={n}, v={v} has no kernel")
        return []
    moved = traffic_bytes(T, B, H, n, v, decay == "column")
    n_sets = 2 if quick else rotation(moved["bwd_bytes"])
    sets = _sets(T, B, H, n, v, decay, n_sets, torch.bfloat16)
    out = []
    for group, slots in layouts(n, v, K):
        out.append(_time(entry, sets, T, B, D, H, n, v, K, group, slots, reps, moved))
    del sets
    torch.cuda.empty_cache()
    return out


def _time(entry, sets, T, B, D, H, n, v, K, group, slots, reps, moved) -> dict:
    step, n_sets = "tanh", len(sets)
    ckpts = [op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)[2] for s in sets]

    def fwd(i):
        s = sets[i]
        op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)

    def bwd(i):
        s = sets[i]
        op.backward(s["q"], s["k"], s["v"], s["decay"], None, ckpts[i], s["d_o"], s["d_ST"], step, K, group,
                    slots)

    def fwdbwd(i):
        s = sets[i]
        ck = op.forward(s["q"], s["k"], s["v"], s["decay"], None, s["h0"], step, K, group)[2]
        op.backward(s["q"], s["k"], s["v"], s["decay"], None, ck, s["d_o"], s["d_ST"], step, K, group, slots)

    tf, tb, tfb = timeit(fwd, reps, 3, n_sets), timeit(bwd, reps, 3, n_sets), timeit(fwdbwd, reps, 3, n_sets)
    del ckpts
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwdbwd(0)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    params = {"measure": "recurrence", **Shape(T, B, D, H, n, v).params(), "K": K, "group": group, "slots": slots,
              "dtype": "bfloat16"}
    return records.make("bench", entry.name, impl_name(group, n, v, slots), params,
                        {"fwd_ms": tf, "bwd_ms": tb, "fwdbwd_ms": tfb,
                         "bwd_over_fwd": tb["median"] / tf["median"],
                         "per_step_us": 1000 * tf["median"] / T, "peak_mem_mb": peak, **moved})


def recurrent_layer_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False, gate: dict[str, bool] | None = None) -> list[dict]:
    """None: a matrix variant's whole layer is timed by `elman bench`'s layer records."""
    return []


# ---- tables for the chapters (markdown, from records) ------------------------------------
def recurrence_table(recs: list[dict]) -> str:
    """One row per 'recurrence' record: times, backward / forward, peak memory, and the
    bandwidth the unavoidable bytes imply at the measured times."""
    rows = [r for r in recs if r["params"].get("measure") == "recurrence"]
    lines = ["| level | implementation | B | H | n | v | K | forward (ms) | backward (ms) | bwd / fwd "
             "| fwd + bwd (ms) | peak memory (MB) | fwd GB/s | bwd GB/s |", "|---" * 14 + "|"]
    for r in rows:
        p, m = r["params"], r["metrics"]
        f, b = m["fwd_ms"]["median"], m["bwd_ms"]["median"]
        lines.append(f"| {r['variant']} | {r['impl']} | {p['B']} | {p['H']} | {p['n']} | {p['v']} | {p['K']} | {f:.3f} "
                     f"| {b:.3f} | {m['bwd_over_fwd']:.2f} | {m['fwdbwd_ms']['median']:.3f} "
                     f"| {m['peak_mem_mb']:.0f} | {m['fwd_bytes'] / f / 1e6:.0f} | {m['bwd_bytes'] / b / 1e6:.0f} |")
    return "\n".join(lines)


def target_lines(recs: list[dict], level: str, B: int, D: int, bwd_over_fwd: float = 1.5,
                 fwdbwd_ms: float = 0.5, beside: tuple[str, ...] = ("fla-gdn", "mamba2")) -> str:
    """The issue's targets at one shape, each stated as met or not from the records."""
    mine = [r for r in recs if r["params"].get("measure") == "recurrence" and r["variant"] == level
            and (r["params"]["B"], r["params"]["D"]) == (B, D)]
    rec = min(mine, key=lambda r: r["metrics"]["fwdbwd_ms"]["median"], default=None)
    if rec is None:
        return f"- No recurrence record of {level} at B = {B}, D = {D}: the targets cannot be stated."
    m = rec["metrics"]
    ratio, total = m["bwd_over_fwd"], m["fwdbwd_ms"]["median"]
    out = [f"- Fastest thread layout: {rec['impl']} (of {len(mine)} timed).",
           f"- Recurrence backward / forward at B = {B}, H = {rec['params']['H']}, n = {rec['params']['n']}: "
           f"{ratio:.2f} (target <= {bwd_over_fwd}: {'met' if ratio <= bwd_over_fwd else 'not met'}).",
           f"- Recurrence forward + backward: {total:.3f} ms (target <= {fwdbwd_ms} ms: "
           f"{'met' if total <= fwdbwd_ms else 'not met'})."]
    layers = {r["variant"]: r["metrics"] for r in recs if r["params"].get("measure") == "layer"
              and (r["params"]["B"], r["params"]["D"]) == (B, D)}
    if level in layers:
        ours = layers[level]["fwdbwd_ms"]["median"]
        for other in beside:
            if other in layers:
                theirs = layers[other]["fwdbwd_ms"]["median"]
                out.append(f"- Whole layer forward + backward: {level} {ours:.2f} ms, {other} {theirs:.2f} ms "
                           f"({theirs / ours:.2f}x); peak memory {layers[level]['peak_mem_mb']:.0f} MB vs "
                           f"{layers[other]['peak_mem_mb']:.0f} MB.")
    return "\n".join(out)
