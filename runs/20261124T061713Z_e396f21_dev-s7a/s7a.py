"""Dev pass s7a: the grid design's multiply on wgmma at 32 and 64 batch columns (D = 2048).
Plans, parity of every D = 2048 path (E1, E0; bf16), bitwise repeatability and graph capture,
step traces, cells beside the per-step graph path, the recurrent layer beside cuDNN, and the
benchmark method's share (gradients accumulated into .grad, as before session 7, against
returned)."""
import sys, time, torch
from elman import bench, dense, ops, parity, records, registry
ext = ops.load()
for B in (4, 16, 20, 32, 33, 64):
    pf, pb = ext.dense_persistent_plan(B, 2048, False), ext.dense_persistent_plan(B, 2048, True)
    print("plan", B, pf, "bwd smem", pb["smem"], flush=True)
shapes = [(3, 2, 2048), (6, 20, 2048), (5, 64, 2048), (4, 70, 2048), (7, 1, 2048), (5, 32, 2048),
          (9, 33, 2048), (4, 16, 2048)]
for lvl in ("E1", "E0"):
    recs = parity.check_entry(registry.get(lvl), ["bfloat16"], shapes=shapes)
    bad = [r for r in recs if not r["metrics"]["passed"]]
    print(lvl, "parity", len(recs), "records,", len(bad), "failed", flush=True)
    records.write(recs)
    if bad:
        print(parity.table(bad)); sys.exit(1)
g = torch.Generator(device="cuda").manual_seed(7)
for B in (64, 20):
    T, D = 40, 2048
    kw = {k: v.to(torch.bfloat16) for k, v in dense.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g).items()}
    a = dense.gated_cell_cuda(**kw, path="persistent")[0]
    b = dense.gated_cell_cuda(**kw, path="persistent")[0]
    print(f"B={B} bitwise repeat:", torch.equal(a, b), flush=True)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(gr, stream=s):
            c = dense.gated_cell_cuda(**kw, path="persistent")[0]
    gr.replay(); torch.cuda.synchronize()
    print(f"B={B} graph capture:", torch.equal(a, c), flush=True)
bench.warm_up()
new = [bench.trace_record(B, 2048) for B in (4, 16, 32, 64)]
for r in new:
    m = r["metrics"]
    print(f"trace B={r['params']['B']}: step {m['step_ns']:.0f} ns at {m['sm_clock_ghz']:.2f} GHz",
          {k: round(v) for k, v in m["phase_ns"].items()}, flush=True)
records.write(new)
for B in (4, 16, 32, 64):
    t0 = time.time()
    new = bench.cell_records(B, 2048, 512, 20, impls=("cuda:persistent", "cuda:steps+graph"))
    if B == 64:
        new += bench.recurrent_layer_records(B, 2048, 512, 20)
    print(bench.summary(new), f"({time.time()-t0:.0f}s)", flush=True)
    records.write(new)

# The method's share, same process: gradients added into .grad (before) against returned (now).
T, B, D = 512, 64, 2048
n = bench.rotation(6 * T * B * D * 2)
sets = []
for _ in range(n):
    t = dense.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g)
    sets.append({k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in t.items()})
grad = torch.randn(T, B, D, device="cuda", dtype=torch.bfloat16, generator=g)
def accumulated(i):
    out, _ = dense.gated_cell_cuda(**sets[i]); out.backward(grad)
def returned(i):
    out, _ = dense.gated_cell_cuda(**sets[i]); torch.autograd.grad(out, list(sets[i].values()), grad)
for name, f in (("accumulated", accumulated), ("returned", returned), ("accumulated", accumulated), ("returned", returned)):
    print(f"recurrent layer B=64 D=2048 fwd+bwd, gradients {name}: {bench.timeit(f, 20, 3, n)['median']:.3f} ms", flush=True)
dv = torch.randn(T * B, D, device="cuda", dtype=torch.bfloat16, generator=g)
for name, f in (("dv.float().sum(0)", lambda i: dv.float().sum(0)), ("dv.sum(0, dtype=float32)", lambda i: dv.sum(0, dtype=torch.float32))):
    print(f"db as {name}: {bench.timeit(f, 20, 3)['median']:.3f} ms", flush=True)
