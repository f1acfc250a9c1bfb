"""`torchrun --nproc_per_node 2 -m elman train`: one model, data-parallel over two GPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from elman.training import train
from elman.training.data import TEST_SLICE

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs 2 CUDA GPUs")]

# NVLink multicast stays off on shared hosts (see the GPU host's notes).
ENV = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
       "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "4"}


def test_two_gpus_train_one_model(tmp_path):
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "elman", "train", "--level", "E1", "--dim", "256", "--depth", "2", "--batch", "16",
           "--seq", "256", "--lr", "2e-3", "--warmup", "20", "--steps", "60", "--log-every", "10",
           "--val-every", "30", "--val-windows", "32", "--data", str(TEST_SLICE),
           "--runs-dir", str(runs), "--checkpoint-dir", str(ckpt), "--name", "ddp"]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rec = json.loads((runs / "records.jsonl").read_text())
    assert rec["metrics"]["world_size"] == 2
    assert rec["metrics"]["tokens"] == 60 * 16 * 256 * 2
    assert rec["params"]["backend"] == "cuda" and rec["params"]["norm"] == "elman"
    assert rec["metrics"]["peak_memory_mb"] > 0
    log = [json.loads(x) for x in (runs / "train" / "ddp" / "log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if e["kind"] == "train"]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert train.load_checkpoint(ckpt)["step"] == 60
    # each rank drew its own windows: rank 1's stream differs from rank 0's
    from elman.training.data import ByteData
    d = ByteData(TEST_SLICE)
    assert not (d.train_positions(0, 16, 256, 42, 0) == d.train_positions(0, 16, 256, 42, 1)).all()
