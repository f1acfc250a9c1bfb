"""mamba-ssm without its compiled Mamba1 extension (the one shim the project needs).

mamba-ssm 2.3.2.post1 is installed here without compiling (`MAMBA_SKIP_CUDA_BUILD=TRUE
MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation --no-deps mamba-ssm==2.3.2.post1`,
see scripts/baseline-requirements.txt). Its import graph, read from that release:

- `import mamba_ssm` runs `mamba_ssm/__init__.py`, which imports
  `ops.selective_scan_interface`; that module does a bare `import selective_scan_cuda`,
  the compiled Mamba1 scan, which a build without CUDA does not have. This is the only
  hard import of compiled code, and the one this shim answers.
- Everything else it needs at import is Python: triton (`ops/triton/*`, `import triton`
  at module level), einops, packaging, huggingface_hub (`modules/mamba2.py`) and
  transformers (`utils/generation.py`, `utils/hf.py`).
- Optional pieces are imported under `try/except ImportError` and stay absent:
  causal_conv1d (so `Mamba2` must run with `use_mem_eff_path=False`, see
  `elman.baselines.mamba2`), tilelang and the CuTe DSL (Mamba3 only), flash_attn (MHA).

This project uses only mamba-ssm's Triton code: `Mamba2` (the SSD chunked scan and the
gated RMSNorm) and the fused add + RMSNorm `rms_norm_fn` of the LM wrapper. `load()`
registers a stand-in `selective_scan_cuda` module before the first import when the real
one cannot be imported; calling anything in the stand-in raises. A real compiled build,
when present, is used as is.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings


def import_quietly(name: str) -> types.ModuleType:
    """Import `name` without tqdm's IProgress warning: mamba_ssm's and fla's imports reach
    transformers, which imports tqdm.auto, which warns in a notebook kernel without ipywidgets."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        return importlib.import_module(name)


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
    if importlib.util.find_spec("mamba_ssm") is None:
        raise ImportError("mamba-ssm is not installed: see scripts/baseline-requirements.txt "
                          "(CPU machines) or scripts/build_baseline_wheels.sh (GPU host)")
    if "selective_scan_cuda" not in sys.modules:
        try:
            importlib.import_module("selective_scan_cuda")
        except ImportError:
            sys.modules["selective_scan_cuda"] = _stand_in()
    try:
        return import_quietly("mamba_ssm")
    except ImportError as exc:
        raise ImportError(f"mamba-ssm is installed but its dependency {exc.name!r} is missing "
                          f"({exc}); see scripts/baseline-requirements.txt") from exc
