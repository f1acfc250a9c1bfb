"""The persistent path's supported sizes without a GPU: the predicate `op.persistent_size`
(every multiple of 128 from 256 to 2048; any B at the cluster design's widths 256, 512, 768,
1024 and the wide design's 1280, B <= 64 at the grid design's), the design each width takes,
`plan` refusing a size outside the set with the predicate's reason before any extension is
loaded, the grid design's tiling (64 x 512 tiles of W_h padded with zero columns to 2048,
blocks beyond D skipped) and the wide design's at 8 and 12 batch columns (register and
shared-memory fragments, own and other slices, the ldmatrix addressing of one and two n-tiles,
partial-sum planes; lib/csrc/dense/wide.cuh) emulated in PyTorch against W_h h and W_h^T h,
the wide design's shared-memory budget (D = 1280 fits at 8 and 12 columns, 1536 does not) and
its choice of columns (the fewer waves). The compiled plans' agreement with the predicate is
tests/test_widths_gpu.py."""
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
RANKS, BC, SMEM_LIMIT = 16, 8, 227 * 1024
BROAD = 12  # the forward's second width (two n-tiles)


def _wide_lead(bc: int) -> int:
    """Cta::kLead: steps by which inputs are staged (ring of lead + 1)."""
    return 3 if bc == BC else 2


def _wide_reg_frags(bc: int, gates: int, backward: bool = False, reads_prev: bool = False) -> int:
    """kRegFragsOf (untraced): fragments a warp keeps in registers."""
    if bc == BROAD:
        return 15 if gates == 2 else 16
    return 19 if backward == reads_prev else 18


