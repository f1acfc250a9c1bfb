"""Small persistent forward + backward runs (every D the kernel takes, odd B, waves of
clusters) for compute-sanitizer; gpu_pass.sh's `sanitize` stage runs it under memcheck and
racecheck:

    compute-sanitizer --tool memcheck python scripts/sanitize_persistent.py
    compute-sanitizer --tool racecheck --kernel-name kns=ward_kernel \
        python scripts/sanitize_persistent.py --small

(racecheck of CUDA 13.0 stops with an internal error on these kernels at every size: runs
20261122T102755Z and 20261122T120100Z_f37f80e_dev-racecheck-probe. It does follow each exchange
mechanism alone, and making the staging synchronous does not help; see the probe run's notes.
The race check of these kernels is tests/test_jitter_gpu.py.)
"""
import sys

import torch

from elman import dense

SHAPES = ((5, 3, 512), (4, 20, 1024), (3, 9, 256), (3, 17, 768))


def main() -> int:
    g = torch.Generator(device="cuda").manual_seed(0)
    for T, B, D in SHAPES[:2] if "--small" in sys.argv else SHAPES:
        kw = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in
              dense.random_inputs(T, B, D, ("x", "z", "w_x", "w_h", "b", "h0"), "cuda", g).items()}
        out, h = dense.gated_cell_cuda(**kw, path="persistent")
        (out.float().sum() + h.float().sum()).backward()
        torch.cuda.synchronize()
        assert dense.last_path == {"forward": "persistent", "backward": "persistent"}, dense.last_path
        print(f"T={T} B={B} D={D}: persistent forward + backward ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
