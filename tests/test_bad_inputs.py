"""Bad input is a clear error on the CPU (backend "reference"): the layer cases of
elman.harness.badinput for every registered entry (B = 0, T = 0, a wrong input width, a
zero width, a wrong-shaped parameter of a variant's cell), each under the same rule the
GPU suite applies (tests/test_bad_inputs_gpu.py)."""
from __future__ import annotations

import pytest

from elman import registry
from elman.harness import badinput

CASES = [(e.name, c.id) for e in registry.entries() for c in badinput.layer_cases(e, "cpu")]


@pytest.mark.parametrize("level,case", CASES)
def test_layer_case_raises_clearly(level: str, case: str):
    by_id = {c.id: c for c in badinput.layer_cases(registry.get(level), "cpu")}
    result = badinput.run(by_id[case])
    assert result.get("raised"), f"{case} ran without an error"
    assert badinput.verdict({**result, "tolerance": 0.0}) is None, result


def test_every_entry_has_the_layer_cases():
    for e in registry.entries():
        ids = {c.id for c in badinput.layer_cases(e, "cpu")}
        assert {"layer/empty:B", "layer/empty:T", "layer/width:0"} <= ids, e.name
    assert {"layer/parameter:w_h.weight", "layer/parameter:b"} <= \
        {c.id for c in badinput.layer_cases(registry.get("E1"), "cpu")}


def test_the_rule():
    """What counts: the expected type and a message naming the problem, then a live context;
    a run only where the kind allows one, and only with the valid call's outputs."""
    ok = {"kind": "empty", "raised": "ValueError", "types": ["ValueError"], "message": "B >= 1", "alive": True}
    assert badinput.verdict(ok) is None
    assert "expected" in badinput.verdict({**ok, "raised": "RuntimeError", "types": ["RuntimeError"]})
    assert "name the problem" in badinput.verdict({**ok, "message": "oops"})
    assert "afterwards" in badinput.verdict({**ok, "alive": False})
    assert badinput.verdict({"kind": "shape", "ran": True, "alive": True}) == "ran without an error"
    ran = {"kind": "misaligned", "ran": True, "alive": True, "error": 0.0, "tolerance": 1e-2}
    assert badinput.verdict(ran) is None and "differ" in badinput.verdict({**ran, "error": 0.5})
