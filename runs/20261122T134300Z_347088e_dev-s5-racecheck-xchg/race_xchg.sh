#!/usr/bin/env bash
# racecheck on the exchange probe's variants (few rounds: racecheck is slow).
cd "$(dirname "$0")"
nvcc -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -o /tmp/xp xchg_probe.cu || exit 1
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in 0 1 4 5 7 31; do
  echo "=== racecheck variant $v"
  timeout 120 $cs --tool racecheck --racecheck-report hazard /tmp/xp $v 24 2>&1 | grep -v "^  " | tail -6
done
