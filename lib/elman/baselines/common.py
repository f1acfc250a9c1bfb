"""Checks the baseline layers share: backend names, CUDA-only library paths, the absence
of a carried state, the compute dtype under autocast, the inputs of a library's fast path
(`check_tensors`); the tolerances of the Triton baselines."""
from __future__ import annotations

import torch

from ..core.entry import DTYPES, Tolerance
from ..core.layer import autocast_dtype, check_backend, check_sequence, inner_width

__all__ = ["autocast_dtype", "check_backend", "check_sequence", "check_tensors", "inner_width",
           "require_cuda", "no_state", "DTYPES", "TRITON_TOLERANCE"]
FLOATS = (torch.float32, torch.bfloat16, torch.float16)

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


def check_tensors(level: str, dims: dict[str, str], tensors: dict[str, torch.Tensor | None],
                  same_dtype: tuple[str, ...] = (), cuda: bool = True,
                  dtypes: tuple[torch.dtype, ...] = FLOATS) -> dict[str, int]:
    """Before a library kernel runs: every given tensor on one device, CUDA if `cuda`, of a
    dtype in `dtypes`, with the dimensions `dims` names ("b l h p": one token a size,
    bound by the first tensor that has it), none of them zero; the tensors named in
    `same_dtype` in one dtype. Raises ValueError naming the tensor; returns the sizes."""
    sizes: dict[str, int] = {}
    first = device = None
    for name, t in tensors.items():
        if t is None:
            continue
        device = device or t.device
        if (cuda and t.device.type != "cuda") or t.device != device:
            raise ValueError(f"{level}: {name} is on {t.device}; every input must be on one "
                             f"{'CUDA ' if cuda else ''}device ({device})")
        if t.dtype not in dtypes:
            raise ValueError(f"{level}: {name} has dtype {t.dtype}; the kernels take {dtypes}")
        if name in same_dtype:
            first = first or (name, t.dtype)
            if t.dtype != first[1]:
                raise ValueError(f"{level}: {name} has dtype {t.dtype}, {first[0]} has {first[1]}; "
                                 "they must match")
        want = dims[name].split()
        if t.dim() != len(want):
            raise ValueError(f"{level}: {name} must be [{', '.join(want)}], got shape {tuple(t.shape)}")
        for letter, n in zip(want, t.shape):
            if sizes.setdefault(letter, n) != n:
                raise ValueError(f"{level}: {name} must be [{', '.join(want)}] with {letter} = "
                                 f"{sizes[letter]}, got shape {tuple(t.shape)}")
    empty = [k for k, n in sizes.items() if n == 0]
    if empty:
        raise ValueError(f"{level}: empty dimension {', '.join(f'{k} = 0' for k in empty)}; "
                         "every size must be at least 1")
    return sizes
