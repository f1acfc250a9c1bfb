"""Checks the baseline layers share: backend names, CUDA-only library paths, the absence
of a carried state, and the compute dtype under autocast; the tolerances of the Triton
baselines."""
from __future__ import annotations

import torch

from ..core.entry import DTYPES, Tolerance
from ..core.layer import autocast_dtype, check_backend

__all__ = ["autocast_dtype", "check_backend", "require_cuda", "no_state", "DTYPES", "TRITON_TOLERANCE"]

# mamba2 and fla-gdn against their fp64 references. fp32: Triton's tl.dot multiplies fp32
# operands on TF32 tensor cores unless a kernel asks otherwise (input_precision defaults to
# "tf32"); mamba-ssm 2.3.2's SSD kernels never ask, FLA 0.6.0's chunked kernels ask for
# "ieee" only in its triangular solve (FLA_TRIL_PRECISION, default ieee) and one product of
# wy_fast, and ask for tf32 outright in the fused kkt solve. TF32 keeps 10 mantissa bits:
# unit roundoff u = 2^-11 = 4.9e-4 per operand. The chunked algorithms chain 3 to 5 such
# products (intra-chunk, chunk states, state passing, output), the backward about twice as
# many: 5e-3 (10 u) forward, 1e-2 (20 u) for the gradients; far above the 1e-4 of an fp32
# CUDA variant, for that reason alone. bf16 (u = 2^-8 = 3.9e-3, fp32 accumulation): 2e-2
# (5 u) forward, 5e-2 (13 u) for the gradients.
TRITON_TOLERANCE = {"float32": Tolerance(5e-3, 1e-2), "bfloat16": Tolerance(2e-2, 5e-2)}


def require_cuda(y: torch.Tensor, level: str, library: str) -> None:
    """The library path of `level` runs only on CUDA tensors: say so before any work."""
    if y.device.type != "cuda":
        raise RuntimeError(f"{level} with backend='cuda' runs {library}, which needs CUDA tensors "
                           f"(got a {y.device.type} tensor); use backend='reference' on this machine")


def no_state(state, level: str) -> None:
    if state is not None:
        raise ValueError(f"{level} does not carry a state between calls (no TBPTT); pass state=None")
