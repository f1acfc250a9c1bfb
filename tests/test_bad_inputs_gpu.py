"""Bad input is a clear error on the GPU, for every registered entry: each case of
elman.harness.badinput (every input on the CPU, in a wrong dtype, of a wrong shape,
non-contiguous, misaligned; B = 0, T = 0; the extension missing; the layer's own cases)
runs in its own process, which must end normally with a Python exception that names the
problem (or a correct result where the rule allows one) and a working CUDA context after."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from book_pages import ROOT
from elman import registry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

WORKERS = min(12, os.cpu_count() or 1)  # processes at once; each holds a small CUDA context


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "elman.harness.badinput", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def _check(level: str, case: str) -> str | None:
    """None if the case kept the rule in its own process, else what went wrong."""
    proc = _run(level, case)
    text = proc.stdout + proc.stderr
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or "Segmentation fault" in text or not lines:
        return f"the process ended with {proc.returncode}: {text[-1500:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))["verdict"]


@pytest.mark.parametrize("level", [e.name for e in registry.entries()])
def test_bad_inputs_raise_clearly(level: str):
    listed = _run("--list", level)
    assert listed.returncode == 0, listed.stderr[-3000:]
    cases = [c for c in listed.stdout.splitlines() if c.startswith(("op/", "layer/"))]
    assert any(c.startswith("layer/") for c in cases)
    with ThreadPoolExecutor(WORKERS) as pool:
        verdicts = dict(zip(cases, pool.map(lambda c: _check(level, c), cases)))
    failed = {c: v for c, v in verdicts.items() if v is not None}
    assert not failed, f"{len(failed)} of {len(cases)} cases of {level}:\n" + \
        "\n".join(f"  {c}: {v}" for c, v in failed.items())
