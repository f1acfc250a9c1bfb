"""Where a low-rank persistent forward step spends its time (bf16, GPU): the traced forward
(persistent.cu, kTrace) records clock64 at six phase boundaries of every step in CTA 0; this
prints the median ns of each phase per (mode, B, D), r = D / 4 (the parity rank).

    python dev/twogemm_trace.py [--T 256]

Columns: A+send (multiply, partials st.async'd), shadow (while the partials travel: the
previous step's outputs, the input copies, the gate), wait (until every source's partials
arrived), sum+bar (the rank-order sum, p to shared memory, the block barrier), B+stage (U p and
the new state), close (the block barrier that ends the step), step (their sum).
"""
from __future__ import annotations

import argparse

import torch

from elman.families.twogemm import op, stages

SIZES = ((4, 512), (64, 512), (4, 1024), (64, 1024))
NAMES = ("A+send", "shadow", "wait", "sum+bar", "B+stage", "close")


def _inputs(T: int, B: int, D: int, r: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", generator=g)
    u, v = torch.randn(D, r, **kw) / r ** 0.5, torch.randn(r, D, **kw) / D ** 0.5
    s = (0.95 / torch.linalg.matrix_norm(u @ v, ord=2)).sqrt()
    x = dict(a=torch.randn(T, B, D, **kw), c=torch.randn(T, B, D, **kw), u=u * s, v=v * s,
             b=0.1 * torch.randn(D, **kw), h0=torch.rand(B, D, **kw) - 0.5)
    return {k: t.to(torch.bfloat16).contiguous() for k, t in x.items()}


def trace(mode: int, x: dict) -> list[float]:
    """Median ns of each phase over steps 8..T-1 (and the step), from one traced run."""
    ext = op._ext()
    T, B, D = x["a"].shape
    P = ext.lowrank_trace_phases
    bf = dict(dtype=torch.bfloat16, device="cuda")
    out, h_all = torch.empty(T, B, D, **bf), torch.empty(T + 1, B, D, **bf)
    p_all = torch.empty(T, B, x["u"].shape[1], **bf)
    aux = torch.empty(T, B, D, **bf) if mode else None
    buf = torch.zeros(T * P + 4, dtype=torch.int64, device="cuda")
    for _ in range(2):  # the second run is recorded (the first loads the kernel)
        ext.lowrank_persistent_forward(mode, *(x[k] for k in ("a", "c", "u", "v", "b", "h0")),
                                       out, h_all, p_all, aux, buf)
    torch.cuda.synchronize()
    c0, n0, c1, n1 = buf[T * P:].tolist()
    ns_per_clock = (n1 - n0) / (c1 - c0)
    st = buf[:T * P].view(T, P).double().cpu()
    phases = [st[:, i + 1] - st[:, i] for i in range(P - 1)]
    phases.append(torch.cat([st[1:, 0] - st[:-1, -1], st[-1:, -1] * float("nan")]))
    d = torch.stack(phases, 1)[8:-1] * ns_per_clock
    step = d.sum(1)
    return [*d.median(0).values.tolist(), step.median().item()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=256)
    args = ap.parse_args()
    print(f"median ns per phase of a forward step (T = {args.T}, r = D / 4, CTA 0)")
    print(f"{'mode':12s} {'B':>3s} {'D':>5s} " + " ".join(f"{n:>8s}" for n in NAMES) + f" {'step':>8s}")
    for B, D in SIZES:
        x = _inputs(args.T, B, D, D // 4)
        for mode_name, mode in sorted(stages.MODES.items(), key=lambda kv: kv[1]):
            ns = trace(mode, x)
            print(f"{mode_name:12s} {B:3d} {D:5d} " + " ".join(f"{v:8.0f}" for v in ns), flush=True)


if __name__ == "__main__":
    main()
