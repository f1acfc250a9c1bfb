"""mamba-ssm without its compiled Mamba1 extension (the one shim the project needs).

The package `mamba_ssm` imports `selective_scan_cuda`, the compiled Mamba1 selective scan,
when it is first imported. This project uses only the parts of mamba-ssm that run on
Triton: `Mamba2` (the SSD chunked scan) and the fused add + RMSNorm `rms_norm_fn`. On
machines where mamba-ssm was installed without compiling (`MAMBA_SKIP_CUDA_BUILD=TRUE`),
`load()` registers a stand-in module under that name before the first import; calling
anything in the stand-in raises. A real compiled build, when present, is used as is.
"""
from __future__ import annotations

import importlib
import sys
import types


def _stand_in() -> types.ModuleType:
    mod = types.ModuleType("selective_scan_cuda")
    mod.__doc__ = "elman stand-in: the compiled Mamba1 selective scan is not installed"

    def missing(*args, **kwargs):
        raise RuntimeError("the compiled Mamba1 selective scan (selective_scan_cuda) is not "
                           "installed; elman uses only mamba-ssm's Triton paths (Mamba2, RMSNorm)")

    mod.fwd = mod.bwd = missing
    return mod


def load() -> types.ModuleType:
    """Import and return `mamba_ssm`, registering the stand-in first if needed."""
    if "selective_scan_cuda" not in sys.modules:
        try:
            importlib.import_module("selective_scan_cuda")
        except ImportError:
            sys.modules["selective_scan_cuda"] = _stand_in()
    try:
        return importlib.import_module("mamba_ssm")
    except ImportError as exc:
        raise ImportError("mamba-ssm is not installed: `pip install -r requirements.txt` "
                          "(see README) or carry its wheel to the GPU host") from exc
