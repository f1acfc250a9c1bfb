"""The Leaderboard chapter's logic on synthetic train records and logs: which table a record
belongs to, ranking, seeds and gaps, the table's cells and flags, the seed study's figures,
the findings and the figures."""
from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from elman.core import records  # noqa: E402
from elman.results import leaderboard as lb  # noqa: E402
from elman.results import leaderboard_claims as claims  # noqa: E402
from elman.results import leaderboard_plots as plots  # noqa: E402
from elman.results import training  # noqa: E402

PERSISTENT = {"layers": [{"layer": "L", "backend": "cuda", "forward": {"dense.op": "persistent"}}] * 2,
              "backward": {"dense.op": "persistent"}}


def _record(level, bits, table="50m", seed=42, dim=1280, se=0.002, data=lb.DATA, paths=PERSISTENT,
            passes=0.5, tps=400_000.0, gpu="NVIDIA H100 80GB HBM3"):
    t = lb.TABLES[table]
    name = lb.run_name(level, dim, t.depth, seed)
    nats = bits * math.log(2)
    r = records.make("train", level, "cuda+fused",
                     {"name": name, "level": level, "dim": dim, "depth": t.depth, "expansion": 1.0,
                      "option": [], "batch": t.batch, "seq": t.seq, "lr": t.lr, "seed": seed,
                      "minutes": t.minutes, "data": data, "data_sha256": "abc", "n_params": 49_000_000,
                      "world_size": 1, "family": None if level in ("mamba2", "fla-gdn", "llama") else "dense"},
                     {"steps": 8000, "last100": nats + 0.01, "last1000": nats + 0.02, "val_loss": nats,
                      "val_se": se * math.log(2), "val_bits": bits, "val_bits_se": se,
                      "val_per_source": {"linux": nats - 0.1, "books": nats + 0.1},
                      "tokens_per_s": tps, "peak_memory_mb": 6144.0, "data_passes": passes,
                      "kernel_paths": paths, "kernels": "persistent x2", "elapsed_s": 600.0,
                      "log": f"train/{name}/log.jsonl"})
    r["env"] = {**r["env"], "gpu": gpu}
    return r


def _write(folder, recs):
    records.write(recs, folder)
    for r in recs:
        log = folder / r["metrics"]["log"]
        log.parent.mkdir(parents=True, exist_ok=True)
        lines = [{"kind": "train", "step": s, "loss": 3.0 - s / 100, "tokens_per_s": 4e5, "lr": 3e-4,
                  "grad_norm": 0.5, "elapsed_s": s * 0.1} for s in (10, 20, 30)]
        lines.append({"kind": "val", "step": 30, "val_loss": r["metrics"]["val_loss"]})
        log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return training.rows(records.read([folder], kind="train"))


def _boards(tmp_path, recs):
    return lb.boards(_write(tmp_path / "20270101T000000Z_abc_h100", recs))


def test_a_record_belongs_to_the_table_of_its_protocol(tmp_path):
    recs = [_record("E1", 1.9), _record("E1", 1.8, "100m", dim=640),
            _record("E0", 1.7, data=".cache/data/linux-6.1-200M.txt.xz"), _record("E33", 1.9)]
    recs[-1]["params"]["depth"] = 4
    (b50, b100), others = _boards(tmp_path, recs)
    assert [r["name"] for r in b50.ranked] == ["E1_d1280x6"]
    assert [r["name"] for r in b100.ranked] == ["E1_d640x20"]
    reasons = {row["name"]: why for row, why in others}
    assert reasons == {"E0_d1280x6": "data linux-6.1-200M.txt.xz, not debian-mix-1200M.txt.xz",
                       "E33_d1280x6": "depth 4, not 6 or 20"}  # the name was given, the depth changed


def test_board_ranks_models_at_seed_42_and_measures_seed_noise(tmp_path):
    recs = [_record("E0", 1.92), _record("E1", 1.90), _record("E1", 1.93, seed=43), _record("E42", 1.80)]
    (b, _), _ = _boards(tmp_path, recs)
    assert [r["name"] for r in b.ranked] == ["E42_d1280x6", "E1_d1280x6", "E0_d1280x6"]
    assert math.isclose(b.noise, 0.03)
    assert "E1" not in b.missing and "E33" in b.missing and len(b.missing) == len(lb.TABLES["50m"].levels) - 3
    gaps = lb.gaps(b)
    assert [(g["upper"], g["lower"]) for g in gaps] == [("E42_d1280x6", "E1_d1280x6"), ("E1_d1280x6", "E0_d1280x6")]
    assert gaps[0]["beyond_se"] and gaps[0]["beyond_seed"]        # 0.10: over 2 se and over 0.03
    assert gaps[1]["beyond_se"] and not gaps[1]["beyond_seed"]    # 0.02: over 2 se, under 0.03
    assert math.isclose(gaps[1]["two_se"], 2 * math.sqrt(2) * 0.002)


