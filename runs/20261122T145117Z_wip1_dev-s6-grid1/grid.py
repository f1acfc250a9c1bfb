"""Dev pass of the grid design (D = 2048): plans, parity of every path, graph capture,
bitwise repeatability, timings beside the per-step path, the recurrent layer."""
import sys, time, torch
from elman import bench, dense, ops, parity, records, registry
ext = ops.load()
for B in (1, 4, 16, 20, 64, 70, 130):
    print("plan", B, ext.dense_persistent_plan(B, 2048, False), ext.dense_persistent_plan(B, 2048, True)["smem"], flush=True)
shapes = [(3, 2, 2048), (6, 20, 2048), (5, 64, 2048), (4, 70, 2048), (7, 1, 2048)]
for lvl in ("E1", "E0"):
    recs = parity.check_entry(registry.get(lvl), ["bfloat16"], shapes=shapes)
    bad = [r for r in recs if not r["metrics"]["passed"]]
    print(lvl, "parity", len(recs), "records,", len(bad), "failed", flush=True)
    if bad:
        print(parity.table(bad)); sys.exit(1)
# repeatability and graph capture
g = torch.Generator(device="cuda").manual_seed(7)
T, B, D = 40, 64, 2048
kw = {k: v.to(torch.bfloat16) for k, v in dense.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g).items()}
a = dense.gated_cell_cuda(**kw, path="persistent")[0]
b = dense.gated_cell_cuda(**kw, path="persistent")[0]
print("bitwise repeat:", torch.equal(a, b), flush=True)
try:
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(gr, stream=s):
            c = dense.gated_cell_cuda(**kw, path="persistent")[0]
    gr.replay(); torch.cuda.synchronize()
    print("graph capture:", torch.equal(a, c), flush=True)
except Exception as e:
    print("graph capture FAILED:", repr(e)[:300], flush=True)
bench.warm_up()
for B in (4, 16, 64, 70):
    t0 = time.time()
    new = bench.cell_records(B, 2048, 512, 20, impls=("cuda:persistent", "cuda:steps+graph"))
    if B == 64:
        new += bench.recurrent_layer_records(B, 2048, 512, 20)
    print(bench.summary(new), f"({time.time()-t0:.0f}s)", flush=True)
    records.write(new)
