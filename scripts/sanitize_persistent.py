"""Small persistent forward + backward runs through the ops (the dense family's: every D the
kernel takes, odd B, one cluster and several; the low-rank ones: every rank-tile count, a
partly filled last CTA, rank tiles in shared memory) for compute-sanitizer's memcheck;
gpu_pass.sh's `sanitize` stage runs

    compute-sanitizer --tool memcheck python scripts/sanitize_persistent.py

Racecheck runs on scripts/sanitize_persistent.cu instead (a plain CUDA program): under a
Python process that has loaded torch, racecheck of CUDA 13.0 stops with an internal error on
these kernels.
"""
import sys

import torch

from elman.families.dense import inputs, op as dense
from elman.families.twogemm import inputs as twogemm_inputs, op as twogemm

SHAPES = ((5, 3, 512), (4, 20, 1024), (3, 9, 256), (3, 17, 768), (3, 5, 2048), (3, 13, 2048),
          (4, 20, 2048), (3, 64, 2048), (3, 5, 384), (3, 20, 1152), (3, 64, 1920))
LOW_RANK = ((3, 1, 48, 5), (3, 3, 200, 17), (3, 9, 520, 64), (3, 4, 512, 128), (3, 2, 1024, 256),
            (3, 2, 2048, 128), (3, 2, 1280, 320), (3, 9, 1160, 320), (3, 1, 48, 300))


def main() -> int:
    g = torch.Generator(device="cuda").manual_seed(0)
    for T, B, D in SHAPES:
        kw = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in
              inputs.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g).items()}
        z = kw.pop("z")
        out, h = dense.cell("tanh_silu_gate", gates=(z,), **kw, path="persistent")
        (out.float().sum() + h.float().sum()).backward()
        torch.cuda.synchronize()
        assert dense.last_path == {"forward": "persistent", "backward": "persistent"}, dense.last_path
        print(f"T={T} B={B} D={D}: persistent forward + backward ran", flush=True)
    for T, B, D, r in LOW_RANK:
        x = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in twogemm_inputs.random_inputs(
            T, B, D, ("x", "z", "u", "v", "b", "h0"), "cuda", g, rank=r).items()}
        out, h = twogemm.lowrank_cell("gated_tanh", x["x"], x["z"], x["u"], x["v"], x["b"], x["h0"],
                                      path="persistent")
        (out.float().sum() + h.float().sum()).backward()
        torch.cuda.synchronize()
        assert twogemm.last_path == {"forward": "persistent", "backward": "persistent"}, twogemm.last_path
        print(f"T={T} B={B} D={D} r={r}: low-rank persistent forward + backward ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
