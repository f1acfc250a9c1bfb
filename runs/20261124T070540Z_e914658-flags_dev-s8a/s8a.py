"""Dev pass s8a: why do the cluster kernels run at a lower SM clock with two or more clusters?
ELMAN_FLAGS variants of the forward (code not kept): 1 no output stores (timing only), 2 waits
with a suspend-time hint, 4 streaming (.cs) output stores, 8 waits that sleep between polls.
For each shape and variant: untraced forward per step (events, rotating inputs), the traced
kernel's cycles and clock, and a sustained 1.2 s loop during which nvidia-smi samples the SM
clock, power and clock-event reasons every 20 ms. Also two single-cluster kernels at once on
two streams. Parity of every flag variant first (the GPU parity test file)."""
import os, subprocess, sys, time, json, statistics
import torch
from elman import bench, dense, ops

OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()
T = 512

# Parity of each variant: E1 bf16, every path, the parity suite's shapes (flags act on the
# persistent forward only).
from elman import parity, registry
for f in ("0", "2", "4", "8"):  # 1 leaves the outputs unwritten: timing only
    os.environ["ELMAN_FLAGS"] = f
    recs = parity.check_entry(registry.get("E1"), ["bfloat16"])
    bad = [r for r in recs if not r["metrics"]["passed"]]
    print(f"parity flags={f}: {len(recs)} records, {len(bad)} failed", flush=True)
    if bad:
        print(parity.table(bad)); sys.exit(1)
os.environ["ELMAN_FLAGS"] = "0"

smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active",
                        "--format=csv,noheader,nounits", "-lms", "20"], stdout=open(f"{OUT}/smi.csv", "w"))
windows = []
bench.warm_up()


def traced(B, D):
    r = bench.trace_record(B, D, T)
    m = r["metrics"]
    return m["step_ns"] * m["sm_clock_ghz"], m["sm_clock_ghz"]


def sustained(label, fns, seconds=1.2):
    t0 = time.time()
    n = 0
    while time.time() - t0 < seconds:
        for f in fns:
            f()
        n += 1
        if n % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    windows.append((label, t0, time.time()))


shapes = [(4, 1024), (16, 1024), (56, 1024), (16, 512), (4, 512)]
cache = {}
for B, D in shapes:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    cache[(B, D)] = (sets, bench._op_fns(sets, True)[0])
results = []
for rnd in range(2):
    for B, D in shapes:
        sets, fwd = cache[(B, D)]
        n = len(sets)
        for f in ("0", "1", "2", "4", "8"):
            os.environ["ELMAN_FLAGS"] = f
            us = 1000 * bench.timeit(fwd, 20, 3, n)["median"] / T
            cyc, ghz = traced(B, D)
            results.append((rnd, B, D, f, us, cyc, ghz))
            print(f"round {rnd} B={B} D={D} flags={f}: {us:.3f} us/step untraced; traced {cyc:.0f} cyc/step at {ghz:.2f} GHz", flush=True)
os.environ["ELMAN_FLAGS"] = "0"

# Sustained loops for nvidia-smi.
for B, D in shapes:
    sets, fwd = cache[(B, D)]
    for f in ("0", "1", "8"):
        os.environ["ELMAN_FLAGS"] = f
        sustained(f"B{B} D{D} flags{f}", [lambda: fwd(0)])
os.environ["ELMAN_FLAGS"] = "0"
# Two single-cluster kernels at once (B = 4, D = 1024 twice, two streams).
sets, fwd = cache[(4, 1024)]
_, fwd2 = bench._op_fns(sets, True)
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
def both():
    with torch.cuda.stream(s1):
        fwd(0)
    with torch.cuda.stream(s2):
        fwd2(1)
sustained("2x B4 D1024 two streams", [both])
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
ev[0].record(); [both() for _ in range(20)]; torch.cuda.synchronize(); ev[1].record(); torch.cuda.synchronize()
print(f"two streams, B=4 D=1024 each: {1000 * ev[0].elapsed_time(ev[1]) / 20 / T:.3f} us per step of the pair", flush=True)
# A D = 2048 grid-design reference.
sets = bench._cell_inputs(T, 4, 2048, 2)
g = bench._op_fns(sets, True)[0]
sustained("B4 D2048 grid", [lambda: g(0)])
time.sleep(0.3)
smi.terminate(); smi.wait()

# Summarise nvidia-smi samples per window.
import datetime
rows = []
for line in open(f"{OUT}/smi.csv"):
    p = [x.strip() for x in line.split(",")]
    try:
        ts = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((ts, float(p[1]), float(p[2]), float(p[3]), float(p[4]), p[5]))
    except Exception:
        pass
# nvidia-smi prints local time; align by the offset between the clocks (same host).
off = time.time() - datetime.datetime.now().timestamp()
for label, a, b in windows:
    inside = [r for r in rows if a + 0.3 <= r[0] + off <= b]
    if not inside:
        print(label, "no samples"); continue
    sm = [r[1] for r in inside]; pw = [r[3] for r in inside]
    reasons = sorted(set(r[5] for r in inside))
    print(f"smi {label}: {len(inside)} samples, SM {statistics.median(sm):.0f} MHz (min {min(sm):.0f}, max {max(sm):.0f}), "
          f"mem {inside[0][2]:.0f} MHz, power {statistics.median(pw):.0f} W, temp {inside[-1][4]:.0f} C, reasons {reasons}", flush=True)
json.dump({"results": results, "windows": windows}, open(f"{OUT}/s8a.json", "w"))
