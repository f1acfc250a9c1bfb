"""Every chapter of `_toc.yml` runs top to bottom with papermill on the CPU in quick mode
(`quick=True, device="cpu"`), into a temporary folder, with no error output; the committed
notebooks stay byte for byte as they were."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import papermill
import pytest
from jupyter_client.kernelspec import KernelSpecManager

from book_pages import ROOT, chapters

KERNEL = "python3"
CELL_TIMEOUT_S = 600


def test_kernel_is_this_interpreter():
    """papermill's `python3` kernel must run the interpreter (venv) the tests run in."""
    argv = KernelSpecManager().get_kernel_spec(KERNEL).argv
    # jupyter_client replaces a bare "python"/"python3" with sys.executable when it launches.
    if argv[0] not in ("python", f"python{sys.version_info[0]}",
                       f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        assert os.path.realpath(argv[0]) == os.path.realpath(sys.executable), (
            f"the {KERNEL!r} kernelspec runs {argv[0]}, not {sys.executable}; "
            f"remove the stale kernelspec (`jupyter kernelspec list`)")


def _errors(nb: nbformat.NotebookNode) -> list[str]:
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append(f"cell {i}: {out.ename}: {out.evalue}")
            elif out.output_type == "stream" and out.name == "stderr" and "Traceback" in out.text:
                found.append(f"cell {i}: traceback on stderr:\n{out.text[-2000:]}")
    return found


@pytest.mark.parametrize("chapter", chapters(), ids=lambda p: p.stem)
def test_chapter_runs_in_quick_mode_on_cpu(chapter: Path, tmp_path: Path):
    committed = {p: p.read_bytes() for p in sorted((ROOT / "book").rglob("*.ipynb"))}
    source = nbformat.read(ROOT / chapter, as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in source.cells), \
        f"{chapter} has no cell tagged `parameters`"

    out = tmp_path / chapter.name
    papermill.execute_notebook(
        str(ROOT / chapter), str(out), parameters={"quick": True, "device": "cpu"},
        kernel_name=KERNEL, cwd=str((ROOT / chapter).parent), progress_bar=False,
        execution_timeout=CELL_TIMEOUT_S)

    executed = nbformat.read(out, as_version=4)
    assert not _errors(executed), "\n".join(_errors(executed))
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "quick = True" in injected[0].source and 'device = "cpu"' in injected[0].source
    changed = [str(p.relative_to(ROOT)) for p, data in committed.items()
               if not p.is_file() or p.read_bytes() != data]
    assert not changed, f"running {chapter} changed committed notebooks: {changed}"
