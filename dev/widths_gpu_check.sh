#!/usr/bin/env bash
# The dense persistent path at every width on a GPU (H100, about 5 minutes): build the dense
# extension, run the width tests (with the wide design's edges at D = 1280 and its jitter
# check, which builds elman_dense_jitter) and the E63 persistent tests, then time the per-step
# forward of E1 on the persistent and graph paths at every multiple of 128 from 256 to 2048,
# B = 4, 16, 64, 128, with issue 20's committed numbers as PASS / MISS lines (D = 1280 runs
# the wide cluster design, lib/csrc/dense/wide.cuh).
#
#   PYTHONPATH=/tmp/site:$PWD/lib ELMAN_BUILD_DIR=/tmp/elman-build bash dev/widths_gpu_check.sh
#
# Output, in order: "== build" (build time), "== tests" (pytest's summary), "== latency" (one
# row per D: design, persistent / graph us a step per B, "-" where the size takes the graph
# path; then PASS / MISS lines and their count; then the wide forward at D = 1280 forced to 8
# and to 12 batch columns a cluster at B = 64 and 128; then the traced forward's phases at
# D = 1024 and 1280, B = 4 and 16, from the development extension). The table is also written
# to $OUT/widths_latency.json when OUT is set.
source "$(dirname "$0")/gpu_check.sh"
build dense dev

echo "== tests (pytest -m gpu tests/test_widths*.py, the persistent tests of test_e63_gpu.py)"
$PY -m pytest -q -m gpu -p no:cacheprovider tests/test_widths.py tests/test_widths_gpu.py \
  tests/test_e63_gpu.py -k "widths or persistent or auto" 2>&1 | tail -25

echo "== latency"
json=()
[ -n "${OUT:-}" ] && json=(--json "$OUT/widths_latency.json")
$PY dev/widths_latency.py --T 256 --reps 10 --batches 4 16 64 128 --trace "${json[@]}"