def test_further_rows_join_the_100m_table_and_are_listed_apart_while_missing(tmp_path):
    recs = [_record("E1", 1.8, "100m", dim=640), _record("gru", 2.0, "100m", dim=384)]
    (_, b), _ = _boards(tmp_path, recs)
    t = lb.TABLES["100m"]
    assert [r["level"] for r in b.ranked] == ["E1", "gru"]
    assert b.missing == [lv for lv in t.all_levels if lv not in ("E1", "gru", "E14")]
    line = [l for l in lb.status([b], []).splitlines() if "100M" in l][0]
    assert f"2 of {len(t.runnable)} models" in line and len(t.runnable) == len(t.all_levels) - 1
    seed_part, further_part = line.split("further variants not run yet: ")
    assert "E0" in further_part and "gru" not in further_part and "E0" not in seed_part
    assert "mamba2" in seed_part and "E1," not in seed_part
    further_part, cannot_part = further_part.split("; E14 cannot run at this protocol: ")
    from elman.families.matrix import gated_op

    assert "E14" not in further_part and f"above the gated kernels' {max(gated_op.SIZES)} " in cannot_part
    table = lb.markdown_table(b).splitlines()
    assert [l for l in table if "| E14 |" in l][0].count("cannot run at this protocol") == 1
    assert table.index([l for l in table if "| E14 |" in l][0]) == 2 + len(b.ranked) + len(b.missing)


def test_the_later_run_of_a_model_and_seed_counts(tmp_path):
    rows = _write(tmp_path / "20270101T000000Z_a_h100", [_record("E1", 1.9)])
    rows += _write(tmp_path / "20270102T000000Z_b_h100", [_record("E1", 1.7)])
    b = lb.board(lb.TABLES["50m"], rows)
    assert len(b.ranked) == 1 and b.ranked[0]["val_bits"] == 1.7 and b.noise is None


def test_a_row_takes_the_tables_spelling_of_its_level(tmp_path):
    rec = _record("E37v2", 2.1)
    rec["variant"] = "E37"  # the registry's name (a run of --level E37 records it)
    (b, _), _ = _boards(tmp_path, [rec])
    assert [r["level"] for r in b.ranked] == ["E37v2"] and "E37v2" not in b.missing
    assert "1.576 [" in lb.markdown_table(b)  # the seed study's E37v2 figure
    assert lb.table_level(lb.TABLES["50m"], "E37") == "E37v2" and lb.table_level(lb.TABLES["50m"], "E2") == "E2"


def test_spellings_name_the_registry_entries_of_the_tables_levels():
    from elman import registry

    respelled = {registry.get(lv).name.lower(): lv for t in lb.TABLES.values() for lv in t.levels
                 if registry.get(lv).name != lv}
    assert respelled == lb.SPELLINGS


def _profile(level, dim, tps, run, depth=6, batch=64, mode="trainer-graph", forward=None, typed=None):
    layers = [{"layer": level, "backend": "cuda", "forward": forward or {"dense.op": "persistent"}}] * 2
    typed = {} if typed is None else {"level": typed}   # the level as the job line spelled it
    r = records.make("bench", level, "cuda",
                     {"measure": "lm_profile", "mode": mode, "setup": "after", "dim": dim, "depth": depth,
                      "expansion": 1.0, "B": batch, "T": 512, "n_params": 49_500_000, "family": "dense", **typed},
                     {"tokens_per_s": tps, "phase_ms": {"step": 36.9}, "peak_mem_mb": 4096.0,
                      "kernel_paths": {"layers": layers}, "kernels": "dense.op:persistent x2"})
    return {**r, "run": run}


