"""Dev pass s10c (see run_s10c.sh): the s10a measurements with the finer trace marks of s10c_patch.py.
ldmatrix (one instruction for two k-steps at one n-tile, one k-step at two) instead of two
32-bit shared loads per k-step and n-tile. A = HEAD's dense_persistent.cu, B = this tree.
Each variant its own extension build and process (run_s10a.sh alternates A, B, A, B). This
script, for one variant: the persistent op's outputs at the parity suite's kind of shapes
(forward and backward, saved for a bitwise comparison between variants: the mma inputs are the
same, so the results must be bitwise equal), then forward and forward + backward per step at
the cluster design's benchmark shapes (E1 bf16, T = 512, the benchmark's timing method), then
the traced step at D = 1024."""
import json, os, sys
import torch
from elman import bench, dense, ops

tag, rnd = sys.argv[1], sys.argv[2]
OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()

if rnd == "1":
    outs = {}
    for T, B, D in [(7, 1, 256), (9, 5, 512), (5, 3, 768), (6, 13, 1024), (5, 20, 1024),
                    (3, 33, 512), (4, 64, 1024), (4, 70, 1024), (3, 130, 1024), (4, 9, 256)]:
        g = torch.Generator(device="cuda").manual_seed(T * 1000 + B * 10 + D)
        t = dense.random_inputs(T, B, D, ("x", "z", "w_h", "b", "h0"), "cuda", g)
        t = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in t.items()}
        d_out = torch.randn(T, B, D, device="cuda", generator=g).to(torch.bfloat16)
        d_hT = torch.randn(B, D, device="cuda", generator=g).to(torch.bfloat16)
        out = torch.full((T, B, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        h_all = torch.full((T + 1, B, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        dv, dz = torch.full_like(out, float("nan")), torch.full_like(out, float("nan"))
        dh0 = torch.full_like(h_all[0], float("nan"))
        ext.dense_forward(t["x"], t["z"], t["w_h"], t["b"], t["h0"], out, h_all, dense.GATE_SILU, True)
        ext.dense_backward(t["w_h"], h_all, t["z"], d_out, d_hT, dv, dz, dh0, dense.GATE_SILU, True)
        torch.cuda.synchronize()
        for name, v in (("out", out), ("h_all", h_all), ("dv", dv), ("dz", dz), ("dh0", dh0)):
            assert not v.isnan().any(), (T, B, D, name)
            outs[f"{T}x{B}x{D}:{name}"] = v.cpu()
    torch.save(outs, f"/tmp/s10c_{tag}.pt")
    print(f"{tag}: outputs of {len(outs) // 5} shapes saved, no NaN", flush=True)

bench.warm_up()
T = 512
res = []
for B, D in [(4, 512), (16, 512), (64, 512), (4, 1024), (16, 1024), (64, 1024)]:
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    fwd, fwdbwd = bench._op_fns(sets, True)
    us = 1000 * bench.timeit(fwd, 30, 5, len(sets))["median"] / T
    usb = 1000 * bench.timeit(fwdbwd, 20, 3, len(sets))["median"] / T
    res.append({"variant": tag, "round": rnd, "B": B, "D": D, "fwd_us": us, "fwdbwd_us": usb})
    print(f"{tag} B={B} D={D}: forward {us:.3f} us/step, forward + backward {usb:.3f} us/step", flush=True)
for B in (4, 16, 64):
    r = bench.trace_record(B, 1024)
    m = r["metrics"]
    names = ["expect+pre", "staging", "first wait", "multiply+partials", "epilogue+send"]
    cyc = {n: round(v * m["sm_clock_ghz"]) for n, v in zip(names, m["phase_ns"].values())}
    cyc["stores"] = round(m["step_ns"] * m["sm_clock_ghz"]) - sum(cyc.values())
    res.append({"variant": tag, "round": rnd, "B": B, "D": 1024, "trace_step_ns": m["step_ns"],
                "ghz": m["sm_clock_ghz"], "phase_cycles": cyc})
    print(f"{tag} trace B={B} D=1024: step {m['step_ns']:.0f} ns at {m['sm_clock_ghz']:.2f} GHz "
          f"({m['step_ns'] * m['sm_clock_ghz']:.0f} cycles) {cyc}", flush=True)
with open(f"{OUT}/s10c.jsonl", "a") as f:
    for r in res:
        f.write(json.dumps(r) + "\n")
