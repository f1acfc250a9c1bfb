"""Dev pass s9a: the grid design (D = 2048) with ELMAN_FLAGS 1 (the multiply's slice waits poll
with a dummy mma.sync, mbar_wait_busy, as the cluster design since version 23) and 2 (at 8 and
16 batch columns, the mma.sync path reads each state slice straight from L2 after its counter:
no bulk copy, no mbarrier, no proxy fences). Parity of E1 and E0 bf16 at five D = 2048 shapes
(every path, every gradient) under each flag set; then forward and forward + backward per step
at B = 4, 16, 64 for flags 0, 1, 2, 3, three rounds in one process."""
import os, sys, json
import torch
from elman import bench, dense, ops, parity, registry

OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()
T = 512
SHAPES = [(7, 1, 2048), (9, 5, 2048), (6, 16, 2048), (5, 20, 2048), (5, 64, 2048)]
FLAGS = ("0", "1", "2", "3")
for f in FLAGS:
    os.environ["ELMAN_FLAGS"] = f
    for lvl in ("E1", "E0"):
        recs = parity.check_entry(registry.get(lvl), ["bfloat16"], shapes=SHAPES)
        bad = [r for r in recs if not r["metrics"]["passed"]]
        print(f"{lvl} parity flags={f}: {len(recs)} records, {len(bad)} failed", flush=True)
        if bad:
            print(parity.table(bad)); sys.exit(1)
os.environ["ELMAN_FLAGS"] = "0"
bench.warm_up()
shapes = [(4, 2048), (16, 2048), (64, 2048)]
cache = {}
for B, D in shapes:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    cache[(B, D)] = (sets, *bench._op_fns(sets, True))
results = []
for rnd in range(3):
    for B, D in shapes:
        sets, fwd, fwdbwd = cache[(B, D)]
        for f in FLAGS:
            if B == 64 and f in ("2", "3"):
                continue  # flag 2 acts on the mma.sync path (B <= 16) only
            os.environ["ELMAN_FLAGS"] = f
            us = 1000 * bench.timeit(fwd, 20, 3, len(sets))["median"] / T
            usb = 1000 * bench.timeit(fwdbwd, 20, 3, len(sets))["median"] / T
            results.append((rnd, B, D, f, us, usb))
            print(f"round {rnd} B={B} D={D} flags={f}: forward {us:.3f} us/step, "
                  f"forward + backward {usb:.3f} us/step", flush=True)
json.dump({"results": results}, open(f"{OUT}/s9a.json", "w"))
