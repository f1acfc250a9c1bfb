"""The persistent path's supported sizes without a GPU: the predicate `op.persistent_size`
(every multiple of 128 from 256 to 2048; any B at the cluster design's widths 256, 512, 768,
1024 and the wide design's 1280, B <= 64 at the grid design's), the design each width takes,
`plan` refusing a size outside the set with the predicate's reason before any extension is
loaded, the grid design's tiling (64 x 512 tiles of W_h padded with zero columns to 2048,
blocks beyond D skipped) and the wide design's (register and shared-memory fragments, own and
other slices, partial-sum planes; lib/csrc/dense/wide.cuh) emulated in PyTorch against W_h h,
and the wide design's shared-memory budget (D = 1280 fits, 1536 does not). The compiled plans' agreement with the predicate
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
        want = 256 <= D <= 2048 and (D in (256, 512, 768, 1024, 1280) or B <= 64)
        assert ok == want, (B, D, why)
        assert (why == "") == ok


def test_predicate_reasons():
    assert "multiple of 128" in op.persistent_size(4, 1300)[1]
    assert "multiple of 128" in op.persistent_size(4, 128)[1]
    assert "multiple of 128" in op.persistent_size(4, 2176)[1]
    assert "B must be <= 64" in op.persistent_size(65, 1152)[1]
    assert "B must be <= 64" in op.persistent_size(65, 1536)[1]
    assert op.persistent_size(130, 1280) == (True, "")
    assert "at least 1" in op.persistent_size(0, 1280)[1]
    assert op.persistent_size(130, 1024) == (True, "")
    assert not op.persistent_size(2 ** 21, 1024)[0]  # B * D beyond 2^31


def test_design_of_each_width():
    assert [D for D in range(256, 2049, 128) if op.persistent_design(D) == "cluster"] == \
        [256, 512, 768, 1024]
    assert [D for D in range(256, 2049, 128) if op.persistent_design(D) == "wide"] == [1280]
    assert op.persistent_design(1536) == op.persistent_design(2048) == "grid"


@pytest.mark.parametrize("B,D", [(65, 1152), (128, 1536), (4, 1300), (4, 4096)])
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


# ---- the wide cluster design (D = 1280), restated from lib/csrc/dense/wide.cuh -----------
RANKS, BC, STAGES, SMEM_LIMIT = 16, 8, 4, 227 * 1024


def _wide_smem(D: int, reg_frags: int, staged: int) -> int:
    """Cta::kSmem: state double buffer, 16 partial-sum planes, staged inputs, the weight
    fragments not in registers, mbarriers (bytes)."""
    rows = D // RANKS
    frags = (rows // 16) ** 2
    return (2 * RANKS * BC * (rows + 8) * 2 + RANKS * BC * (rows + 4) * 4
            + STAGES * staged * BC * rows * 2 + 16 * (frags - reg_frags) * 512 + 2 * RANKS * 8)


def _wide_product(w: torch.Tensor, h: torch.Tensor, reg_frags: int) -> torch.Tensor:
    """W h as the wide design forms it. CTA c owns rows [R c, R c + R), R = D / 16; warp w
    multiplies them by the columns of slice w (k-steps s = 0..R/16-1, one accumulator per
    m-tile, k-steps in order); fragment i = (m-tile i // S, k-step i % S) is in registers for
    i < reg_frags, else at shared-memory position i - reg_frags. The 16 partial sums of a row
    are added as four interleaved sums (planes i, i + 4, ...), then (s0 + s1) + (s2 + s3). Checks on the way: every shared-memory position is used once and
    the ldmatrix addressing (pairs of k-steps by .x4, an odd last one by .x2, lanes 0-15) reads
    the columns of k-step s."""
    D = w.shape[0]
    R = D // RANKS
    S = T = R // 16
    out = torch.empty_like(h)
    for c in range(RANKS):
        row0 = c * R
        planes = torch.zeros(RANKS, R, h.shape[1], dtype=h.dtype)
        for warp in range(16):
            used = set()
            acc = torch.zeros(T, 16, h.shape[1], dtype=h.dtype)
            for s in range(0, S, 2):
                lanes = range(32) if s + 1 < S else range(16)
                for lane in lanes:  # the column of the 8 x 8 matrix lane l addresses
                    col = warp * R + ((lane >> 3) & 1) * 8 + (lane >> 4) * 16 + s * 16
                    step = s + (lane >> 4)
                    assert col == warp * R + 16 * step + 8 * ((lane >> 3) & 1), (D, warp, s, lane)
                for st in (s, s + 1):
                    if st >= S:
                        break
                    cols = slice(warp * R + 16 * st, warp * R + 16 * st + 16)
                    for mt in range(T):
                        f = mt * S + st
                        if f >= reg_frags:
                            assert f - reg_frags not in used
                            used.add(f - reg_frags)
                        rows = slice(row0 + 16 * mt, row0 + 16 * mt + 16)
                        acc[mt] += w[rows, cols] @ h[cols]
            assert used == set(range(T * S - reg_frags))
            planes[warp] = acc.reshape(R, -1)
        sums = [sum(planes[w] for w in range(i, RANKS, 4)) for i in range(4)]
        out[row0:row0 + R] = (sums[0] + sums[1]) + (sums[2] + sums[3])
    return out


@pytest.mark.parametrize("reg_frags", [17, 18, 19])
def test_wide_tiling_covers_every_column_once(reg_frags):
    D = 1280
    g = torch.Generator().manual_seed(reg_frags)
    w = torch.randn(D, D, generator=g, dtype=torch.float64)
    h = torch.randn(D, 3, generator=g, dtype=torch.float64)
    assert torch.allclose(_wide_product(w, h, reg_frags), w @ h, rtol=1e-12, atol=1e-10)
    # the backward multiplies by W^T with the same machine
    assert torch.allclose(_wide_product(w.t().contiguous(), h, reg_frags), w.t() @ h,
                          rtol=1e-12, atol=1e-10)


def test_wide_shared_memory_budget():
    # staged inputs: forward wx + gates (1-3 planes); backward d_out, h (+ h_{t-1}, v) + gates
    assert _wide_smem(1280, 19, staged=2) == 147712  # E1's forward (Cta::kSmem)
    assert _wide_smem(1280, 17, staged=3) <= SMEM_LIMIT and _wide_smem(1280, 18, staged=6) <= SMEM_LIMIT
    # D = 1536 (96 rows a CTA, 36 fragments a warp): even with 20 of them in registers (80 a
    # thread; at 1280 the kernels spill beyond 19) and the fewest staged planes, the rest do
    # not fit
    assert _wide_smem(1536, 20, staged=1) > SMEM_LIMIT
