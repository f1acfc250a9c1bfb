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
RANKS, KGROUPS, REG_ROWS, BC, STAGES, SMEM_LIMIT = 16, 8, 64, 8, 4, 227 * 1024


def _wide_shape(D: int, reg_steps: int) -> dict[str, int]:
    rows = D // RANKS
    slice_steps = rows // 16
    group_steps = 2 * slice_steps
    extra = (rows - REG_ROWS) // 16
    smem_steps = group_steps - reg_steps
    return dict(rows=rows, slice_steps=slice_steps, group_steps=group_steps, extra=extra,
                smem_steps=smem_steps, frags=2 * smem_steps + extra * slice_steps)


def _wide_smem(D: int, reg_steps: int, staged: int) -> int:
    """Cta::kSmem: state double buffer, partial-sum planes, staged inputs, weight fragments,
    mbarriers (bytes)."""
    s = _wide_shape(D, reg_steps)
    rows = s["rows"]
    return (2 * RANKS * BC * (rows + 8) * 2 + 2 * KGROUPS * BC * (rows + 4) * 4
            + STAGES * staged * BC * rows * 2 + 16 * s["frags"] * 512 + 2 * RANKS * 8)


def _wide_product(w: torch.Tensor, h: torch.Tensor, reg_steps: int) -> torch.Tensor:
    """W h as the wide design forms it. CTA c owns rows [80 c, 80 c + 80); warp (m, k) takes
    k-steps s = 0..9 of rows [32 m, 32 m + 32) at column col_of(s) (its own slice 2k + m for
    s < 5, then the other slice of its pair; fragments s < reg_steps in registers, the rest in
    shared memory), and the last 16 rows at the own slice's k-steps (shared memory); the
    accumulator chain is the k-step's parity for the first rows. Partial sums: plane k for rows
    < 64, plane 2k + m (the own slice) for the rest; the sum runs over planes 0..7, then 8..15.
    Checks on the way: every shared-memory fragment index is in range and used once, the
    ldmatrix addressing of each k-step pair (straddling the two slices) reads the columns
    col_of(s), and each slice is waited for before its first use."""
    D = w.shape[0]
    s_ = _wide_shape(D, reg_steps)
    R, S, G, X = s_["rows"], s_["slice_steps"], s_["group_steps"], s_["extra"]
    out = torch.empty_like(h)
    for c in range(RANKS):
        row0 = c * R
        planes = torch.zeros(2 * KGROUPS, R, h.shape[1], dtype=h.dtype)
        for warp in range(16):
            k, m = warp % KGROUPS, warp // KGROUPS
            own, other = 2 * k + m, 2 * k + (1 - m)

            def col_of(s):
                return (2 * k + (m ^ (1 if s >= S else 0))) * R + (s % S) * 16
            used, waited = set(), set()
            acc = torch.zeros(2, 32, h.shape[1], dtype=h.dtype)
            extra = torch.zeros(16 * X, h.shape[1], dtype=h.dtype)
            for s in range(0, G, 2):
                if s == 0:
                    waited.add(own)
                if s <= S <= s + 1:
                    waited.add(other)
                for hi in (0, 1):  # the pair's ldmatrix addressing, as multiply() writes it
                    if s + 1 < S:
                        col = own * R + (s + hi) * 16
                    elif s >= S:
                        col = other * R + (s - S + hi) * 16
                    else:
                        col = other * R if hi else own * R + s * 16
                    assert col == col_of(s + hi), (D, warp, s, hi)
                    assert col // R in waited, (D, warp, s, hi)
                for st in (s, s + 1):
                    cols = slice(col_of(st), col_of(st) + 16)
                    for mt in range(2):
                        if st >= reg_steps:
                            f = 2 * (st - reg_steps) + mt
                            assert 0 <= f < s_["frags"] and f not in used
                            used.add(f)
                        rows = slice(row0 + 32 * m + 16 * mt, row0 + 32 * m + 16 * mt + 16)
                        acc[st % 2, 16 * mt:16 * mt + 16] += w[rows, cols] @ h[cols]
                    if st < S:
                        for x in range(X):
                            f = 2 * s_["smem_steps"] + x * S + st
                            assert 0 <= f < s_["frags"] and f not in used
                            used.add(f)
                            rows = slice(row0 + REG_ROWS + 16 * x, row0 + REG_ROWS + 16 * x + 16)
                            extra[16 * x:16 * x + 16] += w[rows, cols] @ h[cols]
            assert len(used) == s_["frags"]
            planes[k, 32 * m:32 * m + 32] = acc[0] + acc[1]
            planes[own, REG_ROWS:] = extra
        out[row0:row0 + REG_ROWS] = planes[:KGROUPS, :REG_ROWS].sum(0)
        out[row0 + REG_ROWS:row0 + R] = planes[:, REG_ROWS:].sum(0)
    return out


@pytest.mark.parametrize("reg_steps", [7, 8])
def test_wide_tiling_covers_every_column_once(reg_steps):
    D = 1280
    g = torch.Generator().manual_seed(reg_steps)
    w = torch.randn(D, D, generator=g, dtype=torch.float64)
    h = torch.randn(D, 3, generator=g, dtype=torch.float64)
    assert torch.allclose(_wide_product(w, h, reg_steps), w @ h, rtol=1e-12, atol=1e-10)
    # the backward multiplies by W^T with the same machine
    assert torch.allclose(_wide_product(w.t().contiguous(), h, reg_steps), w.t() @ h,
                          rtol=1e-12, atol=1e-10)


def test_wide_shared_memory_budget():
    # staged inputs: forward wx + gates (2-3 planes); backward d_out, h (+ h_{t-1}, v) + gates
    assert _wide_smem(1280, 8, staged=2) == 172288  # E1 forward (Cta::kSmem)
    assert max(_wide_smem(1280, 7, staged=6), _wide_smem(1280, 8, staged=6)) <= SMEM_LIMIT
    # D = 1536 (96 rows a CTA): even with 10 k-steps (80 registers of fragments) a thread and
    # the fewest staged planes, the weights beside the state buffers exceed an SM
    assert _wide_smem(1536, 10, staged=2) > SMEM_LIMIT
    assert _wide_shape(1280, 8)["frags"] * 16 * 512 == 72 * 1024
