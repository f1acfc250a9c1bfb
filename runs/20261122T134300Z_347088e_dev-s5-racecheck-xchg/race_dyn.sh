#!/usr/bin/env bash
cd "$(dirname "$0")"
nvcc -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -o /tmp/xp xchg_probe.cu || exit 1
/tmp/xp 71 200; PROBE_SMEM=150000 /tmp/xp 71 200
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "=== racecheck variant 71 (dynamic, 40 KB)"
timeout 150 $cs --tool racecheck --racecheck-report hazard /tmp/xp 71 16 2>&1 | grep -v "^  " | tail -5
echo "=== racecheck variant 71 (dynamic, 150000 bytes)"
PROBE_SMEM=150000 timeout 150 $cs --tool racecheck --racecheck-report hazard /tmp/xp 71 16 2>&1 | grep -v "^  " | tail -5
