"""Checks the baseline layers share: backend names, CUDA-only library paths, the absence
of a carried state, and the compute dtype under autocast."""
from __future__ import annotations

import torch

from ..variants.common import autocast_dtype, check_backend

__all__ = ["autocast_dtype", "check_backend", "require_cuda", "no_state", "DTYPES"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def require_cuda(y: torch.Tensor, level: str, library: str) -> None:
    """The library path of `level` runs only on CUDA tensors: say so before any work."""
    if y.device.type != "cuda":
        raise RuntimeError(f"{level} with backend='cuda' runs {library}, which needs CUDA tensors "
                           f"(got a {y.device.type} tensor); use backend='reference' on this machine")


def no_state(state, level: str) -> None:
    if state is not None:
        raise ValueError(f"{level} does not carry a state between calls (no TBPTT); pass state=None")
