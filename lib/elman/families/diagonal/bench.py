"""The diagonal family's cell benchmarks (bf16, random inputs, timed as core.timing times),
measured against the memory ceiling.

- `cell_records`: the scan alone on precomputed projections (the raw op), forward and
  backward timed separately (the backward on a stored forward), with the bytes each must
  move (`op.forward_bytes`, `op.backward_bytes`: inputs read once, outputs and saved states
  written once) over its time = achieved bandwidth, beside the device's copy bandwidth
  measured in the same process (`copy_bandwidth`: a large device-to-device tensor copy,
  bytes read + written over time). Beside E61 (HGRN's recurrence): flash-linear-attention's
  `fused_recurrent_hgrn` and `chunk_hgrn` at the same shape (their forward reads x and g and
  writes o; their backward reads g, o and do and writes dx and dg: `hgrn_bytes`). Beside
  E68: a PyTorch loop whose step is `torch.compile`d (one fused kernel per step).
- `recurrent_layer_records`: the variant's cell with its input GEMMs and every gradient.

Impls: `cuda:scan`, `fla:fused_recurrent_hgrn`, `fla:chunk_hgrn`, `torch:compile`. The brief's
grid is B in {4, 16, 64}, D in {1024, 2048, 4096}, T in {512, 4096} (`GRID`).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from ...core import records
from ...core.entry import Entry, Shape
from ...core.timing import T_DEFAULT, copy_bandwidth, rotation, timeit
from . import op

GRID = {"B": (4, 16, 64), "D": (1024, 2048, 4096), "T": (512, 4096)}


def has_cell(entry: Entry) -> bool:
    """Whether the entry's cell runs the diagonal scan (so the cell benchmark applies)."""
    return entry.family == "diagonal" and entry.epilogue is not None


def hgrn_bytes(T: int, B: int, D: int, itemsize: int, backward: bool) -> int:
    """Bytes FLA's HGRN must move: forward reads x, g and writes o; backward reads g, o, do
    and writes dx, dg."""
    return itemsize * T * B * D * (5 if backward else 3)


def _params(measure: str, B: int, D: int, T: int) -> dict:
    return {"measure": measure, **Shape(T, B, D).params(), "dtype": "bfloat16"}


def _metrics(fwd: dict, bwd: dict | None, fwdbwd: dict, fwd_bytes: int, bwd_bytes: int,
             copy_gbs: float) -> dict:
    m = {"fwd_ms": fwd, "fwdbwd_ms": fwdbwd, "copy_gbs": copy_gbs,
         "fwd_bytes": fwd_bytes, "bwd_bytes": bwd_bytes}
    bwd_ms = bwd["median"] if bwd is not None else fwdbwd["median"] - fwd["median"]
    if bwd is not None:
        m["bwd_ms"] = bwd
    m["fwd_gbs"] = fwd_bytes / (fwd["median"] * 1e6)
    m["bwd_gbs"] = bwd_bytes / (max(bwd_ms, 1e-6) * 1e6)
    m["fwd_pct_copy"] = 100 * m["fwd_gbs"] / copy_gbs
    m["bwd_pct_copy"] = 100 * m["bwd_gbs"] / copy_gbs
    return m


def _scan_sets(step: str, T: int, B: int, D: int, n: int, dtype=torch.bfloat16):
    info = op.step_info(step)
    g = torch.Generator(device="cuda").manual_seed(1234)
    sets = []
    for _ in range(n):
        def rnd(*shape):
            return torch.randn(*shape, device="cuda", generator=g).to(dtype)
        s = {"inputs": [rnd(T, B, D) for _ in range(info["inputs"])],
             "params": [0.3 + 0.6 * torch.rand(D, device="cuda", generator=g) for _ in range(info["params"])],
             "h0": 0.5 * rnd(B, D), "d_out": rnd(T, B, D), "d_hT": rnd(B, D)}
        sets.append(s)
    return info, sets


