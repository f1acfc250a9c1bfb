#!/usr/bin/env bash
# A = HEAD, G = HEAD with s10e_patch.py on dense_grid.cu. Jitter and parity tests of G, bitwise
# comparison, then A, G, A, G.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
for v in A G; do rm -rf /tmp/v$v && mkdir -p /tmp/v$v && cp -r lib .dev tests pyproject.toml /tmp/v$v/; done
python3 .dev/s10e_patch.py /tmp/vG/lib/csrc/dense_grid.cu
for v in A G; do (cd /tmp/v$v && ELMAN_BUILD_DIR=/tmp/build-$v PYTHONPATH=/tmp/site:/tmp/v$v/lib python3 -c "from elman import ops; ops.load()") & done
wait
run() { (cd /tmp/v$1 && ELMAN_BUILD_DIR=/tmp/build-$1 PYTHONPATH=/tmp/site:/tmp/v$1/lib python3 .dev/s10e.py $1 $2 2>&1 | grep -v Warn); }
(cd /tmp/vG && ELMAN_BUILD_DIR=/tmp/build-G PYTHONPATH=/tmp/site:/tmp/vG/lib timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_parity_gpu.py tests/test_jitter_gpu.py 2>&1 | tail -3)
run A 1; run G 1
python3 -c "
import torch
a, b = torch.load('/tmp/s10e_A.pt'), torch.load('/tmp/s10e_G.pt')
bad = [k for k in a if not torch.equal(a[k], b[k])]
print(f'bitwise A vs G: {len(a)} tensors compared, {len(bad)} differ', bad)"
run A 2; run G 2
