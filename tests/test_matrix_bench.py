"""CPU checks of the matrix family's benchmark module: the bytes and the floor arithmetic, the
chapter tables and plot and the target lines from synthetic records, and that the chapters' runs
resume (a rerun into the same run folder measures only what is missing)."""
from __future__ import annotations

import json

import pytest
import torch

from elman import registry
from elman.core import records
from elman.families.matrix import bench, op
from elman.variants import e88

# the seed study's 480M shape: B = 16, T = 512, H = 83, n = v = 32
T, B, D, H, N = 512, 16, 1920, 83, 32
HEADS = B * H
STATE = HEADS * N * N * 4


def _timing(ms: float) -> dict:
    return {"median": ms, "p20": ms, "p80": ms, "reps": 5}


def _recurrence(group: int, K: int, fwd: float, bwd: float, level: str = "E88h83n32") -> dict:
    params = {"measure": "recurrence", "T": T, "B": B, "D": D, "H": H, "n": N, "v": N, "K": K, "group": group,
              "slots": 0, "layout": op.layout_name(N, N, group), "dtype": "bfloat16"}
    return records.make("bench", level, bench.impl_name(group, N, N), params,
                        {"fwd_ms": _timing(fwd), "bwd_ms": _timing(bwd), "fwdbwd_ms": _timing(fwd + bwd),
                         "bwd_over_fwd": bwd / fwd, "per_step_us": 1000 * fwd / T, "peak_mem_mb": 300.0,
                         **bench.traffic_bytes(T, B, H, N, N, False, K)})


def _layer(level: str, ms: float, K: int | None = None) -> dict:
    params = {"measure": "layer", "T": T, "B": B, "D": D, "dtype": "bfloat16"}
    if K is not None:
        params["checkpoint"] = K
    impl = f"cuda:matrix:warp:K{K}" if K else f"{level}:bfloat16"
    return records.make("bench", level, impl, params,
                        {"fwd_ms": _timing(ms / 3), "fwdbwd_ms": _timing(ms), "peak_mem_mb": 900.0,
                         "tokens_per_s": B * T / ms * 1000})


def _primitives(sms: int = 100) -> list[dict]:
    """Copy 2000 GB/s, tanh.approx 32 and FMA 128 a clock per SM, 2 GHz, `sms` SMs."""
    copy = records.make("bench", "primitive", "copy", {"measure": "copy", "bytes": 2 ** 30},
                        {"ms": _timing(0.5), "gb_per_s": 2000.0})
    rates = [records.make("bench", "primitive", name, {"measure": "throughput", "op": name},
                          {"per_clock_per_sm": rate, "cycles": 1.0})
             for name, rate in (("tanh_approx", 32.0), ("ex2_approx", 32.0), ("fma", 128.0))]
    clocks = [records.make("bench", "primitive", "sm_clock_fma", {"measure": "clock", "work": "fma", "sms": s},
                           {"ghz": ghz, "min_ghz": ghz, "max_ghz": ghz, "ms": 1.0}) for s, ghz in ((16, 1.5), (128, 2.0))]
    out = [copy, *rates, *clocks]
    for r in out:
        r["env"] = {**r["env"], "sm_count": sms}
    return out


def test_bytes_at_the_480m_shape():
    m = bench.memory_bytes(T, B, H, N, N, False, 16)
    assert m["inputs"] == T * HEADS * ((2 * N + N) * 2 + 4) == 133_267_456
    assert m["outputs"] == T * HEADS * N * 2 and m["state"] == STATE
    assert m["checkpoints"] == 32 * STATE and m["scratch"] == 17 * STATE
    t16, t8 = bench.traffic_bytes(T, B, H, N, N, False, 16), bench.traffic_bytes(T, B, H, N, N, False, 8)
    assert t16["fwd_bytes"] == 176_783_360 + 32 * STATE + 2 * STATE
    assert t16["bwd_bytes"] == 2 * 133_267_456 + T * HEADS * N * 2 + 32 * STATE + 2 * STATE
    assert t8["fwd_bytes"] - t16["fwd_bytes"] == 32 * STATE == t8["ckpt_bytes"] - t16["ckpt_bytes"]
    column = bench.traffic_bytes(T, B, H, N, N, True, 16)
    assert column["fwd_bytes"] - t16["fwd_bytes"] == T * HEADS * (N - 1) * 4  # a decay a value column


