"""A/B of the grid design's synchronisation (ELMAN_FLAGS bits; read at each launch):
1 no __threadfence before the releases, 2 no nanosleep in polls, 4 proxy fence by thread 0
only, 8 no proxy fence before the bulk copy. Bitwise check against flags 0, then timing and
trace, interleaved rounds."""
import os, sys, torch
from elman import bench, dense, ops
ext = ops.load()
FLAGS = [int(f) for f in os.environ.get("AB_FLAGS", "0 1 3 7 15").split()]
T = 512
def run(kw):
    return [t.clone() for t in dense.gated_cell_cuda(**kw, path="persistent")]
g = torch.Generator(device="cuda").manual_seed(3)
for B in (5, 64):
    kw = {k: v.to(torch.bfloat16) for k, v in dense.random_inputs(48, B, 2048, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g).items()}
    for k in ("x", "z", "w_x", "w_h", "b", "h0"): kw[k].requires_grad_()
    def fb():
        out, h = dense.gated_cell_cuda(**kw, path="persistent")
        grads = torch.autograd.grad((out.float() ** 2).sum() + h.float().sum(), [kw[k] for k in ("x", "z", "w_h", "b", "h0")])
        return [out.detach(), h.detach(), *grads]
    os.environ["ELMAN_FLAGS"] = "0"; ref = fb()
    for f in FLAGS:
        os.environ["ELMAN_FLAGS"] = str(f)
        for rep in range(3):
            got = fb()
            same = all(torch.equal(a, b) for a, b in zip(ref, got))
            if not same: print(f"BITWISE MISMATCH flags {f} B {B} rep {rep}", flush=True)
    print(f"bitwise B={B} checked for flags {FLAGS}", flush=True)
for B in (4, 16, 64):
    sets = bench._cell_inputs(T, B, 2048, 2)
    fwd, fwdbwd = bench._op_fns(sets, True)
    res = {f: [] for f in FLAGS}
    for rnd in range(3):
        for f in FLAGS:
            os.environ["ELMAN_FLAGS"] = str(f)
            res[f].append((bench.timeit(fwd, 10, 2, 2)["median"] * 1000 / T, bench.timeit(fwdbwd, 10, 2, 2)["median"] * 1000 / T))
    for f in FLAGS:
        os.environ["ELMAN_FLAGS"] = str(f)
        tr = bench.trace_record(B, 2048)["metrics"]
        print(f"round B={B} flags {f}: fwd " + " ".join(f"{a:.2f}" for a, _ in res[f]) + " us/step, fwd+bwd " + " ".join(f"{b:.2f}" for _, b in res[f]) +
              f" | trace {tr['sm_clock_ghz']:.2f} GHz step {tr['step_ns']:.0f} ns: " + " ".join(f"{k}={v:.0f}" for k, v in tr["phase_ns"].items()), flush=True)
