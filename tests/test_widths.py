"""The persistent path's supported sizes without a GPU: the predicate `op.persistent_size`
(every multiple of 128 from 256 to 2048; any B at the cluster design's widths 256, 512, 768,
1024, B <= 64 at the grid design's), the design each width takes, `plan` refusing a size
outside the set with the predicate's reason before any extension is loaded, and the grid
design's tiling (64 x 512 tiles of W_h padded with zero columns to 2048, blocks beyond D
skipped) emulated in PyTorch against W_h h. The compiled plans' agreement with the predicate
is tests/test_widths_gpu.py."""
from __future__ import annotations

import pytest
import torch

from elman.families.dense import op

WIDTHS = range(128, 2304, 128)
BATCHES = (1, 8, 63, 64, 65, 127, 128, 129)


@pytest.mark.parametrize("D", WIDTHS)
def test_predicate_states_the_supported_set(D):
    for B in BATCHES:
        ok, why = op.persistent_size(B, D)
        want = 256 <= D <= 2048 and (D in (256, 512, 768, 1024) or B <= 64)
        assert ok == want, (B, D, why)
        assert (why == "") == ok


def test_predicate_reasons():
    assert "multiple of 128" in op.persistent_size(4, 1300)[1]
    assert "multiple of 128" in op.persistent_size(4, 128)[1]
    assert "multiple of 128" in op.persistent_size(4, 2176)[1]
    assert "B must be <= 64" in op.persistent_size(65, 1280)[1]
    assert "at least 1" in op.persistent_size(0, 1280)[1]
    assert op.persistent_size(130, 1024) == (True, "")
    assert not op.persistent_size(2 ** 21, 1024)[0]  # B * D beyond 2^31


def test_design_of_each_width():
    assert [D for D in range(256, 2049, 128) if op.persistent_design(D) == "cluster"] == \
        [256, 512, 768, 1024]
    assert op.persistent_design(1280) == op.persistent_design(2048) == "grid"


@pytest.mark.parametrize("B,D", [(65, 1280), (128, 1536), (4, 1300), (4, 4096)])
def test_plan_refuses_outside_the_set(B, D):
    with pytest.raises(ValueError, match="persistent kernel does not take"):
        op.plan(B, D, torch.bfloat16, "persistent")


def _grid_product(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """W h as the grid design forms it: CTA (r, q) multiplies rows [64 r, + 64) by the column
    blocks 8q .. 8q + 7 that exist (block < D / 64), one partial product per quarter q; the
    partials of a row block are summed in the order q = 0..3."""
    D = w.shape[0]
    blocks = D // 64
    out = torch.empty_like(h)
    for r in range(blocks):
        rows = slice(64 * r, 64 * r + 64)
        partials = []
        for q in range(4):
            acc = torch.zeros(64, h.shape[1], dtype=h.dtype)
            for k in range(8):
                block = 8 * q + k
                if block * 64 < D:
                    acc += w[rows, 64 * block:64 * block + 64] @ h[64 * block:64 * block + 64]
            partials.append(acc)
        out[rows] = partials[0] + partials[1] + partials[2] + partials[3]
    return out


@pytest.mark.parametrize("D", [384, 1152, 1280, 1920, 2048])
def test_grid_tiling_covers_every_column_once(D):
    g = torch.Generator().manual_seed(D)
    w = torch.randn(D, D, generator=g, dtype=torch.float64)
    h = torch.randn(D, 3, generator=g, dtype=torch.float64)
    assert torch.allclose(_grid_product(w, h), w @ h, rtol=1e-12, atol=1e-10)
