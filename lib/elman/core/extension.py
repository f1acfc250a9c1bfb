"""The compiled CUDA extensions: one per kernel family, built on first use, cached, and never
replaced silently.

`load(family)` compiles `lib/csrc/<family>/` (kernels, host loops, the binding) with the shared
headers of `lib/csrc/common/` into the module `elman_<family>`, for each kernel family that has
a folder there (`FAMILIES`: dense, diagonal, matrix, twogemm); `load("dense",
jitter=True)` builds the same sources with ELMAN_JITTER as `elman_dense_jitter` (only the
race test uses it); `load("dev")` builds `elman_dev`: the synchronisation probes of
`lib/csrc/dev/` and the dense persistent forward with its trace (ELMAN_TRACE), which the
production module does not contain. A compile error in one family's folder cannot break
another's module. Builds use `torch.utils.cpp_extension.load` (ninja), are cached under
`$ELMAN_BUILD_DIR` (default `~/.cache/elman/<torch>-<cuda>-sm<cc>/<module>`), and print how
long they took and for which target. Everything that needs a GPU raises
`ExtensionUnavailable` with what to do instead; nothing falls back to the reference.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).resolve().parent.parent.parent / "csrc"
FAMILIES = tuple(f for f in ("dense", "diagonal", "matrix", "twogemm") if (CSRC / f / "binding.cpp").is_file())
NAMES = (*FAMILIES, "dev")
_modules: dict[str, ModuleType] = {}
_poison = False
build_seconds: dict[str, float] = {}


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


def module_name(name: str = "dense", jitter: bool = False) -> str:
    """The Python module a build produces: elman_<family>, elman_dense_jitter, elman_dev."""
    if name not in NAMES:
        raise ValueError(f"unknown extension {name!r}; one of {NAMES}")
    if jitter and name != "dense":
        raise ValueError("the jitter build exists for the dense family only")
    return f"elman_{name}" + ("_jitter" if jitter else "")


def sources(name: str = "dense") -> tuple[list[Path], list[str], list[str]]:
    """(source files, defines, extra linker flags) of one extension."""
    dense = CSRC / "dense"
    if name in FAMILIES:
        folder = CSRC / name
        return sorted((*folder.glob("*.cu"), *folder.glob("*.cpp"))), [], ["-lcublas"]
    if name == "dev":  # probes + the traced persistent forward (no cuBLAS: no per-step path)
        dev = sorted((*(CSRC / "dev").glob("*.cu"), *(CSRC / "dev").glob("*.cpp")))
        return dev + [dense / "persistent.cu", dense / "steps.cu"], ["-DELMAN_TRACE"], []
    raise ValueError(f"unknown extension {name!r}; one of {NAMES}")


def load(name: str = "dense", jitter: bool = False, verbose: bool = False) -> ModuleType:
    """Build (first call) or load one extension; raise a clear error when impossible.

    `name` is a kernel family of `FAMILIES` (its kernels and binding) or "dev" (probes and
    traces).
    `jitter=True` builds the dense module whose persistent kernels sleep pseudo-random times
    at their synchronisation points (ELMAN_JITTER in lib/csrc/common/cluster.cuh); only
    tests/test_jitter_gpu.py uses it."""
    module = module_name(name, jitter)
    if module in _modules:
        return _modules[module]
    if not torch.cuda.is_available():
        raise ExtensionUnavailable(
            f"the elman CUDA extension {module} needs a CUDA GPU and none is visible; "
            "use backend='reference' on this machine")
    if torch.version.cuda is None:
        raise ExtensionUnavailable("this torch build has no CUDA support; install a CUDA build of torch")
    cc = torch.cuda.get_device_capability()
    if cc < (8, 0):
        raise ExtensionUnavailable(f"the kernels need compute capability >= 8.0, this GPU has {cc}")
    from torch.utils.cpp_extension import load as cpp_load

    files, defines, ldflags = sources(name)
    defines = defines + (["-DELMAN_JITTER"] if jitter else [])
    out = build_dir(cc) / module
    out.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", *_arch_flags(cc), *defines]
    t0 = time.perf_counter()
    try:
        ext = cpp_load(name=module, sources=[str(p) for p in files], build_directory=str(out),
                       extra_include_paths=[str(CSRC)], extra_cflags=["-O3", "-std=c++17", *defines],
                       extra_cuda_cflags=flags, extra_ldflags=ldflags, verbose=verbose)
    except Exception as exc:  # compiler output is in the exception text
        raise ExtensionUnavailable(
            f"building the elman CUDA extension {module} failed (sources in {CSRC}; "
            f"rerun with load({name!r}, verbose=True) for the compiler's output): {exc}") from exc
    seconds = time.perf_counter() - t0
    print(f"elman: CUDA extension {module} ready in {seconds:.1f} s "
          f"(target {' '.join(_arch_flags(cc))}, cache folder {out.name})", flush=True)
    _modules[module] = ext
    build_seconds[module] = seconds
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
