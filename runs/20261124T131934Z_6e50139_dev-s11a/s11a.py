"""Dev pass s11a (see run_s11a.sh): 16 batch columns as two interleaved groups of 8 (B) against
the committed kernel (A, one group of 16). Each variant its own extension build and process.
Round 1 also saves the op's outputs at the parity suite's kind of shapes (forward and backward)
for bitwise comparisons: A and B at 8 batch columns (same arithmetic), and in B a 16-column
run against the same columns run as slices that take 8 columns a cluster (each column's
arithmetic is the same in both). Then forward and forward + backward per step (E1 bf16,
T = 512, the benchmark's timing method) and the traced step at D = 1024."""
import json, os, sys
import torch
from elman import bench, dense, ops

tag, rnd = sys.argv[1], sys.argv[2]
OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()


def run(t, d_out, d_hT):
    T, B, D = t["x"].shape
    out = torch.full((T, B, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    h_all = torch.full((T + 1, B, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    dv, dz = torch.full_like(out, float("nan")), torch.full_like(out, float("nan"))
    dh0 = torch.full_like(h_all[0], float("nan"))
    ext.dense_forward(t["x"], t["z"], t["w_h"], t["b"], t["h0"], out, h_all, dense.GATE_SILU, True)
    ext.dense_backward(t["w_h"], h_all, t["z"], d_out, d_hT, dv, dz, dh0, dense.GATE_SILU, True)
    torch.cuda.synchronize()
    return {"out": out, "h_all": h_all, "dv": dv, "dz": dz, "dh0": dh0}


if rnd == "1":
    outs, split_bad, split_n = {}, [], 0
    for T, B, D in [(7, 1, 256), (9, 5, 512), (5, 3, 768), (6, 13, 1024), (5, 20, 1024),
                    (3, 33, 512), (4, 64, 1024), (4, 70, 1024), (3, 130, 1024), (4, 9, 256),
                    (5, 64, 768), (4, 48, 1024)]:
        g = torch.Generator(device="cuda").manual_seed(T * 1000 + B * 10 + D)
        t = dense.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g)
        t = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in t.items()}
        d_out = torch.randn(T, B, D, device="cuda", generator=g).to(torch.bfloat16)
        d_hT = torch.randn(B, D, device="cuda", generator=g).to(torch.bfloat16)
        r = run(t, d_out, d_hT)
        bc = ext.dense_persistent_plan(B, D, False)["bc"]
        for name, v in r.items():
            assert not v.isnan().any(), (T, B, D, name)
            outs[f"{T}x{B}x{D}:{name}"] = v.cpu()
        if tag == "B":  # the same columns in slices of at most 56 (8 columns a cluster)
            for c0 in range(0, B, 56):
                c1 = min(B, c0 + 56)
                ts = {k: (v[:, c0:c1] if k in ("x", "z") else v[c0:c1] if k == "h0" else v).contiguous()
                      for k, v in t.items()}
                rs = run(ts, d_out[:, c0:c1].contiguous(), d_hT[c0:c1].contiguous())
                for name, v in rs.items():
                    full = r[name][:, c0:c1] if name != "dh0" else r[name][c0:c1]
                    split_n += 1
                    if not torch.equal(full, v):
                        split_bad.append(f"{T}x{B}x{D}:{name}[{c0}:{c1}]")
        print(f"{tag}: {T}x{B}x{D} plan {bc}", flush=True)
    torch.save(outs, f"/tmp/s11a_{tag}.pt")
    print(f"{tag}: outputs of {len(outs) // 5} shapes saved, no NaN", flush=True)
    if tag == "B":
        print(f"B: whole against sliced, {split_n} tensors compared, {len(split_bad)} differ", split_bad,
              flush=True)

bench.warm_up()
T = 512
res = []
for B, D in [(4, 512), (64, 512), (4, 1024), (16, 1024), (32, 1024), (48, 1024), (64, 1024), (64, 768)]:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    fwd, fwdbwd = bench._op_fns(sets, True)
    us = 1000 * bench.timeit(fwd, 30, 5, len(sets))["median"] / T
    usb = 1000 * bench.timeit(fwdbwd, 20, 3, len(sets))["median"] / T
    res.append({"variant": tag, "round": rnd, "B": B, "D": D, "fwd_us": us, "fwdbwd_us": usb})
    print(f"{tag} B={B} D={D}: forward {us:.3f} us/step, forward + backward {usb:.3f} us/step", flush=True)
for B in (16, 64):
    r = bench.trace_record(B, 1024)
    m = r["metrics"]
    cyc = {n: round(v * m["sm_clock_ghz"]) for n, v in m["phase_ns"].items()}
    cyc["rest"] = round(m["step_ns"] * m["sm_clock_ghz"]) - sum(cyc.values())
    res.append({"variant": tag, "round": rnd, "B": B, "D": 1024, "trace_step_ns": m["step_ns"],
                "ghz": m["sm_clock_ghz"], "phase_cycles": cyc})
    print(f"{tag} trace B={B} D=1024: step {m['step_ns']:.0f} ns at {m['sm_clock_ghz']:.2f} GHz "
          f"({m['step_ns'] * m['sm_clock_ghz']:.0f} cycles) {cyc}", flush=True)
with open(f"{OUT}/s11a.jsonl", "a") as f:
    for r in res:
        f.write(json.dumps(r) + "\n")
