"""Every `lib/csrc/**/*.cu` (and the toy-epilogue unit tests/csrc/toy_epilogues.cu) compiles on
its own with nvcc for sm_90a (no torch headers), and the ptxas resource report shows no
register spills in any function; every family folder has a binding that defines a module."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from book_pages import ROOT

CSRC = ROOT / "lib" / "csrc"
SHARED = ("common",)  # header folders, no binding of their own
FAMILIES = sorted(p for p in CSRC.iterdir() if p.is_dir() and p.name not in SHARED)
TOY = ROOT / "tests" / "csrc" / "toy_epilogues.cu"
SOURCES = sorted(CSRC.rglob("*.cu")) + [TOY]
NVCC = shutil.which("nvcc")
FLAGS = ["-c", "-std=c++17", "-O3", "--expt-relaxed-constexpr",
         "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-I", str(CSRC)]
PROPERTIES = re.compile(
    r"Function properties for (\S+)\s*\n\s*(\d+) bytes stack frame, "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def spills(ptxas_report: str) -> dict[str, tuple[int, int]]:
    """{function: (spill store bytes, spill load bytes)} from `-Xptxas -v` output."""
    return {m[1]: (int(m[3]), int(m[4])) for m in PROPERTIES.finditer(ptxas_report)}


def test_layout_has_common_and_families():
    assert (CSRC / "common").is_dir(), "lib/csrc/common (shared headers) is missing"
    assert {p.name for p in FAMILIES} >= {"dense", "dev"}, [p.name for p in FAMILIES]
    assert not list(CSRC.glob("*.cu")) and not list(CSRC.glob("*.cpp")), \
        "sources belong in a family folder, not at the top of lib/csrc"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda p: p.name)
def test_every_family_has_a_binding(family: Path):
    binding = family / "binding.cpp"
    assert binding.is_file(), f"{family.name}: {binding} (its binding) is missing"
    assert "PYBIND11_MODULE" in binding.read_text(), f"{binding} defines no module"


def test_kernel_sources_include_no_torch():
    for src in [*CSRC.rglob("*.cu"), *CSRC.rglob("*.cuh"), *CSRC.rglob("*.h")]:
        if src.name in ("check.h", "binding.h"):  # binding-side validation headers
            continue
        text = src.read_text()
        assert "torch/" not in text and "ATen/" not in text, f"{src} includes torch headers"


def test_production_dense_build_has_no_trace_or_probes():
    from elman.core import extension
    files, defines, _ = extension.sources("dense")
    assert "-DELMAN_TRACE" not in defines and not any("dev" in p.parts for p in files)
    dev_files, dev_defines, _ = extension.sources("dev")
    assert "-DELMAN_TRACE" in dev_defines and CSRC / "dev" / "primitives.cu" in dev_files


def test_report_parser_reads_spills():
    report = ("ptxas info    : Function properties for _Z1fv\n"
              "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
              "ptxas info    : Function properties for _Z1gv\n"
              "    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n")
    assert spills(report) == {"_Z1fv": (0, 0), "_Z1gv": (12, 4)}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels' compile check needs it")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_kernel_compiles_without_spills(source: Path, tmp_path: Path):
    for defines in ([], ["-DELMAN_TRACE"]) if source.name == "persistent.cu" else ([],):
        proc = subprocess.run([NVCC, *FLAGS, *defines, str(source), "-o", str(tmp_path / "k.o")],
                              capture_output=True, text=True, timeout=900)
        report = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"nvcc {defines} failed on {source.name}:\n{report[-8000:]}"
        found = spills(report)
        assert found, f"ptxas reported no function for {source.name}:\n{report[-4000:]}"
        spilling = {name: s for name, s in found.items() if s != (0, 0)}
        assert not spilling, f"{source.name} {defines}: register spills (store, load bytes): {spilling}"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels' compile check needs it")
def test_toy_epilogues_instantiate_every_path(tmp_path: Path):
    """Two toy epilogues (no gate, two gates) compile on every path: 2 x (16 cluster + 16 grid
    (8 at D = 2048, 8 for the other widths) + 4 per-step) kernels."""
    proc = subprocess.run([NVCC, *FLAGS, str(TOY), "-o", str(tmp_path / "toy.o")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-8000:]
    kernels = spills(proc.stdout + proc.stderr)
    for name in ("forward_kernel", "backward_kernel", "grid_forward", "grid_backward",
                 "step_forward", "step_backward"):
        for toy in ("NoGate", "TwoGates"):
            assert any(name in k and toy in k for k in kernels), f"{name} of {toy} not instantiated"
    assert len(kernels) == 72, len(kernels)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels' compile check needs it")
def test_sanitize_program_builds_and_checks_its_arguments(tmp_path: Path):
    """scripts/sanitize_persistent.cu (the racecheck of gpu_pass.sh's sanitize stage) links
    against the persistent kernels through dense.h and twogemm.h alone, and refuses a
    malformed shape."""
    exe = tmp_path / "sanitize_persistent"
    proc = subprocess.run([NVCC, *[f for f in FLAGS if f not in ("-c", "-Xptxas", "-v")],
                           str(ROOT / "scripts" / "sanitize_persistent.cu"),
                           str(CSRC / "dense" / "persistent.cu"), str(CSRC / "dense" / "steps.cu"),
                           str(CSRC / "twogemm" / "persistent.cu"), "-o", str(exe)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-8000:]
    for shape in ("4,64", "4,8,512,0"):
        bad = subprocess.run([str(exe), shape], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "usage" in bad.stderr, (shape, bad.returncode, bad.stderr)
