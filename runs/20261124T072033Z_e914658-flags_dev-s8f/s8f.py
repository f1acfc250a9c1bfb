"""Dev pass s8f: ELMAN_FLAGS 128 (the state waits poll test_wait with a dummy mma.sync between
polls) now in the backward kernel too. Parity of E1 bf16 (every path, every gradient) with
flags 128; then forward and forward + backward per step, flags 0 against 128, three rounds."""
import os, sys, json
import torch
from elman import bench, dense, ops, parity, registry

OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()
T = 512
for f in ("128",):
    os.environ["ELMAN_FLAGS"] = f
    for lvl in ("E1", "E0"):
        recs = parity.check_entry(registry.get(lvl), ["bfloat16"])
        bad = [r for r in recs if not r["metrics"]["passed"]]
        print(f"{lvl} parity flags={f}: {len(recs)} records, {len(bad)} failed", flush=True)
        if bad:
            print(parity.table(bad)); sys.exit(1)
os.environ["ELMAN_FLAGS"] = "0"
bench.warm_up()
shapes = [(4, 1024), (16, 1024), (64, 1024), (16, 512), (64, 512)]
cache = {}
for B, D in shapes:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    cache[(B, D)] = (sets, *bench._op_fns(sets, True))
results = []
for rnd in range(3):
    for B, D in shapes:
        sets, fwd, fwdbwd = cache[(B, D)]
        for f in ("0", "128"):
            os.environ["ELMAN_FLAGS"] = f
            us = 1000 * bench.timeit(fwd, 20, 3, len(sets))["median"] / T
            usb = 1000 * bench.timeit(fwdbwd, 20, 3, len(sets))["median"] / T
            results.append((rnd, B, D, f, us, usb))
            print(f"round {rnd} B={B} D={D} flags={f}: forward {us:.3f} us/step, forward + backward {usb:.3f} us/step", flush=True)
json.dump({"results": results}, open(f"{OUT}/s8f.json", "w"))
