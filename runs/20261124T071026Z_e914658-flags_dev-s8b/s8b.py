"""Dev pass s8b: (1) the SM clock (clock64 against %globaltimer) of a synthetic kernel doing
one kind of work (.dev/clockprobe.py); (2) ELMAN_FLAGS variants of the cluster forward's
output stores (code not kept): 0 as committed (2-byte stores by every thread after the
publish), 1 none (timing only), 16 through a shared outbox as 16-byte stores every step,
32 the same every 4 steps. Parity (E1 bf16, every path) and bitwise equality with flags 0
first; then untraced forward per step and the traced kernel's cycles and clock, two rounds."""
import os, sys, json
import torch
sys.path.insert(0, os.path.dirname(__file__))
from elman import bench, dense, ops, parity, registry
import clockprobe

OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()
T = 512
probe = clockprobe.main()

for f in ("16", "32"):
    os.environ["ELMAN_FLAGS"] = f
    recs = parity.check_entry(registry.get("E1"), ["bfloat16"])
    bad = [r for r in recs if not r["metrics"]["passed"]]
    print(f"parity flags={f}: {len(recs)} records, {len(bad)} failed", flush=True)
    if bad:
        print(parity.table(bad)); sys.exit(1)
g = torch.Generator(device="cuda").manual_seed(3)
for B, D, TT in ((5, 1024, 9), (16, 1024, 7), (20, 512, 6), (64, 1024, 5)):
    kw = {k: v.to(torch.bfloat16) for k, v in dense.random_inputs(TT, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g).items()}
    outs = {}
    for f in ("0", "16", "32"):
        os.environ["ELMAN_FLAGS"] = f
        outs[f] = dense.gated_cell_cuda(**kw, path="persistent")
    same = all(torch.equal(outs["0"][i], outs[f][i]) for f in ("16", "32") for i in range(2))
    print(f"B={B} D={D} T={TT}: flags 16 and 32 bitwise equal to 0: {same}", flush=True)
os.environ["ELMAN_FLAGS"] = "0"
bench.warm_up()
shapes = [(4, 1024), (16, 1024), (56, 1024), (64, 1024), (16, 512), (64, 512)]
cache = {}
for B, D in shapes:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    cache[(B, D)] = (sets, bench._op_fns(sets, True)[0])
results = []
for rnd in range(2):
    for B, D in shapes:
        sets, fwd = cache[(B, D)]
        for f in ("0", "1", "16", "32"):
            os.environ["ELMAN_FLAGS"] = f
            us = 1000 * bench.timeit(fwd, 20, 3, len(sets))["median"] / T
            m = bench.trace_record(B, D, T)["metrics"]
            cyc, ghz = m["step_ns"] * m["sm_clock_ghz"], m["sm_clock_ghz"]
            results.append((rnd, B, D, f, us, cyc, ghz))
            print(f"round {rnd} B={B} D={D} flags={f}: {us:.3f} us/step untraced; traced {cyc:.0f} cyc/step at {ghz:.2f} GHz", flush=True)
json.dump({"probe": probe, "results": results}, open(f"{OUT}/s8b.json", "w"))
