"""The registry is consistent: every entry has its layer, chapter (in the TOC) and parameter
formula; every variant has its reference, parity cases, test shapes, tolerances, CUDA op
and a GPU parity test parametrised over it; every alias resolves."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from book_pages import ROOT, toc_pages
from elman import registry

ENTRIES = registry.entries()
VARIANTS = registry.variants()
PARITY_TESTS = ROOT / "tests" / "test_parity_gpu.py"
SIZES = [(128, 1.0), (256, 1.5), (256, 2.0)]  # (dim, expansion)

# Collects a test file without running it and prints, per test, its markers and parameters.
_COLLECT = """
import json, sys, pytest

class Collect:
    items = []
    def pytest_collection_modifyitems(self, items):
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            values = [getattr(v, "name", v) for v in params.values()]
            self.items.append({"id": item.nodeid, "markers": [m.name for m in item.iter_markers()],
                               "params": [v if isinstance(v, str) else repr(v) for v in values]})

plugin = Collect()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", sys.argv[1]], plugins=[plugin])
print("COLLECTED " + json.dumps({"code": int(code), "items": plugin.items}))
"""


def by_name(entries: list[registry.Entry]):
    return pytest.mark.parametrize("entry", entries, ids=lambda e: e.name)


def test_registry_is_not_empty():
    assert VARIANTS, "no variant registered"
    assert {e.kind for e in ENTRIES} <= {"variant", "baseline"}


@by_name(ENTRIES)
def test_entry_has_layer_and_chapter_in_toc(entry: registry.Entry):
    # an nn.Module class, or a factory of one with the level's options bound (E88's ablations);
    # test_layer_params_formula_counts_the_layer builds every one
    assert (isinstance(entry.layer, type) and issubclass(entry.layer, torch.nn.Module)) or \
        (callable(entry.layer) and not isinstance(entry.layer, type)), \
        f"{entry.name}: layer must be an nn.Module class or a factory of one"
    assert entry.chapter, f"{entry.name}: no chapter"
    assert (ROOT / entry.chapter).is_file(), f"{entry.name}: chapter {entry.chapter} does not exist"
    assert Path(entry.chapter) in toc_pages(), f"{entry.name}: {entry.chapter} is not in _toc.yml"


@by_name(ENTRIES)
def test_aliases_resolve(entry: registry.Entry):
    for alias in (entry.name, *entry.aliases):
        for spelling in (alias, alias.lower(), alias.upper()):
            assert registry.get(spelling) is entry, f"{spelling!r} does not resolve to {entry.name}"


def test_numeric_alias_takes_an_e_in_front():
    assert registry.get("E37v2") is registry.get("37v2") is registry.get("E37")
    assert registry.get("e63a") is registry.get("E63")
    with pytest.raises(KeyError, match="unknown level"):
        registry.get("E9999")


@by_name(VARIANTS)
def test_variant_has_reference_parity_shapes_tolerances_and_op(entry: registry.Entry):
    module = importlib.import_module(entry.layer.__module__)
    assert callable(getattr(module, "reference", None)), \
        f"{entry.name}: {module.__name__} has no module-level `reference`"
    assert callable(entry.parity), f"{entry.name}: no parity callable"
    assert entry.test_shapes, f"{entry.name}: no test shapes"
    assert all(all(isinstance(n, int) and n > 0 for n in s.params().values()) for s in entry.test_shapes)
    assert entry.dtypes, f"{entry.name}: no dtypes"
    for dtype in entry.dtypes:
        assert isinstance(getattr(torch, dtype, None), torch.dtype), f"{entry.name}: unknown dtype {dtype}"
        tol = entry.tolerance.get(dtype)
        assert tol is not None, f"{entry.name}: no tolerance for {dtype}"
        assert 0 < tol.fwd < 1 and 0 < tol.bwd < 1
    assert entry.cuda_op, f"{entry.name}: no CUDA op"


@pytest.fixture(scope="module")
def gpu_parity_tests() -> list[dict]:
    assert PARITY_TESTS.is_file(), f"{PARITY_TESTS.relative_to(ROOT)} is missing"
    proc = subprocess.run([sys.executable, "-c", _COLLECT, str(PARITY_TESTS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("COLLECTED ")]
    assert lines, f"collecting {PARITY_TESTS.name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1].removeprefix("COLLECTED "))
    assert result["code"] == 0, f"collecting {PARITY_TESTS.name} failed:\n{proc.stdout[-4000:]}"
    return result["items"]


@by_name(VARIANTS)
def test_variant_has_gpu_parity_test(entry: registry.Entry, gpu_parity_tests: list[dict]):
    tests = [t["id"] for t in gpu_parity_tests if "gpu" in t["markers"] and entry.name in t["params"]]
    assert tests, (f"{entry.name}: no test in {PARITY_TESTS.name} is marked gpu and "
                   f"parametrised with {entry.name!r}")


@by_name(ENTRIES)
@pytest.mark.parametrize("dim,expansion", SIZES)
def test_layer_params_formula_counts_the_layer(entry: registry.Entry, dim: int, expansion: float):
    assert entry.layer_params is not None, f"{entry.name}: no layer_params formula"
    torch.manual_seed(0)
    layer = entry.layer(dim, expansion=expansion, backend="reference")
    counted = sum(p.numel() for p in layer.parameters())
    assert entry.layer_params(dim, expansion) == counted, \
        f"{entry.name}(dim={dim}, expansion={expansion}): formula {entry.layer_params(dim, expansion)} != layer {counted}"