def _wide_smem(D: int, reg_frags: int, staged: int, bc: int = BC, lead: int | None = None) -> int:
    """Cta::kSmem: state double buffer, 16 partial-sum planes, staged inputs, the weight
    fragments not in registers, mbarriers (bytes)."""
    rows = D // RANKS
    frags = (rows // 16) ** 2
    stages = (_wide_lead(bc) if lead is None else lead) + 1
    return (2 * RANKS * bc * (rows + 8) * 2 + RANKS * bc * (rows + 4) * 4
            + stages * staged * bc * rows * 2 + 16 * (frags - reg_frags) * 512 + 2 * RANKS * 8)


def _fragment(f: int, reg_frags: int, used: set) -> None:
    """Fragment f in registers (f < reg_frags) or at shared-memory position f - reg_frags,
    each position read once a step."""
    if f >= reg_frags:
        assert f - reg_frags not in used
        used.add(f - reg_frags)


def _warp_product_two(w, h, row0: int, warp: int, R: int, reg_frags: int, used: set):
    """multiply_two: warp `warp`'s partial sums [R, bc] for rows [row0, row0 + R), the columns
    of slice `warp`, at bc in (8, 16] columns. The B fragments of k-step s come by one
    ldmatrix.x4: lane l reads batch column min(8 (l / 16) + l % 8, bc - 1), columns
    (l / 8) % 2 of the k-step, so matrix l / 8 is (n-tile l / 16, k-half (l / 8) % 2); the
    columns beyond bc repeat the last and their sums are dropped (lane (g, q) stores columns
    8 nt + 2 q, + 1 where below bc)."""
    bc = h.shape[1]
    S = T = R // 16
    tiles = []  # per n-tile: the batch column each of its 8 mma columns reads
    for nt in range(2):
        cols = []
        for lane in range(32):
            n = min(((lane >> 4) << 3) + (lane & 7), bc - 1)
            if lane >> 4 == nt and (lane >> 3) & 1 == 0:
                cols.append(n)
        tiles.append(cols)
    assert tiles[0] == list(range(8)) and tiles[1][:bc - 8] == list(range(8, bc))
    plane = torch.full((R, bc), float("nan"), dtype=h.dtype)
    for mt in range(T):
        rows = slice(row0 + 16 * mt, row0 + 16 * mt + 16)
        acc = [torch.zeros(16, 8, dtype=h.dtype) for _ in range(2)]
        for st in range(S):
            _fragment(mt * S + st, reg_frags, used)
            k = slice(warp * R + 16 * st, warp * R + 16 * st + 16)
            for nt in range(2):
                acc[nt] += w[rows, k] @ h[k][:, tiles[nt]]
        for nt in range(2):
            for q in range(4):
                for c in (2 * q, 2 * q + 1):
                    if 8 * nt + 2 * q < bc:
                        assert torch.isnan(plane[16 * mt:16 * mt + 16, 8 * nt + c]).all()
                        plane[16 * mt:16 * mt + 16, 8 * nt + c] = acc[nt][:, c]
    assert not torch.isnan(plane).any()
    return plane


def _wide_product(w: torch.Tensor, h: torch.Tensor, reg_frags: int) -> torch.Tensor:
    """W h as the wide design forms it, at bc = h.shape[1] batch columns (8: one n-tile; 9-16:
    two, _warp_product_two). CTA c owns rows [R c, R c + R), R = D / 16; warp w
    multiplies them by the columns of slice w (k-steps s = 0..R/16-1, one accumulator per
    m-tile, k-steps in order); fragment i = (m-tile i // S, k-step i % S) is in registers for
    i < reg_frags, else at shared-memory position i - reg_frags. The 16 partial sums of a row
    are added as four interleaved sums (planes i, i + 4, ...), then (s0 + s1) + (s2 + s3). Checks on the way: every shared-memory position is used once and
    the ldmatrix addressing (8 columns: pairs of k-steps by .x4, an odd last one by .x2, lanes
    0-15) reads the columns of k-step s."""
    D = w.shape[0]
    R = D // RANKS
    S = T = R // 16
    out = torch.empty_like(h)
    for c in range(RANKS):
        row0 = c * R
        planes = torch.zeros(RANKS, R, h.shape[1], dtype=h.dtype)
        for warp in range(16):
            used = set()
            if h.shape[1] > BC:
                planes[warp] = _warp_product_two(w, h, row0, warp, R, reg_frags, used)
                assert used == set(range(T * S - reg_frags))
                continue
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
                        _fragment(mt * S + st, reg_frags, used)
                        rows = slice(row0 + 16 * mt, row0 + 16 * mt + 16)
                        acc[mt] += w[rows, cols] @ h[cols]
            assert used == set(range(T * S - reg_frags))
            planes[warp] = acc.reshape(R, -1)
        sums = [sum(planes[w] for w in range(i, RANKS, 4)) for i in range(4)]
        out[row0:row0 + R] = (sums[0] + sums[1]) + (sums[2] + sums[3])
    return out


@pytest.mark.parametrize("bc,reg_frags", [(8, 17), (8, 18), (8, 19), (12, 15), (12, 16),
                                          (16, 16)])
def test_wide_tiling_covers_every_column_once(bc, reg_frags):
    D = 1280
    g = torch.Generator().manual_seed(reg_frags + bc)
    w = torch.randn(D, D, generator=g, dtype=torch.float64)
    h = torch.randn(D, bc, generator=g, dtype=torch.float64)
    assert torch.allclose(_wide_product(w, h, reg_frags), w @ h, rtol=1e-12, atol=1e-10)
    # the backward multiplies by W^T with the same machine
    assert torch.allclose(_wide_product(w.t().contiguous(), h, reg_frags), w.t() @ h,
                          rtol=1e-12, atol=1e-10)


def test_wide_shared_memory_budget():
    # staged inputs: forward wx + gates (1-3 planes); backward d_out, h (+ h_{t-1}, v) + gates
    assert _wide_smem(1280, 19, staged=2) == 147712  # E1's forward (Cta::kSmem)
    assert _wide_smem(1280, 17, staged=3) <= SMEM_LIMIT and _wide_smem(1280, 18, staged=6) <= SMEM_LIMIT
    # 12 columns (forward only): every epilogue of 0-2 gates fits; E1's 217,600 bytes
    assert _wide_smem(1280, 16, staged=2, bc=BROAD) == 217600
    for gates in (0, 1, 2):
        assert _wide_smem(1280, _wide_reg_frags(BROAD, gates), 1 + gates, bc=BROAD) <= SMEM_LIMIT
    # two gates keep 15 fragments in registers (16 spill): they fit with a lead of 2, not 3
    assert _wide_smem(1280, 15, staged=3, bc=BROAD, lead=3) > SMEM_LIMIT
    # D = 1536 (96 rows a CTA, 36 fragments a warp): even with 20 of them in registers (80 a
    # thread; at 1280 the kernels spill beyond 19) and the fewest staged planes, the rest do
    # not fit
    assert _wide_smem(1536, 20, staged=1) > SMEM_LIMIT


def _waves(B: int, bc: int, active: int) -> int:
    return -(-(-(-B // bc)) // active)


def _wide_columns(B: int, active8: int = 7, active12: int = 7) -> int:
    """make_plan's forward columns at D = 1280: 12 where it takes fewer waves, else 8."""
    return BROAD if _waves(B, BROAD, active12) < _waves(B, BC, active8) else BC


def test_wide_columns_where_they_save_a_wave():
    # an H100 holds 7 clusters of 16 CTAs: 8 columns take one wave up to B = 56
    chosen = {B: _wide_columns(B) for B in range(1, 257)}
    assert [B for B, bc in chosen.items() if bc == BROAD][:3] == [57, 58, 59]
    assert all(chosen[B] == BC for B in range(1, 57))
    assert all(chosen[B] == BROAD for B in (64, 84, 120, 128, 130))
    assert [B for B in range(57, 257) if chosen[B] == BC] == list(range(85, 113))  # a tie: 8
    assert _waves(64, BROAD, 7) == 1 and _waves(64, BC, 7) == 2
