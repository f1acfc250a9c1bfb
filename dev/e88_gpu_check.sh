#!/usr/bin/env bash
# E88 / E75 kernels on a GPU in one command (run from the repository root with
# PYTHONPATH=/tmp/site:$PWD/lib): build the matrix extension, run the matrix GPU tests, the
# parity of the E88 / E75 levels, and time the recurrence at the seed study's 480M shape with
# the floor numbers measured beside it (the warp kernels, the default at n = v <= 32, beside the
# tiled and column-group kernels).
source "$(dirname "$0")/gpu_check.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader || true
build matrix dev
echo "== GPU tests"
$PY -m pytest -q -x -m gpu tests/test_matrix_gpu.py -k "schedule or memory or unsupported or fully_written or autocast or warp" 2>&1 | tail -15
echo "== parity"
$PY -m elman parity --levels E88 E88h83n32 E88h8n64 E88f_h32n16 E75 E75h4n32 2>&1 | tail -40
echo "== recurrence at the 480M shape"
$PY dev/e88_bench.py --K 16 8
echo "== every supported (n, v), both layouts"
$PY -m pytest -q -m gpu tests/test_matrix_gpu.py -k "every_supported_pair or e75_core" 2>&1 | tail -8
