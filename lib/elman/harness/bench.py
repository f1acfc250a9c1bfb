"""`elman bench`: kernel and layer benchmarks, with the baselines measured in the same run.

Method (core.timing, DESIGN.md "Benchmarks"): CUDA events around each repetition, warm-up
first, the median of many repetitions with p20/p80, inputs rotated over enough sets that the
L2 cache does not serve them, random data (never zeros). Every op is timed only after its
parity passed in the same run (`ensure_parity`).

Measures, for each (B, D) at T = 512, bf16:
- `cell` and `recurrent_layer`: the cell benchmark of each selected entry whose kernel
  family has one (`elman.families.<family>.bench`: the recurrence alone on precomputed
  projections beside the family's library baseline, and the recurrence with its input GEMM
  and every gradient, as cuDNN counts a layer).
- `layer`: one registered layer (variant or baseline) at width D, forward and forward +
  backward under bf16 autocast with fp32 weights, tokens/s and peak memory.
- `primitive`, `clock`, `trace` (`--primitives`): elman.harness.probes.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType

import torch
from tqdm import tqdm

from .. import registry
from ..core import records
from ..core.timing import T_DEFAULT, layer_timings, rotation, warm_up
from . import parity, probes

SHAPES_B = (4, 16, 64)
SHAPES_D = (512, 1024, 2048)


# ---- parity gate ------------------------------------------------------------------------
def ensure_parity(entry: registry.Entry, dtype: str = "bfloat16") -> dict[str, bool]:
    """{impl: passed} for the entry in this run: read from this run's records, or checked
    now (and recorded) if the run has none."""
    recs = [r for r in records.read([records.run_dir()], kind="parity")
            if r["variant"] == entry.name and r["params"]["dtype"] == dtype]
    if not recs and entry.parity is not None:
        recs = parity.check_entry(entry, [dtype])
        records.write(recs)
    status: dict[str, bool] = {}
    for r in recs:
        status[r["impl"]] = status.get(r["impl"], True) and r["metrics"]["passed"]
    return status


# ---- the recurrence alone, by kernel family ---------------------------------------------
def family_bench(entry: registry.Entry) -> ModuleType | None:
    """The cell benchmark module of the entry's kernel family, if the family has one and
    it applies to the entry."""
    if entry.family is None:
        return None
    name = f"{__package__.rsplit('.', 1)[0]}.families.{entry.family}.bench"
    if importlib.util.find_spec(name) is None:
        return None
    module = importlib.import_module(name)
    return module if module.has_cell(entry) else None


def cell_entries(levels: list[str] | None = None) -> list[registry.Entry]:
    """The entries with a cell benchmark: of `levels`, or every variant."""
    chosen = [registry.get(l) for l in levels] if levels else registry.variants()
    return [e for e in chosen if family_bench(e) is not None]


# ---- whole layers ---------------------------------------------------------------------
def layer_record(entry: registry.Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 20,
                 dtype: str = "bfloat16", quick: bool = False, impl: str | None = None,
                 **options) -> dict:
    """Forward and forward+backward of one layer of width D, fp32 weights under autocast
    (or, for entries that run in a fixed dtype such as cuDNN fp16, in that dtype)."""
    torch.manual_seed(0)
    dt = parity.DTYPES[dtype]
    if "rnn_dtype" in inspect.signature(entry.layer).parameters:
        options = {"rnn_dtype": dtype, **options}  # cuDNN baselines run in a fixed dtype
    layer = entry.layer(D, 1.0, backend="cuda", **options).cuda()
    n = 2 if quick else rotation(T * B * D * 2 * 2)
    tf, tfb, peak = layer_timings(layer, B, T, D, dt, reps, n)
    params = sum(p.numel() for p in layer.parameters())
    # a family's op says which path ran; a baseline layer may say which library path ran
    # (fla-gdn: who computed chunk_bwd_dqkwg)
    fb = family_bench(entry)
    ran = impl or (fb.last_impl() if fb is not None else getattr(layer, "impl", f"{entry.name}:{dtype}"))
    return records.make("bench", entry.name, ran,
                        {"measure": "layer", **registry.Shape(T, B, D).params(), "dtype": dtype,
                         "expansion": 1.0,
                         "layer_params": params, **options},
                        {"fwd_ms": tf, "fwdbwd_ms": tfb,
                         "tokens_per_s": B * T / (tfb["median"] / 1000), "peak_mem_mb": peak})


# ---- command --------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--B", type=int, nargs="*", default=list(SHAPES_B))
    p.add_argument("--D", type=int, nargs="*", default=list(SHAPES_D))
    p.add_argument("--T", type=int, default=T_DEFAULT)
    p.add_argument("--levels", nargs="*", help="levels to time (default: every variant and baseline; "
                                               "the cell benchmark for every variant whose family has one)")
    p.add_argument("--no-cell", action="store_true", help="skip the recurrence-only comparison")
    p.add_argument("--no-layers", action="store_true", help="skip whole-layer timings")
    p.add_argument("--primitives", action="store_true", help="also time the synchronisation primitives")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="few repetitions, two input sets")


def main(args) -> int:
    if not torch.cuda.is_available():
        print("elman bench: no CUDA device; benchmarks run on a GPU only")
        return 2
    reps = 5 if args.quick else args.reps
    recs: list[dict] = []
    shapes = [(B, D) for D in args.D for B in args.B]
    cells = [] if args.no_cell and not args.primitives else cell_entries(args.levels)
    if args.primitives:
        recs += probes.primitive_records(200 if args.quick else 2000) + probes.clock_records()
        traced = {(e.family, e.epilogue): e for e in cells  # one trace per dense epilogue
                  if e.family == "dense" and e.epilogue is not None}.values()
        recs += [r for e in traced for B, D in shapes
                 if (r := probes.trace_record(e, B, D, args.T)) is not None]
        records.write(recs)
    warm_up()
    if not args.no_cell:
        for e in cells:
            gate = ensure_parity(e)
            fb = family_bench(e)
            for B, D in tqdm(shapes, desc=f"cell {e.name}"):
                new = fb.cell_records(e, B, D, args.T, reps, args.quick, gate=gate)
                new += fb.recurrent_layer_records(e, B, D, args.T, reps, args.quick, gate=gate)
                records.write(new)
                recs += new
    if not args.no_layers:
        entries = [registry.get(l) for l in args.levels] if args.levels else registry.entries()
        for e in tqdm(entries, desc="layers"):
            for dt in [d for d in e.dtypes if d != "float32"] or ["bfloat16"]:
                status = ensure_parity(e, dt) if e.parity is not None else {}
                if e.parity is not None and (not status or not all(status.values())):
                    print(f"bench: skipping {e.name} {dt}: parity did not pass in this run ({status})")
                    continue
                for B, D in shapes:
                    try:
                        new = layer_record(e, B, D, args.T, max(5, reps // 2), dt, args.quick)
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        print(f"bench: {e.name} B={B} D={D} {dt}: out of memory, not recorded")
                        continue
                    except (RuntimeError, ValueError) as exc:  # a size a library or kernel refuses: say so, go on
                        print(f"bench: {e.name} B={B} D={D} {dt}: {exc}".splitlines()[0])
                        continue
                    records.write(new)
                    recs.append(new)
    print(summary(recs))
    print(f"records: {records.run_dir() / 'records.jsonl'}")
    return 0


def summary(recs: list[dict]) -> str:
    lines = []
    for r in recs:
        p, m = r["params"], r["metrics"]
        if p["measure"] == "primitive":
            lines.append(f"primitive {r['impl']:<36} {m['us']:8.3f} us")
        elif p["measure"] == "clock":
            lines.append(f"clock {p['work']:<10} on {p['sms']:>3} SMs  {m['ghz']:.3f} GHz "
                         f"(min {m['min_ghz']:.3f}, max {m['max_ghz']:.3f})")
        elif p["measure"] == "trace":
            phases = "  ".join(f"{k} {v:6.0f}" for k, v in m["phase_ns"].items())
            lines.append(f"trace B={p['B']:<3} D={p['D']:<5} step {m['step_ns']:6.0f} ns at "
                         f"{m['sm_clock_ghz']:.2f} GHz: {phases}")
        elif p["measure"] == "recurrent_layer":
            lines.append(f"rnn   {r['impl']:<18} B={p['B']:<3} D={p['D']:<5} "
                         f"fwd {m['fwd_ms']['median']:8.3f} ms  fwd+bwd {m['fwdbwd_ms']['median']:8.3f} ms")
        elif p["measure"] == "cell" and "per_step_us" in m:
            lines.append(f"cell  {r['impl']:<18} B={p['B']:<3} D={p['D']:<5} "
                         f"{m['per_step_us']:8.2f} us/step  fwd+bwd {m['fwdbwd_ms']['median']:8.3f} ms")
        elif "tokens_per_s" not in m:  # a family's own measure (diagonal bandwidth, matrix recurrence)
            times = "  ".join(f"{k} {v['median']:8.3f}" for k, v in m.items() if isinstance(v, dict) and "median" in v)
            lines.append(f"{p['measure']:<5} {r['variant']:<8} {r['impl']:<22} B={p['B']:<3} D={p['D']:<5} {times}")
        else:
            lines.append(f"layer {r['variant']:<8} {r['impl']:<18} {p['dtype']:<8} B={p['B']:<3} D={p['D']:<5} "
                         f"fwd {m['fwd_ms']['median']:8.3f} ms  fwd+bwd {m['fwdbwd_ms']['median']:8.3f} ms  "
                         f"{m['tokens_per_s']:12.0f} tok/s")
    return "\n".join(lines)
