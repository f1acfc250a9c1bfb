#!/usr/bin/env bash
# The two-GEMM family on a GPU (H100, about 7 minutes): build the twogemm and dense
# extensions (in parallel), run the family's GPU tests of the persistent kernels (low-rank and
# E23), paths and auto, then time E4, E5, E66, E67lr, E23 (N = 8) and E23n32 beside E1 on
# every path at (B, D) = (4, 512), (64, 512), (4, 1024), (64, 1024) with issue 24's targets as
# PASS / MISS (E23: forward <= 3 us and <= 3x E1 at B = 4, D = 512, backward <= 2.5x forward).
#
#   PYTHONPATH=/tmp/site:$PWD/lib ELMAN_BUILD_DIR=/tmp/elman-build bash dev/twogemm_gpu_check.sh
#
# Output, in order: "== build" (build time), "== tests" (pytest's summary), "== trace" (median
# ns of each phase of a low-rank forward step, dev/twogemm_trace.py), "== latency" (one
# row per variant and size: forward / forward + backward us a step on each path, auto with the
# path it took; then PASS / MISS / INFO lines and their count). The rows are also written to
# $OUT/twogemm_latency.json when OUT is set.
source "$(dirname "$0")/gpu_check.sh"
build twogemm dense

echo "== tests (pytest -m gpu tests/test_twogemm_gpu.py: persistent, paths, auto, stages)"
timeout 180 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_twogemm_gpu.py \
  -k "persistent or paths or auto or stage_kernels" 2>&1 | tail -25

echo "== trace (low-rank forward phases)"
timeout 120 $PY dev/twogemm_trace.py --T 256

echo "== latency"
json=()
[ -n "${OUT:-}" ] && json=(--json "$OUT/twogemm_latency.json")
timeout 330 $PY dev/twogemm_latency.py --T 256 --reps 10 "${json[@]}"
