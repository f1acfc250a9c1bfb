"""`elman dims`: counts by instantiation, 128-aligned width search."""
from __future__ import annotations

import json

import pytest

from elman.training import dims
from elman import registry
from elman.cli import main as cli


@pytest.mark.parametrize("level", ["E0", "E1"])
def test_count_matches_the_wrapper_formula(level):
    d, L, e = 1280, 6, 1.0
    want = 256 * d + L * (registry.get(level).layer_params(d, e) + d) + d
    assert dims.count(level, d, L, e) == want


def test_width_search_picks_the_closest_multiple_of_128():
    target = 50_000_000
    d = dims.width_for("E1", target, depth=6)
    assert d == 1280 and d % 128 == 0
    here = abs(dims.count("E1", d, 6) - target)
    assert here <= abs(dims.count("E1", d - 128, 6) - target)
    assert here <= abs(dims.count("E1", d + 128, 6) - target)
    assert dims.width_for("E1", dims.count("E1", 640, 6), depth=6) == 640   # exact hit
    assert dims.width_for("E1", 1, depth=1) == 128


def test_options_change_the_count():
    assert dims.count("E1", 256, 2, use_conv=True) == dims.count("E1", 256, 2) + 2 * 256 * 5


def test_parse_count():
    assert dims.parse_count("50M") == 50_000_000 and dims.parse_count("1.3B") == 1_300_000_000
    assert dims.parse_count("2500") == 2500


def test_cli(capsys):
    assert cli(["dims", "--level", "E1", "--params", "50M", "--depth", "6"]) == 0
    out = capsys.readouterr().out
    assert "1280" in out and "49,496,320" in out and "<-" in out
    assert cli(["dims", "--level", "E1", "--params", "50M", "--depth", "6", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["dim"] for r in rows] == [1152, 1280, 1408] and [r["chosen"] for r in rows] == [False, True, False]
    assert cli(["dims", "--level", "E0", "--dim", "1280", "--depth", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 49_504_000
    assert cli(["dims", "--level", "E999", "--dim", "128", "--depth", "1"]) == 1
