"""The compiled CUDA extension: built on first use, cached, and never replaced silently.

`load()` compiles `lib/csrc/*.cu` and `*.cpp` (the binding and the cuBLAS host loop) with
`torch.utils.cpp_extension.load` (ninja), caches the build under
`$ELMAN_BUILD_DIR` (default `~/.cache/elman/<torch>-<cuda>-sm<cc>`), and prints how long
the build took and for which target. Everything that needs a GPU raises
`ExtensionUnavailable` with what to do instead; nothing falls back to the reference.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent.parent / "csrc"
_ext = None
_ext_jitter = None
_poison = False
build_seconds: float | None = None


class ExtensionUnavailable(RuntimeError):
    pass


def _arch_flags(cc: tuple[int, int]) -> list[str]:
    major, minor = cc
    if (major, minor) == (9, 0):  # Hopper: wgmma-era instructions and clusters need sm_90a
        return ["-gencode=arch=compute_90a,code=sm_90a"]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def build_dir(cc: tuple[int, int]) -> Path:
    root = Path(os.environ.get("ELMAN_BUILD_DIR", Path.home() / ".cache" / "elman"))
    tag = f"torch{torch.__version__.split('+')[0]}-cuda{torch.version.cuda}-sm{cc[0]}{cc[1]}"
    return root / tag


def load(verbose: bool = False, jitter: bool = False):
    """Build (first call) or load the extension; raise a clear error when impossible.

    `jitter=True` builds a second module, `elman_cuda_jitter`, whose persistent kernels sleep
    pseudo-random times at their synchronisation points (ELMAN_JITTER in
    lib/csrc/cluster.cuh); only tests/test_jitter_gpu.py uses it."""
    global _ext, _ext_jitter, build_seconds
    if jitter and _ext_jitter is not None:
        return _ext_jitter
    if not jitter and _ext is not None:
        return _ext
    if not torch.cuda.is_available():
        raise ExtensionUnavailable(
            "the elman CUDA extension needs a CUDA GPU and none is visible; "
            "use backend='reference' on this machine")
    if torch.version.cuda is None:
        raise ExtensionUnavailable("this torch build has no CUDA support; install a CUDA build of torch")
    cc = torch.cuda.get_device_capability()
    if cc < (8, 0):
        raise ExtensionUnavailable(f"the kernels need compute capability >= 8.0, this GPU has {cc}")
    from torch.utils.cpp_extension import load as cpp_load

    sources = sorted(str(p) for p in (*CSRC.glob("*.cpp"), *CSRC.glob("*.cu")))
    out = build_dir(cc) / "jitter" if jitter else build_dir(cc)
    out.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", *_arch_flags(cc)]
    flags += ["-DELMAN_JITTER"] if jitter else []
    t0 = time.perf_counter()
    try:
        ext = cpp_load(name="elman_cuda_jitter" if jitter else "elman_cuda", sources=sources,
                       build_directory=str(out), extra_cflags=["-O3", "-std=c++17"],
                       extra_cuda_cflags=flags, extra_ldflags=["-lcublas"], verbose=verbose)
    except Exception as exc:  # compiler output is in the exception text
        raise ExtensionUnavailable(f"building the elman CUDA extension failed: {exc}") from exc
    seconds = time.perf_counter() - t0
    print(f"elman: CUDA extension{' (jitter build)' if jitter else ''} ready in {seconds:.1f} s "
          f"(target {' '.join(_arch_flags(cc))}, cache {out})", flush=True)
    if jitter:
        _ext_jitter = ext
    else:
        _ext, build_seconds = ext, seconds
    return ext


def empty(shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Allocate an output; inside `poisoned()` it is filled with NaN so unwritten
    elements show up in parity checks."""
    dtype = dtype or like.dtype
    if _poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def is_poisoned() -> bool:
    return _poison


@contextlib.contextmanager
def poisoned():
    global _poison
    prev, _poison = _poison, True
    try:
        yield
    finally:
        _poison = prev
