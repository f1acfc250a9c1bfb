"""Dev pass s10e: the grid design (D = 2048) with its per-step chores off warp 0
(s10e_patch.py) against HEAD. For one variant: outputs at D = 2048 shapes (saved for a bitwise
comparison), forward and forward + backward per step at B = 4, 16, 64 (E1 bf16, T = 512, the
benchmark's method), and the traced step."""
import json, os, sys
import torch
from elman import bench, dense, ops

tag, rnd = sys.argv[1], sys.argv[2]
OUT = os.environ.get("OUT", "/tmp")
ext = ops.load()
if rnd == "1":
    outs = {}
    for T, B, D in [(5, 5, 2048), (4, 16, 2048), (4, 20, 2048), (3, 33, 2048), (4, 64, 2048)]:
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
    torch.save(outs, f"/tmp/s10e_{tag}.pt")
bench.warm_up()
T = 512
res = []
for B in (4, 16, 64):
    D = 2048
    sets = bench._cell_inputs(T, B, D, bench.rotation(5 * T * B * D * 2))
    fwd, fwdbwd = bench._op_fns(sets, True)
    us = 1000 * bench.timeit(fwd, 30, 5, len(sets))["median"] / T
    usb = 1000 * bench.timeit(fwdbwd, 20, 3, len(sets))["median"] / T
    r = bench.trace_record(B, D)["metrics"]
    cyc = {k: round(v * r["sm_clock_ghz"]) for k, v in r["phase_ns"].items()}
    res.append({"variant": tag, "round": rnd, "B": B, "D": D, "fwd_us": us, "fwdbwd_us": usb,
                "trace_step_ns": r["step_ns"], "ghz": r["sm_clock_ghz"], "phase_cycles": cyc})
    print(f"{tag} B={B} D={D}: forward {us:.3f} us/step, forward + backward {usb:.3f} us/step; "
          f"trace {r['step_ns']:.0f} ns at {r['sm_clock_ghz']:.2f} GHz {cyc}", flush=True)
with open(f"{OUT}/s10e.jsonl", "a") as f:
    for r in res:
        f.write(json.dumps(r) + "\n")
