#!/usr/bin/env bash
# A/B on one machine, clean builds: B = the ldmatrix commit's cluster kernels (.dev/dp_b.cu),
# C = this tree (early slices: own slice written locally, bulk copies from shared memory to
# three peers, the multicast to the rest). Parity and the jitter test of C, then B, C, B, C.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
rm -rf /tmp/vb && mkdir -p /tmp/vb && cp -r lib .dev /tmp/vb/ && cp .dev/dp_b.cu /tmp/vb/lib/csrc/dense_persistent.cu
diff /tmp/vb/lib/csrc/dense_persistent.cu lib/csrc/dense_persistent.cu | wc -l
(cd /tmp/vb && ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:/tmp/vb/lib python3 -c "from elman import ops; ops.load()") &
ELMAN_BUILD_DIR=/tmp/build-c PYTHONPATH=/tmp/site:$PWD/lib python3 -c "from elman import ops; ops.load()" &
wait
B() { (cd /tmp/vb && ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:/tmp/vb/lib python3 .dev/s10a.py B $1 2>&1 | grep -v Warn); }
C() { ELMAN_BUILD_DIR=/tmp/build-c PYTHONPATH=/tmp/site:$PWD/lib python3 .dev/s10a.py C $1 2>&1 | grep -v Warn; }
ELMAN_BUILD_DIR=/tmp/build-c PYTHONPATH=/tmp/site:$PWD/lib timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_parity_gpu.py tests/test_jitter_gpu.py 2>&1 | tail -4
B 1; C 1
python3 -c "
import torch
a, b = torch.load('/tmp/s10a_B.pt'), torch.load('/tmp/s10a_C.pt')
bad = [k for k in a if not torch.equal(a[k], b[k])]
print(f'bitwise B vs C: {len(a)} tensors compared, {len(bad)} differ', bad)
for k in bad: print(k, ((a[k].float() - b[k].float()).norm() / b[k].float().norm()).item())"
B 2; C 2
