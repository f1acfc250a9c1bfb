"""Every program under dev/ compiles on its own with nvcc for sm_90a, without register spills,
and says in its header what it measures and how to build and run it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[1] / "dev"
PROGRAMS = sorted(DEV.glob("*.cu"))
NVCC = shutil.which("nvcc")


def test_dev_holds_programs():
    assert len(PROGRAMS) >= 2


@pytest.mark.parametrize("src", PROGRAMS, ids=lambda p: p.name)
def test_header_says_what_and_how(src: Path):
    head = src.read_text().split("#include", 1)[0]
    assert len(head.splitlines()) >= 5, "a header comment says what the program measures"
    assert "Check:" in head, "a dev program checks its results before it times"
    assert re.search(rf"nvcc .*dev/{re.escape(src.name)}", head), "the header says how to build and run it"
    assert "int main(" in src.read_text()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("src", PROGRAMS, ids=lambda p: p.name)
def test_compiles_without_spills(src: Path, tmp_path: Path):
    r = subprocess.run([NVCC, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a",
                        "-Xptxas", "-v", "-c", str(src), "-o", str(tmp_path / "x.o")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr.lower(), r.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    assert spills, "ptxas printed no resource report"
    assert all(s == ("0", "0") for s in spills), f"register spills: {spills}"
