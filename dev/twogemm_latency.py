"""Per-step forward and forward + backward of the two-GEMM variants beside E1 (bf16, GPU).

Each variant's cell is timed as its registry parity cases call it (input projections inside,
every gradient in the backward) on every path the op runs at the size, and on `auto` (what a
layer gets), at each (B, D); E1's cell likewise. Then issue 24's targets as PASS / MISS lines:
E4 and E66 forward per step within 1.5x of E1's persistent step at equal (B, D); E23 (N = 8)
at B = 4, D = 512 forward per step <= 3 us and within 3x of E1's persistent step, its backward
(forward + backward minus forward) <= 2.5x its forward, on auto and on the persistent path
(INFO lines for E23n32, N = 32, at the same shape); and at every size auto no slower than
graph (5 % noise allowed). auto's column names the forward / backward paths it took.

    python dev/twogemm_latency.py [--T 256] [--reps 10] [--json FILE]
"""
from __future__ import annotations

import argparse
import json

import torch

from elman import registry
from elman.core.entry import Shape
from elman.core.timing import timeit
from elman.families.dense import op as dense_op
from elman.families.twogemm import op

VARIANTS = ("E4", "E5", "E66", "E67lr", "E23", "E23n32")
SIZES = ((4, 512), (64, 512), (4, 1024), (64, 1024))


def _cases(name: str, B: int, D: int, T: int):
    e = registry.get(name)
    n = e.test_shapes[0].n
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = e.parity(Shape(T, B, D, None, n), torch.bfloat16, "cuda", g)
    leaves = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in cases[0].inputs.items()}
    fast = {c.impl[5:]: c.fast for c in cases}
    module = __import__(e.layer.__module__, fromlist=["cell"])  # the variant's module
    fast["auto"] = lambda **a: module.cell(**a, backend="cuda", path="auto")
    return fast, leaves


def _time(call, leaves: dict, reps: int) -> tuple[float, float]:
    outs = call(**leaves)
    grads = [torch.randn_like(o) for o in outs]

    def fwd(_):
        with torch.no_grad():
            call(**leaves)

    def fwdbwd(_):
        o = call(**leaves)
        torch.autograd.grad(o, list(leaves.values()), grads[:len(o)])
    tf = timeit(fwd, reps, 3)["median"]
    tfb = timeit(fwdbwd, reps, 3)["median"]
    return tf, tfb


def _last_path(name: str) -> str:
    """The paths the last forward + backward took ("forward/backward" for this family)."""
    if name == "E1":
        last = dense_op.last_path
        return last.get("forward", "?") if isinstance(last, dict) else str(last)
    return f"{op.last_path.get('forward', '?')}/{op.last_path.get('backward', '?')}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    T = args.T
    rows: dict[tuple, dict] = {}
    print(f"per step, us (T = {T}, bf16): forward / forward + backward; auto: the path it took")
    for B, D in SIZES:
        for name in ("E1", *VARIANTS):
            try:
                fast, leaves = _cases(name, B, D, T)
            except Exception as err:  # noqa: BLE001 (a size a variant refuses is reported)
                print(f"{name:6s} B={B:3d} D={D:5d}: no cases ({err})")
                continue
            cells = []
            for path, call in fast.items():
                try:
                    tf, tfb = _time(call, leaves, args.reps)
                except Exception as err:  # noqa: BLE001
                    cells.append(f"{path}: failed ({type(err).__name__}: {err})")
                    continue
                took = _last_path(name) if path == "auto" else path
                rows[(name, B, D, path)] = {"fwd_us": 1000 * tf / T, "fwdbwd_us": 1000 * tfb / T,
                                            "took": took}
                cells.append(f"{path}{'->' + took if path == 'auto' else ''}: "
                             f"{1000 * tf / T:7.2f} / {1000 * tfb / T:7.2f}")
            print(f"{name:6s} B={B:3d} D={D:5d}  " + " | ".join(cells), flush=True)
            del leaves
            torch.cuda.empty_cache()
    verdicts = _targets(rows)
    for line in verdicts:
        print(line)
    print(f"{sum(v.startswith('PASS') for v in verdicts)} PASS, "
          f"{sum(v.startswith('MISS') for v in verdicts)} MISS")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"T": T, "rows": [dict(zip(("variant", "B", "D", "path"), k), **v)
                                        for k, v in rows.items()], "verdicts": verdicts}, f, indent=1)


def _line(ok: bool, text: str) -> str:
    return ("PASS " if ok else "MISS ") + text


def _targets(rows: dict) -> list[str]:
    out = []
    for B, D in SIZES:
        e1 = rows.get(("E1", B, D, "persistent"))
        for name in ("E4", "E66", "E5", "E67lr"):
            mine = rows.get((name, B, D, "auto"))
            if mine is None or e1 is None:
                out.append(f"MISS {name} B={B} D={D}: no record (E1 persistent or {name} auto)")
                continue
            ratio = mine["fwd_us"] / e1["fwd_us"]
            target = name in ("E4", "E66")
            text = (f"{name} B={B} D={D} forward {mine['fwd_us']:.2f} us ({mine['took']}) = "
                    f"{ratio:.2f}x E1 persistent {e1['fwd_us']:.2f} us (target <= 1.5x"
                    f"{'' if target else ', not an issue target'})")
            out.append(_line(ratio <= 1.5, text) if target else "INFO " + text)
        for name in VARIANTS:
            auto, graph = rows.get((name, B, D, "auto")), rows.get((name, B, D, "graph"))
            if auto and graph:
                out.append(_line(auto["fwd_us"] <= 1.05 * graph["fwd_us"] and
                                 auto["fwdbwd_us"] <= 1.05 * graph["fwdbwd_us"],
                                 f"{name} B={B} D={D} auto ({auto['took']}) no slower than graph: "
                                 f"{auto['fwd_us']:.2f} vs {graph['fwd_us']:.2f} us forward, "
                                 f"{auto['fwdbwd_us']:.2f} vs {graph['fwdbwd_us']:.2f} fwd+bwd"))
    e1 = rows.get(("E1", 4, 512, "persistent"))
    for name in ("E23", "E23n32"):
        for path in ("auto", "persistent", "graph"):
            e23 = rows.get((name, 4, 512, path))
            if e23 is None:
                if name == "E23" and path != "graph":
                    out.append(f"MISS E23 B=4 D=512 N=8 {path}: no record")
                continue
            f, bwd = e23["fwd_us"], e23["fwdbwd_us"] - e23["fwd_us"]
            verdict = _line if name == "E23" and path != "graph" else (lambda ok, t: "INFO " + t)
            n = 8 if name == "E23" else 32
            out.append(verdict(f <= 3.0, f"{name} B=4 D=512 N={n} {path} ({e23['took']}) forward "
                                         f"{f:.2f} us (target <= 3 us; seed 24.3)"))
            if e1:
                out.append(verdict(f <= 3 * e1["fwd_us"], f"{name} {path} forward = "
                                   f"{f / e1['fwd_us']:.2f}x E1 persistent {e1['fwd_us']:.2f} us "
                                   "(target <= 3x)"))
            out.append(verdict(bwd <= 2.5 * f, f"{name} {path} backward {bwd:.2f} us = "
                                               f"{bwd / f:.2f}x its forward (target <= 2.5x)"))
    return out


if __name__ == "__main__":
    main()
