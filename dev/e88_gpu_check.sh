#!/usr/bin/env bash
# E88 / E75 kernels on a GPU in one command (run from the repository root with
# PYTHONPATH=/tmp/site:$PWD/lib): build the matrix and development extensions, run the matrix
# GPU tests, the parity of the E88 / E75 levels, and time the recurrence at the seed study's 480M
# shape on every layout (the warp kernels, their cp.async ring, the tiled kernels, the column
# groups), each also with the backward's slots set, with the floor measured beside it.
source "$(dirname "$0")/gpu_check.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader || true
build matrix dev
echo "== GPU tests"
$PY -m pytest -q -x -m gpu tests/test_matrix_gpu.py -k "schedule or memory or unsupported or fully_written or autocast or warp or ring" 2>&1 | tail -15
echo "== parity"
$PY -m elman parity --levels E88 E88h83n32 E88h8n64 E88f_h32n16 E75 E75h4n32 2>&1 | tail -40
echo "== recurrence at the 480M shape"
$PY dev/e88_bench.py --K 16 8
echo "== every supported (n, v), both layouts"
$PY -m pytest -q -m gpu tests/test_matrix_gpu.py -k "every_supported_pair or e75_core" 2>&1 | tail -8