def test_preflight_table_lists_each_model_once_beside_its_run(tmp_path):
    (b, b100), _ = _boards(tmp_path, [_record("E1", 1.9, tps=884_000.0)])
    profiles = [_profile("E1", 1280, 800_000.0, "a"), _profile("E1", 1280, 885_000.0, "b"),
                _profile("E37", 1664, 631_000.0, "a", forward={"dense.op": "graph"}),
                _profile("E0", 1280, 900_000.0, "a", mode="trainer"),  # not the step the run takes
                _profile("E1", 640, 270_000.0, "a", depth=20, batch=32)]
    rows = lb.preflight_table(b, profiles).splitlines()[2:]
    assert rows == ["| E1 d1280 x 6 | 49.5M | 885,000 | 884,000 | 36.9 | 4.0 | dense.op:persistent x2 |",
                    "| E37v2 d1664 x 6 | 49.5M | 631,000 | not run yet | 36.9 | 4.0 | ⚠ dense.op:persistent x2 |"]
    assert "| E1 d640 x 20 |" in lb.preflight_table(b100, profiles)
    assert lb.preflight_table(b, profiles[3:4]) is None
    # a record's typed level names the row, whatever the registry calls the entry
    typed = lb.preflight_table(b, [_profile("entry-name", 1664, 699_000.0, "a", typed="E39")])
    assert typed.splitlines()[2].startswith("| E39 d1664 x 6 | 49.5M | 699,000 | not run yet |")



def test_preflight_table_shows_a_failed_configuration_until_a_later_run_profiles_it():
    from elman.training import profile

    failed = {**profile.failure_record("E14", 512, 6, 2.0, 64, 512, {}, "trainer-graph", "after", "auto",
                                       ValueError("n=1024 | v=1024 too wide")), "run": "a"}
    b = lb.board(lb.TABLES["50m"], [])
    rows = lb.preflight_table(b, [failed]).splitlines()[2:]
    assert rows == ["| E14 d512 x 6 (e 2) | - | failed | - | - | - | ValueError: n=1024 \\| v=1024 too wide |"]
    later = _profile("E14", 512, 500_000.0, "b")
    later["params"]["expansion"] = 2.0
    assert "| failed |" not in lb.preflight_table(b, [failed, later])
    assert "| failed |" in lb.preflight_table(b, [{**later, "run": "0"}, failed])


def test_table_cells_flags_and_seed_figures(tmp_path):
    reference = {"layers": [{"layer": "L", "backend": "reference", "forward": "reference"}], "backward": {}}
    unrecorded = {"layers": [{"layer": "L", "backend": "cuda", "forward": "pytorch"}], "backward": {}}
    recs = [_record("E1", 1.9, passes=1.2), _record("E33", 2.0, paths=reference),
            _record("E37v2", 2.1, paths=unrecorded), _record("mamba2", 1.8, paths=unrecorded)]
    (b, _), _ = _boards(tmp_path, recs)
    table = lb.markdown_table(b)
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    assert lines["mamba2_d1280x6"].startswith("| 1 |") and lines["mamba2_d1280x6"].endswith("| persistent x2 |")
    assert "1.9000 ± 0.0020" in lines["E1_d1280x6"] and "1.20 (past one pass)" in lines["E1_d1280x6"]
    assert "1.41–1.43 [1]" in lines["E1_d1280x6"] and "201,600–254,000 [1]" in lines["E1_d1280x6"]
    assert lines["E1_d1280x6"].endswith("| persistent x2 |")
    assert "| ⚠ persistent x2 |" in lines["E33_d1280x6"] and "| ? persistent x2 |" in lines["E37v2_d1280x6"]
    assert "| E34 | not run yet |" in table and "1.769 [" in lines["E34"]
    assert "[1] seed documents: E1 at d1280x6 for the 10-minute protocol, d1280x6. E1: range of runs" in table
    layer = lambda path: {"kernel_paths": {"layers": [{"layer": "L", "backend": "cuda", "forward": path}]},  # noqa: E731
                          "family": "matrix"}
    assert lb.kernel_flag(layer({"matrix.gated_op": "schedule"})) == "⚠"
    assert lb.kernel_flag(layer({"matrix.op": "warp"})) == "" and lb.kernel_flag(layer("pytorch")) == "?"
    closing = lb.markdown_table(b, lb.CLOSING)
    assert closing.splitlines()[0] == "| # | " + " | ".join(lb.CLOSING) + " |"


def test_seed_figures_read_the_data_file():
    e1 = lb.seed_figures("E1", ("d1280x6",))
    assert e1["loss"]["text"] == "1.41–1.43" and e1["tokens"]["text"] == "201,600–254,000"
    assert lb.seed_figures("E42", ("d1280x6", "d1536x6"))["tokens"]["text"] == "137,000"
    assert lb.seed_figures("E0", ("d1280x6",)) == {}