def test_floor_from_measured_primitives():
    recs = _primitives()
    prims = bench.primitives(recs)
    assert prims == {"gb_per_s": 2000.0, "tanh": 32.0, "fma": 128.0, "ghz": 2.0, "sms": 100}
    rec = _recurrence(op.WARP, 16, 0.5, 1.5)
    f = bench.floor(rec, prims)
    elements = T * HEADS * N * N
    clocks_per_ms = 100 * 2.0 * 1e6
    assert f["fwd"]["tanh"] == pytest.approx(elements / 32 / clocks_per_ms)
    assert f["fwd"]["fma"] == pytest.approx(bench.FMA_OPS["fwd"] * elements / 128 / clocks_per_ms)
    assert f["bwd"]["fma"] == pytest.approx(bench.FMA_OPS["bwd"] * elements / 128 / clocks_per_ms)
    assert f["fwd"]["memory"] == pytest.approx(rec["metrics"]["fwd_bytes"] / 2000 / 1e6)
    assert f["bwd"]["memory"] == pytest.approx(rec["metrics"]["bwd_bytes"] / 2000 / 1e6)
    assert bench.primitives(recs[1:]) is None and bench.primitives([r for r in recs if r["params"]["measure"] != "clock"]) is None
    assert "2,000 GB/s" in bench.primitive_lines(recs) and "2.00 GHz" in bench.primitive_lines(recs)
    assert "cannot be stated" in bench.primitive_lines(recs[:1])


def _run_records() -> list[dict]:
    return [_recurrence(op.WARP, 16, 0.56, 1.66), _recurrence(op.WARP, 8, 0.59, 1.35),
            _recurrence(op.RING, 16, 0.50, 1.50), _recurrence(op.TILED, 8, 0.45, 2.32),
            _recurrence(op.COLUMNS, 16, 0.94, 6.17),
            _layer("E88h83n32", 9.0, 16), _layer("E88h83n32", 8.5, 8), _layer("fla-gdn", 6.0), _layer("mamba2", 7.0),
            *_primitives()]


def test_target_table_and_lines_name_the_fastest_layout_and_k():
    recs = _run_records()
    table = bench.target_table(recs, "E88h83n32", B, D)
    rows = table.splitlines()
    assert rows[2].startswith("| E88h83n32 recurrence | warp, K = 8 | 0.590 | 1.350 | 2.29 | 1.940")
    assert "| E88h83n32 layer | warp, K = 8 |" in table and "| fla-gdn layer |" in table and "| mamba2 layer |" in table
    lines = bench.target_lines(recs, "E88h83n32", B, D)
    assert "cuda:matrix:warp at K = 8 (of 5 layouts and intervals timed)" in lines
    assert "2.29 (target <= 1.5: not met)" in lines and "1.940 ms (target <= 0.5 ms: not met)" in lines
    assert "Floor of that layout's work" in lines
    assert "(warp, K = 8): E88h83n32 8.50 ms, fla-gdn 6.00 ms (fla-gdn / E88h83n32 = 0.71; target faster than " \
        "fla-gdn: not met)" in lines
    assert "mamba2 7.00 ms (mamba2 / E88h83n32 = 0.82)" in lines
    fast = [*recs, _recurrence(op.RING, 8, 0.1, 0.12)]
    assert "(target <= 1.5: met)" in bench.target_lines(fast, "E88h83n32", B, D)
    assert "cannot be stated" in bench.target_lines(recs, "E88h83n32", 64, D)


def test_floor_and_standing_tables():
    recs = _run_records()
    floors = bench.floor_table(recs, "E88h83n32").splitlines()
    assert len(floors) == 2 + 2 * 2  # K = 8 and 16, forward and backward
    prims = bench.primitives(recs)
    warp16 = recs[0]
    f = bench.floor(warp16, prims)
    worst = max(f["fwd"].values())
    assert any(row.startswith("| E88h83n32 | 16 | 83 | 32 | 32 | 16 | forward |") and f"{worst:.3f}" in row
               for row in floors)
    standing = bench.standing_table(recs, "E88h83n32").splitlines()
    assert len(standing) == 2 + 5
    ring = next(row for row in standing if "| ring |" in row)
    assert f"| {0.5 / max(bench.floor(recs[2], prims)['fwd'].values()):.1f} |" in ring
    assert "cannot be stated" in bench.floor_table(recs[:9]) and "cannot be stated" in bench.standing_table(recs[:9])


def test_recurrence_table_and_plot():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    recs = _run_records()
    table = bench.recurrence_table(recs)
    assert table.count("| E88h83n32 | cuda:matrix:") == 5 and "| cuda:matrix:ring | 16 | 83 | 32 | 32 | 16 |" in table
    fig = bench.plot(recs, "E88h83n32", B, D)
    assert fig is not None
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels[0] == "warp, K = 8" and "G4, K = 16" in labels
    assert bench.plot(recs[:9], "E88h83n32", B, D) is not None  # without primitives: no floor ticks
    assert bench.plot(recs, "E88h83n32", 64, D) is None


