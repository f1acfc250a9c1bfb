"""CPU checks of the matrix family: the E88 and E75 references (against hand-unrolled steps,
fp64 gradcheck), the kernels' checkpoint/recompute schedule and backward math against autograd
of the reference, every E88 option changing the output, level names, parameter counts and the
op's validation before any launch."""
from __future__ import annotations

import pytest
import torch

from elman import registry

from elman.core import validate
from elman.core.entry import Shape
from elman.families.matrix import inputs, op, reference as ref, schedule
from elman.variants import e75, e88



@pytest.fixture(autouse=True)
def _fp64_by_default():
    """These tests build their tensors in fp64; the default goes back for the other test files."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _core_inputs(T=6, B=2, H=3, n=4, v=5, column=False, beta=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    names = ("q", "k", "v", "decay", "beta", "h0") if beta else ("q", "k", "v", "decay", "h0")
    kw = inputs.random_inputs(T, B, H, n, v, names, "cpu", g, "column" if column else "scalar")
    if not beta:
        kw["beta"] = None
    return kw


def test_e88_core_matches_hand_unrolled_steps():
    kw = {k: t.detach() for k, t in _core_inputs().items()}
    o, S_T = e88.reference(**kw)
    S = kw["h0"].clone()
    B, H = S.shape[:2]
    for t in range(kw["k"].shape[0]):
        for b in range(B):
            for h in range(H):
                k, q, v = kw["k"][t, b, h], kw["q"][t, b, h], kw["v"][t, b, h]
                delta = v - S[b, h].t() @ k
                P = kw["decay"][t, b, h] * S[b, h] + kw["beta"][t, b, h] * torch.outer(k, delta)
                S[b, h] = torch.tanh(P)
                torch.testing.assert_close(o[t, b, h], S[b, h].t() @ q)
    torch.testing.assert_close(S_T, S)


def test_e75_core_matches_hand_unrolled_steps():
    kw = {k: t.detach() for k, t in _core_inputs(n=4, v=4, column=True, beta=False).items() if t is not None}
    o, S_T = e75.reference(**kw)
    S = kw["h0"].clone()
    for t in range(kw["k"].shape[0]):
        for b in range(S.shape[0]):
            for h in range(S.shape[1]):
                k, q, v = kw["k"][t, b, h], kw["q"][t, b, h], kw["v"][t, b, h]
                S[b, h] = torch.tanh(kw["decay"][t, b, h][:, None] * S[b, h] + torch.outer(v - S[b, h] @ k, k))
                torch.testing.assert_close(o[t, b, h], S[b, h] @ q)
    torch.testing.assert_close(S_T, S)


def test_sequence_equals_single_steps():
    kw = {k: t.detach() for k, t in _core_inputs(T=5).items()}
    o, S_T = e88.reference(**kw)
    S, outs = kw["h0"], []
    for t in range(5):
        step = {k: (x[t:t + 1] if inputs.time_major(k, x) else x) for k, x in kw.items()}
        out, S = e88.reference(**{**step, "h0": S})
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), o)
    torch.testing.assert_close(S, S_T)


@pytest.mark.parametrize("fn,column,beta", [(e88.reference, False, True), (e75.reference, True, False)])
def test_core_gradcheck(fn, column, beta):
    kw = _core_inputs(T=3, B=1, H=2, n=3, v=3, column=column, beta=beta)
    if not beta:
        kw.pop("beta")
    names = list(kw)
    assert torch.autograd.gradcheck(lambda *a: fn(**dict(zip(names, a))), tuple(kw.values()))


@pytest.mark.parametrize("label", list(e88.OPTION_GRID))
def test_e88_layer_gradcheck(label):
    torch.manual_seed(0)
    layer = e88.E88(8, 1.0, backend="reference", n_heads=2, n_state=4, **e88.OPTION_GRID[label]).double()
    y = torch.randn(1, 3, 8, requires_grad=True)
    h0 = (torch.rand(1, 2, 4, 4) - 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda y, h0: layer(y, h0), (y, h0))


def test_e75_layer_gradcheck():
    torch.manual_seed(0)
    layer = e75.E75(8, 1.0, backend="reference", n_heads=2, n_state=3).double()
    y = torch.randn(1, 3, 8, requires_grad=True)
    h0 = (torch.rand(1, 2, 3, 3) - 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda y, h0: layer(y, h0), (y, h0))


@pytest.mark.parametrize("T,K,slots", [(1, 16, 0), (7, 3, 0), (16, 16, 0), (17, 16, 0), (40, 16, 0),
                                       (9, 1, 0), (40, 16, 5), (17, 8, 3), (9, 4, 1)])
@pytest.mark.parametrize("column,beta,step", [(False, True, "tanh"), (False, False, "linear"),
                                              (True, False, "tanh"), (False, True, "linear")])
def test_checkpoint_schedule_matches_autograd(T, K, slots, column, beta, step):
    kw = _core_inputs(T=T, B=2, H=3, n=4, v=6, column=column, beta=beta, seed=T + K)
    leaves = [t for t in kw.values() if t is not None]
    o, S_T = ref.recurrence(**kw, step=step)
    g = torch.Generator().manual_seed(1)
    d_o, d_S = torch.randn(o.shape, generator=g), torch.randn(S_T.shape, generator=g)
    torch.autograd.backward((o, S_T), (d_o, d_S))
    plain = {k: None if t is None else t.detach() for k, t in kw.items()}
    o2, S2, ckpt = schedule.forward(**plain, step=step, K=K)
    assert ckpt.shape[0] == schedule.checkpoints(T, K)
    torch.testing.assert_close(o2, o.detach())
    torch.testing.assert_close(S2, S_T.detach())
    args = {k: plain[k] for k in ("q", "k", "v", "decay", "beta")}
    grads = schedule.backward(**args, ckpt=ckpt, d_o=d_o, d_ST=d_S, step=step, K=K, slots=slots)
    for leaf, grad in zip(leaves, [x for x in grads if x is not None]):
        torch.testing.assert_close(grad, leaf.grad)


def test_e75_runs_as_the_transposed_key_first_recurrence():
    kw = {k: t.detach() for k, t in _core_inputs(n=4, v=4, column=True, beta=False).items() if t is not None}
    o, S_T = e75.reference(**kw)
    o2, S2, _ = schedule.forward(kw["q"], kw["k"], kw["v"], kw["decay"], None,
                                 kw["h0"].transpose(-1, -2), "tanh", 16)
    torch.testing.assert_close(o2, o)
    torch.testing.assert_close(S2.transpose(-1, -2), S_T)


def _e88_out(**opts):
    torch.manual_seed(0)
    layer = e88.E88(16, 1.0, backend="reference", n_heads=2, n_state=8, **opts).double()
    torch.manual_seed(1)
    y = torch.randn(2, 5, 16)
    return layer(y)[0]


@pytest.mark.parametrize("opts", [
    dict(use_conv=True), dict(use_silu=False), dict(decay_mode="simple"), dict(decay_mode="constant"),
    dict(decay_mode="none"), dict(use_l2_norm=False), dict(use_write_gate=True), dict(use_gate=False),
    dict(gate_activation="sigmoid"), dict(use_output_norm=True), dict(value_residual=True),
    dict(linear_state=True), dict(tie_kv=True)])
def test_every_e88_option_changes_the_output(opts):
    assert not torch.allclose(_e88_out(**opts), _e88_out())


def test_e88_rejects_what_is_not_built():
    with pytest.raises(ValueError, match="not built"):
        e88.E88(16, n_heads=2, n_state=8, head_mix="weighted_sum")
    with pytest.raises(ValueError, match="square"):
        e88.E88(16, 2.0, n_heads=2, n_state=8, tie_kv=True)
    with pytest.raises(ValueError, match="decay_mode"):
        e88.E88(16, n_heads=2, n_state=8, decay_mode="fast")


def test_e88_rectangular_state():
    layer = e88.E88(32, 2.0, backend="reference", n_heads=2, n_state=8)
    out, S = layer(torch.randn(2, 3, 32))
    assert out.shape == (2, 3, 32) and S.shape == (2, 2, 8, 16)


def test_level_names():
    names = {e.name for e in e88.ENTRIES} | {e.name for e in e75.ENTRIES}
    for level in ("E88", "E88f_h32n16", "E88f_h24n24", "E88e_h8_75m", "E88b_nonorm", "E88d_h12",
                  "E88d_h20", "E88f_h4", "E88f_h6", "E75", "E75n32", "E75n48", "E75n64", "E75n96",
                  "E88h83n32", "E75h4n32"):
        assert level in names
    for level in ("75", "75n32", "75n48", "75n64", "75n96", "88", "E88h6n48", "E75h3n48"):
        assert registry.get(level).name in {level, "E" + level, *names} | {level.upper()}
    assert registry.get("e88h6n48").name == "E88h6n48" and registry.get("75").name == "E75"
    assert e88.level_options("E88h7n24") == dict(n_heads=7, n_state=24)
    assert e88.level_options("e88h5") == dict(n_heads=5, n_state=32)
    assert e88.level_options("E88f_h24n24")["n_heads"] == 24
    assert e75.level_options("E75h3n48") == dict(n_heads=3, n_state=48)
    assert e75.level_options("75n96") == dict(n_heads=1, n_state=96)
    layer = e88.layer_for("E88h3n8", 32, backend="reference")
    assert (layer.H, layer.n, layer.v) == (3, 8, 8)
    with pytest.raises(ValueError):
        e88.level_options("E89")
    built = e88.entry_for("e88h7n24")
    assert built.name == "E88h7n24" and built.layer(64, backend="reference").H == 7
    assert e75.entry_for("E75h3n48").layer(64, backend="reference").n == 48
    assert e88.entry_for("E75h3n48") is None and e75.entry_for("E88") is None


@pytest.mark.parametrize("entry", [*e88.ENTRIES, *e75.ENTRIES], ids=lambda e: e.name)
@pytest.mark.parametrize("dim,expansion", [(128, 1.0), (256, 1.5), (256, 2.0)])
def test_layer_params(entry, dim, expansion):
    layer = entry.layer(dim, expansion=expansion, backend="reference")
    assert entry.layer_params(dim, expansion) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("opts", list(e88.OPTION_GRID.values()) + [dict(use_write_gate=True, n_state=16)])
def test_e88_params_formula_with_options(opts):
    opts = {"n_heads": 3, "n_state": 8, **opts}
    layer = e88.E88(48, 1.0, backend="reference", **opts)
    assert e88.params(48, 1.0, **opts) == sum(p.numel() for p in layer.parameters())


def test_op_validates_before_launch():
    kw = {k: None if t is None else t.detach().float() for k, t in _core_inputs(n=8, v=8).items()}
    with pytest.raises(ValueError, match="CUDA"):
        op.recurrence(**kw)
    bad = dict(kw, q=kw["q"][:, :, :, :4])
    with pytest.raises(ValueError, match="q has shape"):
        op.recurrence(**bad)
    small = {k: None if t is None else t.detach().float() for k, t in _core_inputs(n=4, v=8).items()}
    with pytest.raises(ValueError, match="take n and v"):
        op.recurrence(**small)
    with pytest.raises(ValueError, match="empty"):
        op.recurrence(**dict(kw, q=kw["q"][:0], k=kw["k"][:0], v=kw["v"][:0]))
    with pytest.raises(TypeError, match="dtype"):
        op.recurrence(**dict(kw, q=kw["q"].half(), k=kw["k"].half(), v=kw["v"].half()))
    with pytest.raises(ValueError, match="checkpoint"):
        op.recurrence(**kw, K=0)
    with pytest.raises(ValueError, match="decay"):
        op.recurrence(**dict(kw, decay=kw["decay"][..., None]))
    with pytest.raises(ValueError, match="group"):
        op.recurrence(**kw, group=5)
    assert op.groups(64) == (0, 4)


def test_layouts_resolve():
    assert op.layouts(32, 32) == (0, op.WARP, op.RING, op.TILED, op.COLUMNS)
    assert op.layouts(32, 64) == (0, op.TILED, op.COLUMNS) and op.layouts(96, 32) == (0, op.COLUMNS)
    assert [op.layout_name(32, 32, g) for g in op.layouts(32, 32)] == ["warp", "warp", "ring", "tiled", "G4"]
    assert op.warp(8, 8, op.RING) and not op.warp(16, 32, op.RING) and op.RING not in op.layouts(64, 64)
    assert op.layout_name(64, 64) == "tiled" and op.layout_name(128, 32) == "G4"
    assert op.warp(24, 24) and not op.warp(16, 32) and not op.tiled(32, 32) and op.tiled(32, 32, op.TILED)
    from elman.families.matrix import bench
    assert bench.impl_name(0, 32, 32, 16) == "cuda:matrix:warp:slots16"
    assert bench.impl_name(op.TILED, 32, 32) == "cuda:matrix:tiled" and bench.impl_name(4, 32, 32, 3) == "cuda:matrix:G4"
    assert bench.impl_name(op.RING, 32, 32, 4) == "cuda:matrix:ring:slots4"
    assert bench.layouts(32, 32) == [op.WARP, op.RING, op.TILED, op.COLUMNS]
    assert bench.layouts(32, 64) == [op.TILED, op.COLUMNS] and bench.layouts(128, 128) == [op.COLUMNS]


class _BackwardOrder:
    """The state machine of warp.cuh's BackwardOrder, line for line (what the ring fetches next)."""

    def __init__(self, T, K, slots):
        self.T, self.K, self.slots = T, K, slots
        self.ch = -(-T // K)
        self.next_chunk()

    def s0(self):
        return max(self.ch * self.K, self.s1 - self.slots)

    def next_chunk(self):
        self.ch -= 1
        self.s1, self.t, self.back = min(self.T, (self.ch + 1) * self.K), self.ch * self.K, False

    def advance(self):
        if not self.back:
            if self.t + 1 < self.s1:
                self.t += 1
            else:
                self.back = True
        elif self.t > self.s0():
            self.t -= 1
        elif self.s0() > self.ch * self.K:
            self.s1, self.t, self.back = self.s0(), self.ch * self.K, False
        else:
            self.next_chunk()


@pytest.mark.parametrize("T", [1, 5, 16, 17, 37, 64])
@pytest.mark.parametrize("K", [1, 4, 16])
@pytest.mark.parametrize("slots", [1, 3, 4, 16])
def test_ring_order_is_the_backward_schedule(T, K, slots):
    """The ring of the warp backward fetches rows in the order the backward reads them: the
    kernel's state machine (mirrored) against schedule.backward_order, which every walk step
    reaches once, from T - 1 down to 0, after the recompute of its sub-chunk."""
    slots = min(slots, K, T)  # as the launcher clamps them
    want = schedule.backward_order(T, K, slots)
    order, got = _BackwardOrder(T, K, slots), []
    while order.ch >= 0:
        got.append(("walk" if order.back else "recompute", order.t))
        order.advance()
    assert got == want
    assert [t for kind, t in want if kind == "walk"] == list(reversed(range(T)))
    for i, (kind, t) in enumerate(want):
        if kind == "walk" and (i == 0 or want[i - 1][0] == "recompute"):
            assert want[i - 1] == ("recompute", t)  # a walk starts at the last recomputed step


@pytest.mark.parametrize("stages", [2, 4, 8])
@pytest.mark.parametrize("entries", [1, 3, 7, 8, 9, 40])
def test_ring_protocol(stages, entries):
    """warp.cuh's Ring protocol, emulated with the latest completion cp.async allows: prologue
    fetches entries 0 .. S - 2; per entry i, wait_group(S - 2), read stage i mod S, fetch entry
    i + S - 1 into stage (i + S - 1) mod S. Every read finds its own entry complete, and no fetch
    overwrites a stage whose entry is still unread."""
    S = stages
    stage, groups = [None] * S, []  # stage contents; committed groups (entry or None), in order
    done = 0                        # groups complete so far

    def fetch(e):
        if e < entries:
            old = stage[e % S]
            assert old is None or (isinstance(old, int) and old < i_read[0]), "overwrites an unread entry"
            stage[e % S] = ("pending", e)
        groups.append(e if e < entries else None)

    i_read = [-1]
    for e in range(S - 1):
        fetch(e)
    for i in range(entries):
        done = max(done, len(groups) - (S - 2))  # wait_group(S - 2): all but the S - 2 youngest
        for g in groups[:done]:
            if g is not None and stage[g % S] == ("pending", g):
                stage[g % S] = g
        assert stage[i % S] == i, f"entry {i} read before its copy completed"
        i_read[0] = i
        fetch(i + S - 1)


def test_parity_cases_build_on_cpu():
    g = torch.Generator().manual_seed(0)
    entry = e88.ENTRIES[0]
    cases = entry.parity(inputs.TEST_SHAPES[1], torch.float32, "cpu", g)
    assert [c.impl for c in cases][:3] == ["cuda:core", "cuda:core:G4", "cuda:layer[defaults]"]
    for c in cases:                      # the reference side of each case runs on the CPU
        outs = c.reference(**c.inputs)
        assert len(outs) == len(c.outputs)
    e75_cases = e75.ENTRIES[1].parity(e75.ENTRIES[1].test_shapes[0], torch.float32, "cpu", g)
    assert all(len(c.reference(**c.inputs)) == 2 for c in e75_cases)


def test_replaced_parameter_and_zero_width_raise():
    layer = e88.E88(16, backend="reference", n_heads=2, n_state=8)
    layer.w_o = torch.nn.Parameter(torch.zeros(16, 17))
    with pytest.raises(ValueError, match="parameter w_o"):
        layer(torch.randn(1, 2, 16))
    with pytest.raises(ValueError, match="dim"):
        e88.E88(0, n_heads=2, n_state=8)
    with pytest.raises(ValueError, match="dim"):
        e75.E75(0)


def test_parity_fills_a_shape_without_heads():
    g = torch.Generator().manual_seed(0)
    for entry in (e88.ENTRIES[0], e88.ENTRIES[-1], e75.ENTRIES[0]):
        cases = entry.parity(Shape(5, 3, entry.test_shapes[0].D), torch.float32, "cpu", g)
        assert cases and all(len(c.reference(**c.inputs)) == 2 for c in cases)


def test_bench_tables_read_records():
    from elman.families.matrix import bench

    t = {"median": 0.2, "p20": 0.19, "p80": 0.21, "reps": 5}
    rec = {"kind": "bench", "variant": "E88h83n32", "impl": "cuda:matrix",
           "params": {"measure": "recurrence", "T": 512, "B": 16, "D": 1920, "H": 83, "n": 32, "v": 32,
                      "K": 16, "dtype": "bfloat16"},
           "metrics": {"fwd_ms": t, "bwd_ms": {**t, "median": 0.4}, "fwdbwd_ms": {**t, "median": 0.6},
                       "bwd_over_fwd": 2.0, "per_step_us": 0.4, "peak_mem_mb": 100.0,
                       **bench.traffic_bytes(512, 16, 83, 32, 32, False)}}
    layer = lambda name, ms: {"kind": "bench", "variant": name, "impl": "x",  # noqa: E731
                              "params": {"measure": "layer", "B": 16, "D": 1920},
                              "metrics": {"fwdbwd_ms": {**t, "median": ms}, "peak_mem_mb": 10.0}}
    rec["impl"], rec["params"]["group"] = "cuda:matrix:G8", 8
    recs = [rec, layer("E88h83n32", 3.0), layer("fla-gdn", 2.0)]
    assert "E88h83n32" in bench.recurrence_table(recs)
    lines = bench.target_lines(recs, "E88h83n32", 16, 1920)
    assert "2.00 (target <= 1.5: not met)" in lines and "fla-gdn 2.00 ms" in lines
    assert bench.geometry(e88.ENTRIES[0], 1920)[:3] == (60, 32, 32)


def test_layer_case_is_the_same_for_the_same_seed():
    """The layer's initialisation is drawn from the harness's generator, so a parity seed names
    one case on every run (and the global RNG is left as it was)."""
    from elman.core.entry import Shape
    from elman.families.matrix import inputs
    from elman.variants import e88

    shape = Shape(3, 2, 32, 2, 16, 16)
    before = torch.random.get_rng_state()
    a, b = (inputs.layer_case(e88._shape_layer({}, shape), shape, "cpu", torch.Generator().manual_seed(7))
            for _ in range(2))
    c = inputs.layer_case(e88._shape_layer({}, shape), shape, "cpu", torch.Generator().manual_seed(8))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert a.inputs.keys() == b.inputs.keys()
    assert all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
    # another seed, another initialisation (beyond the 0.01-scale perturbation the case adds)
    w = next(k for k, t in a.inputs.items() if t.dim() == 2 and k not in ("y", "h0"))
    assert (a.inputs[w] - c.inputs[w]).abs().max() > 0.1


def test_e88_marks_the_nol2_layer_case_and_the_core_conditioned():
    from elman import registry
    from elman.core.entry import Shape

    cases = registry.get("E88").parity(Shape(3, 2, 32, 2, 16, 16), torch.float32, "cpu", torch.Generator().manual_seed(0))
    flags = {c.impl: c.conditioned for c in cases if c.impl.startswith("cuda:layer")}
    assert flags["cuda:layer[nol2]"] and not any(v for k, v in flags.items() if k != "cuda:layer[nol2]")
    for level in ("E88", "E88f_h4", "E75", "E75h2n32"):
        core = [c for c in registry.get(level).parity(Shape(1, 1, 32, 1, 32, 32), torch.bfloat16, "cpu",
                                                      torch.Generator().manual_seed(0))
                if c.impl.startswith("cuda:core")]
        assert core and all(c.conditioned for c in core), level
    e14 = registry.get("E14").parity(Shape(1, 1, 32, 1, 32, 32), torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    assert not any(c.conditioned for c in e14)


def test_the_recorded_layout_is_the_one_that_runs():
    """What last_path records (`op.layout_name`) is the layout that runs: the warp kernels where
    they fit, since the op hands every float32 input to the kernels 16-byte aligned (`f32_input`;
    q, k, v: validate.aligned), where an unaligned one would make them give way to the tiled
    ones; the other sizes' own layouts."""
    t = torch.zeros(64, dtype=torch.float32)
    assert op.layout_name(32, 32, 0) == "warp" and op.f32_input(t) is t and op.f32_input(None) is None
    assert op.layout_name(32, 32, op.RING) == "ring"
    off = t[2:]  # 8 bytes off
    fixed = op.f32_input(off)
    assert not validate.is_aligned(off) and validate.is_aligned(fixed) and torch.equal(fixed, off)
    assert validate.is_aligned(op.f32_input(torch.zeros(66, dtype=torch.bfloat16)[1:]))
    assert op.layout_name(16, 32, 0) == "tiled" and op.layout_name(96, 96, 0) == "G4"
    assert op.layout_name(32, 32, op.COLUMNS) == "G4"
