"""The add + RMSNorm implementations on the GPU at the LM's shape (E1 d1280 x 6, B 64, T 512:
rows of 1280, x bf16, the residual fp32, a gradient reaching both outputs): agreement with the
PyTorch path (`lm.compare_norms`) and the time of the forward and of the backward of each,
against the memory floor (bytes each must move at the copy bandwidth measured here).

Run on a GPU: python dev/addnorm_gpu_check.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from elman.training import lm  # noqa: E402
from elman.training.addnorm import add_rms_norm  # noqa: E402

T, B, N = 512, 64, 1280


def timed(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main() -> None:
    for impl in ("fused", "elman"):
        print(impl, {k: f"{v:.3g}" for k, v in lm.compare_norms(dim=N, rows=4096, impl=impl).items()})
    big = torch.empty(2 ** 29, dtype=torch.bfloat16, device="cuda")
    copy_gbs = 2 * big.numel() * 2 / timed(lambda: big.clone(), 5) / 1e6
    del big
    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(T, B, N, device="cuda", generator=g).bfloat16().requires_grad_()
    res = torch.randn(T, B, N, device="cuda", generator=g).requires_grad_()
    w = torch.ones(N, device="cuda", requires_grad=True)
    dy = torch.randn(T, B, N, device="cuda", generator=g).bfloat16()
    dr = torch.randn(T, B, N, device="cuda", generator=g)
    fused = lm._fused_rms_norm()
    impls = {"fused": lambda: fused(x, w, None, residual=res, prenorm=True, residual_in_fp32=True, eps=lm.EPS),
             "elman": lambda: add_rms_norm(x, w, res)}
    rows = T * B
    floor_fwd = rows * N * (2 + 4 + 2 + 4) / copy_gbs / 1e6
    floor_bwd = rows * N * (2 + 4 + 4 + 2 + 4) / copy_gbs / 1e6
    print(f"copy {copy_gbs:.0f} GB/s; floor: forward {floor_fwd:.3f} ms, backward {floor_bwd:.3f} ms")
    for name, fn in impls.items():
        with torch.no_grad():
            fwd = timed(fn)
        y, r = fn()

        def backward():
            torch.autograd.grad((y, r), (x, w, res), (dy, dr), retain_graph=True)
        bwd = timed(backward)
        print(f"{name:6s} forward {fwd:.3f} ms ({floor_fwd / fwd:.0%} of the floor's speed), "
              f"backward {bwd:.3f} ms ({floor_bwd / bwd:.0%})")


if __name__ == "__main__":
    main()