def _scan_fns(step: str, T: int, B: int, D: int, n: int, dtype=torch.bfloat16, vec: int = 0):
    """(fwd, bwd, fwdbwd, bytes fwd, bytes bwd) of the raw op on n rotated input sets; each
    set keeps its own h_all, filled by one forward before the backward is timed. `vec`: the
    elements per thread (0: the launcher's choice; see op.plan)."""
    info, sets = _scan_sets(step, T, B, D, n, dtype)
    like = sets[0]["inputs"][0]
    out = torch.empty_like(like)
    h_alls = [like.new_empty(T + 1, B, D) for _ in sets]
    d_inputs = [torch.empty_like(like) for _ in range(info["inputs"])]
    dh0 = like.new_empty(B, D)
    d_params = torch.empty(info["params"], B, D, device="cuda", dtype=torch.float32)
    sid = info["id"]

    def fwd(i):
        s = sets[i]
        op.forward_into(sid, s["inputs"], s["params"], s["h0"], out, h_alls[i], vec)

    def bwd(i):
        s = sets[i]
        op.backward_into(sid, s["inputs"], s["params"], h_alls[i], s["d_out"], s["d_hT"], d_inputs,
                         dh0, d_params, vec)

    def fwdbwd(i):
        fwd(i)
        bwd(i)
    for i in range(n):
        fwd(i)
    k, p = info["inputs"], info["params"]
    size = like.element_size()
    return (fwd, bwd, fwdbwd, op.forward_bytes(k, p, T, B, D, size), op.backward_bytes(k, p, T, B, D, size))


