"""The training-step memory probe (elman.training.memory) and its report lines."""
from __future__ import annotations

import argparse

import pytest
import torch

from elman.results import report
from elman.training import memory


def _rec(variant: str, peak: float, n: int) -> dict:
    return {"variant": variant, "params": {"measure": "lm_step", "dim": 64, "depth": 2, "expansion": 1.0,
                                          "n_params": n, "B": 2, "T": 8},
            "metrics": {"peak_mem_mb": peak, "step_ms": 3.0, "tokens_per_s": 5333.0}}


def test_memory_line_states_the_ratio_and_the_target():
    recs = [_rec("E88h83n32", 3000.0, 437_000_000), _rec("fla-gdn", 2500.0, 438_000_000)]
    line = report.lm_memory_line(recs, "E88h83n32", "fla-gdn", 1.5)
    assert "1.20x" in line and "met" in line and "not met" not in line
    line = report.lm_memory_line([_rec("E88h83n32", 4000.0, 1), _rec("fla-gdn", 2000.0, 1)],
                                 "E88h83n32", "fla-gdn", 1.5)
    assert "2.00x" in line and "not met" in line
    assert "No training-step records" in report.lm_memory_line(recs[:1], "E88h83n32", "fla-gdn", 1.5)


def test_step_table_has_a_row_per_record():
    table = report.lm_step_table([_rec("E1", 10.0, 1000), _rec("E0", 9.0, 900)])
    assert table.count("\n") == 3 and "| E0 |" in table and "1,000" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_step_record_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        memory.lm_step_record("E1", 64, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_step_record_measures_a_small_model():
    rec = memory.lm_step_record("E1", 256, 2, batch=2, seq=64, steps=3)
    assert rec["params"]["n_params"] > 0 and rec["metrics"]["peak_mem_mb"] > 0
    assert rec["metrics"]["step_ms"] > 0 and rec["impl"] == "lm:cuda"


def test_profile_categories_and_summary():
    from elman.training import profile

    assert profile.category("void persistent_forward<E1>(...)") == "recurrence"
    assert profile.category("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert profile.category("_layer_norm_fwd_1pass_kernel") == "norm"
    assert profile.category("void at::native::unrolled_elementwise_kernel<direct_copy>") == "copy and cast"
    assert profile.category("void at::native::vectorized_elementwise_kernel<mul>") == "elementwise and reductions"
    assert profile.category("mystery") == "other"
    rec = {"variant": "E1", "params": {"dim": 1280, "depth": 6, "expansion": 1.0, "B": 64, "T": 512},
           "metrics": {"phase_ms": {"forward": 10.0, "backward": 20.0, "clip": 1.0, "optimizer": 2.0, "step": 33.0},
                       "tokens_per_s": 993_000.0, "kernel_ms_total": 30.0,
                       "kernel_ms_by_category": {"recurrence": 12.0, "gemm": 18.0},
                       "largest_kernels_ms": [["gemm_a", 9.0]]}}
    text = profile.summary(rec)
    assert "33.0 ms a step, 993,000 tokens/s" in text and "gemm" in text and " 60.0 %" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_profile_needs_cuda():
    from elman.training import profile

    with pytest.raises(RuntimeError, match="CUDA"):
        profile.lm_profile_record("E1", 64, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_splits_a_small_model_step():
    from elman.training import profile

    rec = profile.lm_profile_record("e1", 256, 2, batch=2, seq=64, steps=3)
    assert (rec["variant"], rec["params"]["level"], rec["params"]["family"]) == ("E1", "e1", "dense")
    m = rec["metrics"]
    assert m["phase_ms"]["step"] > 0 and m["kernel_ms_total"] > 0 and m["largest_kernels_ms"]
    assert set(m["kernel_ms_by_category"]) <= {name for name, _ in profile.CATEGORIES} | {"other"}
    assert m["kernels"] == "dense.op:persistent x2" and len(m["kernel_paths"]["layers"]) == 2


def test_profile_reads_the_configurations_of_a_job_file(tmp_path):
    from elman.training import profile

    jobs = tmp_path / "t.jobs"
    jobs.write_text("# a comment\n"
                    "python3 -m elman train --level E42 --dim 1536 --depth 6 --batch 64 --minutes 10 --graph --name x\n"
                    "python3 -m elman train --level E88d_h12 --dim 640 --expansion 2.0 --depth 20 --seq 256 "
                    "--option use_gate=true --minutes 10 --resume auto  # trailing comment\n")
    assert profile.job_configs(jobs) == [("E42", 1536, 6, 1.0, 64, 512, {}),
                                         ("E88d_h12", 640, 20, 2.0, 32, 256, {"use_gate": True})]
    args = argparse.Namespace(jobs=[jobs, jobs], preset=None, option=[])
    assert profile.configs(args) == profile.job_configs(jobs)  # a model the files repeat runs once
    (tmp_path / "empty.jobs").write_text("# nothing\n")
    with pytest.raises(ValueError, match="no `python3 -m elman train` line"):
        profile.job_configs(tmp_path / "empty.jobs")
