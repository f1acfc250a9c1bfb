"""Dev pass s9c: is version 23 (the busy wait, mbar_wait_busy) faster in the build without the
development flag code? The D <= 1024 cells of every run since it landed (sessions 8, 9) are
3-17 % slower than session 7's, while the grid design's D = 2048 cells (unchanged) are not.
Variant A: the committed tree (busy wait). Variant B: the same tree with the cluster kernels'
wait_source back on mbar_wait (session 7's wait). Each variant is its own extension build, in
its own process; this script times one variant: forward and forward + backward per step at the
cluster design's benchmark shapes, E1 bf16, T = 512, the benchmark's method (bench.timeit,
inputs rotated), then the trace of the step at B = 4 and 16, D = 1024. run_s9c.sh alternates
A, B, A, B on one machine."""
import json, os, sys
import torch
from elman import bench, ops

tag = sys.argv[1]
OUT = os.environ.get("OUT", "/tmp")
ops.load()
bench.warm_up()
T = 512
res = []
for B, D in [(4, 512), (16, 512), (64, 512), (4, 1024), (16, 1024), (64, 1024)]:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    fwd, fwdbwd = bench._op_fns(sets, True)
    us = 1000 * bench.timeit(fwd, 30, 5, len(sets))["median"] / T
    usb = 1000 * bench.timeit(fwdbwd, 20, 3, len(sets))["median"] / T
    res.append({"variant": tag, "B": B, "D": D, "fwd_us": us, "fwdbwd_us": usb})
    print(f"{tag} B={B} D={D}: forward {us:.3f} us/step, forward + backward {usb:.3f} us/step", flush=True)
for B in (4, 16):
    r = bench.trace_record(B, 1024)
    m = r["metrics"]
    res.append({"variant": tag, "B": B, "D": 1024, "trace_step_ns": m["step_ns"], "ghz": m["sm_clock_ghz"],
                "phase_ns": m["phase_ns"]})
    print(f"{tag} trace B={B} D=1024: step {m['step_ns']:.0f} ns at {m['sm_clock_ghz']:.2f} GHz "
          f"({m['step_ns'] * m['sm_clock_ghz']:.0f} cycles)", flush=True)
with open(f"{OUT}/s9c.jsonl", "a") as f:
    for r in res:
        f.write(json.dumps(r) + "\n")
