#!/usr/bin/env bash
# The diagonal family on a GPU in about 3 minutes: build the extension, run the family's GPU
# tests, then time every step of the table at issue 21's point (B = 64, D = 2048, T = 512,
# bf16; >= 60 % of the measured copy bandwidth forward and backward) with the launcher's width
# and every other width, then the fp32 kernels at the launcher's width.
#
#   PYTHONPATH=/tmp/site:$PWD/lib bash dev/diagonal_gpu_check.sh      (from the repository root)
#
# Output, in order: "== build" (the extension's build time), "== tests" (pytest's summary
# line), "== bandwidth bf16" (one row a step and width: ms, GB/s and % of the copy forward and
# backward, the launch as elements-per-thread x threads x blocks; then PASS / MISS a step and a
# summary line), "== bandwidth fp32" (the same at the launcher's width).
source "$(dirname "$0")/gpu_check.sh"
build diagonal

echo "== tests (pytest -m gpu tests/test_diagonal*.py)"
$PY -m pytest -q -m gpu -p no:cacheprovider tests/test_diagonal.py tests/test_diagonal_gpu.py 2>&1 | tail -25

echo "== bandwidth bf16, B=64 D=2048 T=512 (auto width and every other width)"
$PY dev/diagonal_bandwidth.py --B 64 --D 2048 --T 512 --widths --reps 15

echo "== bandwidth fp32, B=64 D=2048 T=512 (auto width)"
$PY dev/diagonal_bandwidth.py --B 64 --D 2048 --T 512 --fp32 --reps 10