def test_seed_table_and_status(tmp_path):
    recs = [_record("E1", 1.90), _record("E1", 1.93, seed=43, gpu="NVIDIA H200"),
            _record("E0", 1.7, data=".cache/data/linux-6.1-200M.txt.xz")]
    (b, b100), others = _boards(tmp_path, recs)
    assert "| E1_d1280x6 | 1.9000 | 1.9300 | 0.0300 |" in lb.seed_table(b)
    assert lb.seed_table(b100) is None
    text = lb.status([b, b100], others)
    assert "**50M table**: 1 of 11 models measured; several seeds: E1_d1280x6 x2; not run yet: E0," in text
    assert "2 different GPUs" in text and "**100M table**: 0 of 33 models measured" in text
    assert "Pinned but in neither table: E0_d1280x6" in text


def test_findings_say_not_measured_yet_without_records():
    boards, _ = lb.boards([])
    found = claims.findings(boards)
    assert len(found) == 5 and all("not measured yet" in f for f in found)
    assert "E1 1.41–1.43" in found[0] and "E88 1.306 (d1920x17 H83 n32)" in found[-1]


def test_findings_from_records(tmp_path):
    recs = [_record("E1", 1.80), _record("E42", 1.85), _record("E37v2", 1.82), _record("E0", 1.95),
            _record("E88d_h12", 1.60, "100m"), _record("fla-gdn", 1.55, "100m"), _record("mamba2", 1.70, "100m"),
            _record("E68", 1.62, "100m"), _record("E67", 1.61, "100m", se=0.02)]
    boards, _ = _boards(tmp_path, recs)
    found = claims.findings(boards)
    e1_50, e1_100, e42, e68, e88 = found
    assert "holds among the 4 measured: E1_d1280x6 ranks first, 0.0200 bits/byte ahead of E37v2_d1280x6" in e1_50
    assert "beyond the evaluation noise" in e1_50 and "no model has two seeds yet" in e1_50
    assert "not run yet: E33, E34, E36, E39" in e1_50
    assert "not measured yet" in e1_100
    assert "does not hold among the 2 measured: E37v2_d1280x6 ranks first, E42_d1280x6 is number 2" in e42
    # E67 leads E68 by less than twice the gap's standard error: the claim is neither kept nor refuted
    assert "undecided among" in e68 and "E67_d1280x20 ranks first" in e68 and "within the evaluation noise" in e68
    assert "E88d_h12_d1280x20 at 1.6000 ± 0.0020 bits/byte is 0.0500 bits/byte behind fla-gdn_d1280x20" in e88
    assert "0.1000 bits/byte ahead of mamba2_d1280x20" in e88


def test_read_log_gives_training_minutes(tmp_path):
    rows = _write(tmp_path / "20270101T000000Z_abc_h100", [_record("E1", 1.9)])
    cols = training.read_log(tmp_path, rows[0])
    assert cols["elapsed_s"] == [1.0, 2.0, 3.0] and cols["val_step"] == [30]


def test_figures(tmp_path):
    recs = [_record("E1", 1.9), _record("E0", 1.95), _record("E88d_h12", 1.6, "100m")]
    boards, _ = _boards(tmp_path, recs)
    for fig in (plots.curves(boards[0], tmp_path), plots.scatter(boards), plots.per_source(boards[1])):
        assert fig is not None
        plt.close(fig)
    assert len(plots.scatter(boards).axes) == 2
    plt.close("all")
    empty, _ = lb.boards([])
    assert plots.curves(empty[0], tmp_path) is None and plots.scatter(empty) is None
    assert plots.per_source(empty[1]) is None


def test_a_fixed_path_baseline_recorded_as_pytorch_shows_its_library_path():
    from elman.baselines import mamba2

    assert lb.LIBRARY_PATHS == {"mamba2": mamba2.IMPL}
    row = {"level": "mamba2", "family": None, "kernels": "pytorch x6"}
    assert lb.kernels_text(row) == f"pytorch x6 (the record's label; the layer runs {mamba2.IMPL})"
    assert lb.kernels_text({**row, "kernels": f"{mamba2.IMPL} x6"}) == f"{mamba2.IMPL} x6"
    assert lb.kernels_text({**row, "level": "E1", "family": "dense"}) == "pytorch x6"