def _fla_fns(kind: str, T: int, B: int, D: int, n: int):
    """FLA's HGRN (batch-major [B, T, D] inputs x and log-decay g, bf16)."""
    from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn
    fn = fused_recurrent_hgrn if kind == "fused_recurrent_hgrn" else chunk_hgrn
    g = torch.Generator(device="cuda").manual_seed(77)
    sets = []
    for _ in range(n):
        x = torch.randn(B, T, D, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
        a = F.logsigmoid(torch.randn(B, T, D, device="cuda", generator=g) + 2).to(torch.bfloat16)
        sets.append((x, a.requires_grad_(), torch.randn(B, T, D, device="cuda", generator=g).to(torch.bfloat16)))
    h0 = torch.zeros(B, D, device="cuda", dtype=torch.bfloat16)

    def fwd(i):
        x, a, _ = sets[i]
        with torch.no_grad():
            fn(x, a, h0, False)

    def fwdbwd(i):
        x, a, do = sets[i]
        o, _ = fn(x, a, h0, False)
        torch.autograd.grad(o, (x, a), do)
    return fwd, fwdbwd


def _e68_step(h, a, u, d_g, b_g):
    alpha = torch.sigmoid(a)
    v = torch.tanh(u) * torch.sigmoid(d_g * h + b_g)
    h = alpha * h + (1 - alpha) * v
    return h, h * F.silu(h)


@lru_cache(maxsize=1)
def _compiled_e68_step():
    """E68's step compiled once per process (torch.compile specialises it per [B, D] shape)."""
    return torch.compile(_e68_step, dynamic=False)


def _compiled_e68_fns(T: int, B: int, D: int, n: int):
    """E68's recurrence as a PyTorch loop over a `torch.compile`d step."""
    step = _compiled_e68_step()
    info, sets = _scan_sets("e68", T, B, D, n)

    def run(h0, us, qs):
        # unbind once: indexing x[t] per step would make autograd build a full-size gradient
        # for every step (quadratic in T)
        h, outs = h0, []
        for a, u in zip(us[0].unbind(0), us[1].unbind(0)):
            h, o = step(h, a, u, qs[0], qs[1])
            outs.append(o)
        return torch.stack(outs), h

    def fwd(i):
        s = sets[i]
        with torch.no_grad():
            run(s["h0"], s["inputs"], [q.to(torch.bfloat16) for q in s["params"]])

    def fwdbwd(i):
        s = sets[i]
        leaves = [t.detach().requires_grad_() for t in (s["h0"], *s["inputs"])]
        qs = [q.to(torch.bfloat16).requires_grad_() for q in s["params"]]
        out, h = run(leaves[0], leaves[1:], qs)
        torch.autograd.grad((out, h), (*leaves, *qs), (s["d_out"], s["d_hT"]))
    return fwd, fwdbwd


def cell_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                 quick: bool = False, impls: tuple[str, ...] | None = None,
                 gate: dict[str, bool] | None = None) -> list[dict]:
    """Time the entry's scan at one shape (and FLA's HGRN beside E61, the compiled loop beside
    E68). `gate` ({impl: parity passed}) skips the scan if its parity did not pass in this run."""
    step = entry.epilogue
    info = op.step_info(step)
    per_set = (2 * info["inputs"] + 3) * T * B * D * 2
    n = 2 if quick else rotation(per_set)
    copy_gbs = copy_bandwidth()["gbs"]
    out = []

    def want(impl):
        return not impls or impl in impls

    if want("cuda:scan"):
        if gate is not None and not gate.get("cuda:scan", False):
            print(f"bench: skipping {entry.name} cuda:scan at B={B} D={D}: no passing parity in this run")
        else:
            fwd, bwd, fwdbwd, fb, bb = _scan_fns(step, T, B, D, n)
            m = _metrics(timeit(fwd, reps, 3, n), timeit(bwd, reps, 3, n), timeit(fwdbwd, reps, 3, n),
                         fb, bb, copy_gbs)
            m["launch"] = op.plan(step, B, D, torch.bfloat16)
            out.append(records.make("bench", entry.name, "cuda:scan", _params("cell", B, D, T), m))
            del fwd, bwd, fwdbwd
    baselines = {}
    if step == "e61":
        baselines = {f"fla:{k}": (lambda k=k: _fla_fns(k, T, B, D, n), hgrn_bytes(T, B, D, 2, False),
                                  hgrn_bytes(T, B, D, 2, True))
                     for k in ("fused_recurrent_hgrn", "chunk_hgrn")}
    if step == "e68":
        k, p = info["inputs"], info["params"]
        baselines = {"torch:compile": (lambda: _compiled_e68_fns(T, B, D, n), op.forward_bytes(k, p, T, B, D, 2),
                                       op.backward_bytes(k, p, T, B, D, 2))}
    for impl, (make, fb, bb) in baselines.items():
        if not want(impl):
            continue
        try:
            fwd, fwdbwd = make()
        except ImportError as exc:
            print(f"bench: {impl} unavailable: {exc}")
            continue
        r, w = reps, 2
        if impl == "torch:compile":  # one launch a step: seconds a call at T = 4096
            r, w = (max(3, reps // 6), 2) if T <= 512 else (3, 1)
        tf, tfb = timeit(fwd, r, w, n), timeit(fwdbwd, r, w, n)
        out.append(records.make("bench", entry.name, impl, _params("cell", B, D, T),
                                _metrics(tf, None, tfb, fb, bb, copy_gbs)))
    torch.cuda.empty_cache()
    return out


def recurrent_layer_records(entry: Entry, B: int, D: int, T: int = T_DEFAULT, reps: int = 30,
                            quick: bool = False, gate: dict[str, bool] | None = None) -> list[dict]:
    """The entry's cell with its input GEMMs inside and every gradient (x, weights, biases,
    vectors, h0), bf16: measure `recurrent_layer`."""
    if gate is not None and not gate.get("cuda:scan", False):
        print(f"bench: skipping {entry.name} recurrent_layer at B={B} D={D}: no passing parity")
        return []
    g = torch.Generator(device="cuda").manual_seed(4321)
    case = entry.parity(Shape(T, B, D), torch.bfloat16, "cuda", g)[0]
    leaves = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in case.inputs.items()}
    case.inputs.clear()
    grad = torch.randn(T, B, D, device="cuda", generator=g).to(torch.bfloat16)

    def fwd(i):
        with torch.no_grad():
            case.fast(**leaves)

    def fwdbwd(i):
        o, _ = case.fast(**leaves)
        torch.autograd.grad(o, list(leaves.values()), grad)
    tf, tfb = timeit(fwd, reps, 3, 1), timeit(fwdbwd, reps, 3, 1)
    del leaves
    torch.cuda.empty_cache()
    return [records.make("bench", entry.name, "cuda:scan", _params("recurrent_layer", B, D, T),
                         {"fwd_ms": tf, "fwdbwd_ms": tfb, "tokens_per_s": B * T / (tfb["median"] / 1000)})]


def last_impl() -> str:
    """What the op's last forward ran, for a layer record."""
    return "cuda:" + op.last_path.get("forward", "?")