def test_chapter_records_resume(tmp_path, monkeypatch):
    """Each measurement is written when it is made; a rerun into the same run folder measures
    only what the run does not hold yet."""
    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path))
    made: list[tuple] = []

    def fake_recurrence(level, sets, D_, K, group, slots=0, reps=30):
        made.append(("recurrence", K, group))
        return _recurrence(group, K, 0.5, 1.5, level)

    def fake_layer(entry, B_, D_, T_=T, reps=20, dtype="bfloat16", quick=False, impl=None, **options):
        made.append(("layer", entry.name, options.get("checkpoint")))
        return _layer(entry.name, 5.0, options.get("checkpoint"))

    def fake_primitives(parts):
        made.append(("primitives", parts))
        return [r for r in _primitives() if r["params"]["measure"] in parts]

    monkeypatch.setattr(bench, "input_sets", lambda *a, **k: [])
    monkeypatch.setattr(bench, "recurrence_record", fake_recurrence)
    flagship = registry.get("E88h83n32")
    fakes = dict(layer_record=fake_layer, primitive_records=fake_primitives)
    baselines = (registry.get("fla-gdn"), registry.get("mamba2"))

    new = bench.chapter_records(flagship, B, D, T, (8, 16), baselines, **fakes)
    layouts = [op.WARP, op.RING, op.TILED, op.COLUMNS]
    assert made[:8] == [("recurrence", K, g) for K in (8, 16) for g in layouts]
    assert made[8] == ("primitives", ("copy", "throughput", "clock"))
    assert made[9:] == [("layer", "E88h83n32", 8), ("layer", "E88h83n32", 16), ("layer", "fla-gdn", None),
                        ("layer", "mamba2", None)]
    path = tmp_path / "records.jsonl"
    assert len(path.read_text().splitlines()) == len(new) == 8 + 6 + 4
    made.clear()
    assert bench.chapter_records(flagship, B, D, T, (8, 16), baselines, **fakes) == [] and made == []
    # a run stopped after its first records: the rerun measures the rest only
    kept = path.read_text().splitlines()[:3]
    path.write_text("\n".join(kept) + "\n")
    bench.chapter_records(flagship, B, D, T, (8, 16), baselines, **fakes)
    assert made[:5] == [("recurrence", 8, op.COLUMNS)] + [("recurrence", 16, g) for g in layouts]
    assert made[5] == ("primitives", ("copy", "throughput", "clock")) and len(made) == 10
    keys = [bench.record_key(json.loads(line)) for line in path.read_text().splitlines()]
    assert len(keys) == 18 and len({k for k in keys if k[0] in ("recurrence", "layer")}) == 12
    # a core without passing parity in the run: no recurrence and no layer of the level
    made.clear()
    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path / "other"))
    bench.chapter_records(flagship, B, D, T, (16,), (), gate={"cuda:core": False}, **fakes)
    assert [m[0] for m in made] == ["primitives"]


def test_cell_records_time_every_layout(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "input_sets", lambda *a, **k: [{"k": torch.empty(1, 1, 1, N), "v": torch.empty(1, 1, 1, N)}])
    monkeypatch.setattr(bench, "recurrence_record", lambda level, sets, D_, K, g, slots, reps: calls.append((K, g)))
    bench.cell_records(e88.ENTRIES[0], B, D, T)
    assert calls == [(op.CHECKPOINT, g) for g in (op.WARP, op.RING, op.TILED, op.COLUMNS)]


def test_sm_rates_count_every_cta_of_an_sm_over_its_whole_span():
    """Two CTAs that ran one after the other on SM 0 (each 100 clocks) and two side by side on SM
    1: 2 x 1000 instructions over 200 and over 100 clocks. A median of per-CTA cycles would
    read 1000 / 100 per CTA on both, 2x too high on SM 0."""
    from elman.harness import probes

    out = torch.tensor([[0, 0, 100], [0, 100, 200], [1, 50, 150], [1, 50, 150]], dtype=torch.int64)
    assert probes.sm_rates(out.flatten(), 1000).tolist() == [10.0, 20.0]


def test_chapter_records_time_the_layer_on_the_fastest_layout(tmp_path, monkeypatch):
    """Where the fastest recurrence runs on another layout than the default, the layer is timed
    there too, with that K and layout (the group option)."""
    monkeypatch.setenv("ELMAN_RUN_DIR", str(tmp_path))
    made: list[tuple] = []

    def fake_recurrence(level, sets, D_, K, group, slots=0, reps=30):
        return _recurrence(group, K, 0.3 if (K, group) == (16, op.RING) else 0.5, 1.0, level)

    def fake_layer(entry, B_, D_, T_=T, reps=20, dtype="bfloat16", quick=False, impl=None, **options):
        made.append((options.get("checkpoint"), options.get("group", 0), impl))
        rec = _layer(entry.name, 5.0, options.get("checkpoint"))
        rec["params"].update(options)
        return rec

    monkeypatch.setattr(bench, "input_sets", lambda *a, **k: [])
    monkeypatch.setattr(bench, "recurrence_record", fake_recurrence)
    flagship = registry.get("E88h83n32")
    fakes = dict(layer_record=fake_layer, primitive_records=lambda parts: [])
    bench.chapter_records(flagship, B, D, T, (8, 16), (), **fakes)
    assert made == [(8, 0, "cuda:matrix:warp:K8"), (16, 0, "cuda:matrix:warp:K16"),
                    (16, op.RING, "cuda:matrix:ring:K16")]
    made.clear()
    bench.chapter_records(flagship, B, D, T, (8, 16), (), **fakes)  # all recorded: nothing again
    assert made == []
