#!/usr/bin/env bash
# Two clean builds: A = the committed cluster kernels (.dev/dp_head.cu: git show
# 6e50139:lib/csrc/dense_persistent.cu), B = that tree with s11a-interleave.patch (16
# batch columns as two interleaved groups of 8). Parity and jitter tests of B, bitwise
# comparisons (s11a.py), then A, B, A, B, each in its own process.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
for v in A B; do rm -rf /tmp/v$v && mkdir -p /tmp/v$v && cp -r lib .dev tests pyproject.toml /tmp/v$v/; done
cp .dev/dp_head.cu /tmp/vA/lib/csrc/dense_persistent.cu
t0=$SECONDS
for v in A B; do (cd /tmp/v$v && ELMAN_BUILD_DIR=/tmp/build-$v PYTHONPATH=/tmp/site:/tmp/v$v/lib python3 -c "from elman import ops; ops.load()") & done
wait
echo "builds: $((SECONDS - t0)) s"
run() { (cd /tmp/v$1 && ELMAN_BUILD_DIR=/tmp/build-$1 PYTHONPATH=/tmp/site:/tmp/v$1/lib python3 .dev/s11a.py $1 $2 2>&1 | grep -v Warn); }
(cd /tmp/vB && ELMAN_BUILD_DIR=/tmp/build-B PYTHONPATH=/tmp/site:/tmp/vB/lib timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_parity_gpu.py tests/test_jitter_gpu.py 2>&1 | tail -3)
echo "tests done: $((SECONDS - t0)) s"
run A 1; run B 1
python3 -c "
import torch
a, b = torch.load('/tmp/s11a_A.pt'), torch.load('/tmp/s11a_B.pt')
same = [k for k in a if torch.equal(a[k], b[k])]
print(f'bitwise A vs B: {len(a)} tensors compared, {len(same)} equal; differ:', sorted({k.split(\":\")[0] for k in a if k not in same}))"
run A 2; run B 2
echo "all: $((SECONDS - t0)) s"
