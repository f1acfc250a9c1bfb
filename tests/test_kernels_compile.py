"""Every `lib/csrc/*.cu` compiles on its own with nvcc for sm_90a (no torch headers), and the
ptxas resource report shows no register spills in any function."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from book_pages import ROOT

CSRC = ROOT / "lib" / "csrc"
BINDING = CSRC / "binding.cpp"  # the one binding file `elman.ops.load` compiles
SOURCES = sorted(CSRC.glob("*.cu"))
NVCC = shutil.which("nvcc")
FLAGS = ["-c", "-std=c++17", "-O3", "--expt-relaxed-constexpr",
         "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-I", str(CSRC)]
PROPERTIES = re.compile(
    r"Function properties for (\S+)\s*\n\s*(\d+) bytes stack frame, "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def spills(ptxas_report: str) -> dict[str, tuple[int, int]]:
    """{function: (spill store bytes, spill load bytes)} from `-Xptxas -v` output."""
    return {m[1]: (int(m[3]), int(m[4])) for m in PROPERTIES.finditer(ptxas_report)}


def test_csrc_holds_kernels_and_the_binding():
    assert SOURCES, f"no .cu kernel in {CSRC}"
    assert BINDING.is_file(), f"{BINDING} (the one binding file) is missing"
    text = BINDING.read_text()
    assert "PYBIND11_MODULE" in text or "TORCH_LIBRARY" in text, f"{BINDING} defines no module"


def test_report_parser_reads_spills():
    report = ("ptxas info    : Function properties for _Z1fv\n"
              "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
              "ptxas info    : Function properties for _Z1gv\n"
              "    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n")
    assert spills(report) == {"_Z1fv": (0, 0), "_Z1gv": (12, 4)}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels' compile check needs it")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_kernel_compiles_without_spills(source: Path, tmp_path: Path):
    proc = subprocess.run([NVCC, *FLAGS, str(source), "-o", str(tmp_path / f"{source.stem}.o")],
                          capture_output=True, text=True, timeout=900)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nvcc failed on {source.name}:\n{report[-8000:]}"
    found = spills(report)
    assert found, f"ptxas reported no function for {source.name}:\n{report[-4000:]}"
    spilling = {name: s for name, s in found.items() if s != (0, 0)}
    assert not spilling, f"{source.name}: register spills (store, load bytes): {spilling}"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels' compile check needs it")
def test_sanitize_program_builds_and_checks_its_arguments(tmp_path: Path):
    """scripts/sanitize_persistent.cu (the racecheck of gpu_pass.sh's sanitize stage) links
    against the persistent kernels through dense.h alone, and refuses a malformed shape."""
    exe = tmp_path / "sanitize_persistent"
    proc = subprocess.run([NVCC, *[f for f in FLAGS if f not in ("-c", "-Xptxas", "-v")],
                           str(ROOT / "scripts" / "sanitize_persistent.cu"),
                           str(CSRC / "dense_persistent.cu"), str(CSRC / "dense_grid.cu"),
                           "-o", str(exe)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-8000:]
    bad = subprocess.run([str(exe), "4,64"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr, (bad.returncode, bad.stderr)
