#!/usr/bin/env bash
# A/B on one machine, clean builds: A = HEAD's cluster kernels (.dev/dp_head.cu), B = this tree
# (the multiply's B fragments by ldmatrix). Bitwise comparison of the outputs, then A, B, A, B.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
rm -rf /tmp/va && mkdir -p /tmp/va && cp -r lib .dev /tmp/va/ && cp .dev/dp_head.cu /tmp/va/lib/csrc/dense_persistent.cu
diff /tmp/va/lib/csrc/dense_persistent.cu lib/csrc/dense_persistent.cu | head -60
(cd /tmp/va && ELMAN_BUILD_DIR=/tmp/build-a PYTHONPATH=/tmp/site:/tmp/va/lib python3 -c "from elman import ops; ops.load()") &
ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:$PWD/lib python3 -c "from elman import ops; ops.load()" &
wait
A() { (cd /tmp/va && ELMAN_BUILD_DIR=/tmp/build-a PYTHONPATH=/tmp/site:/tmp/va/lib python3 .dev/s10a.py A $1 2>&1 | grep -v Warn); }
B() { ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:$PWD/lib python3 .dev/s10a.py B $1 2>&1 | grep -v Warn; }
A 1; B 1
python3 -c "
import torch
a, b = torch.load('/tmp/s10a_A.pt'), torch.load('/tmp/s10a_B.pt')
bad = [k for k in a if not torch.equal(a[k], b[k])]
print(f'bitwise: {len(a)} tensors compared, {len(bad)} differ', bad[:10])"
B_parity() { ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:$PWD/lib python3 -m pytest -q -p no:cacheprovider tests/test_parity_gpu.py 2>&1 | tail -3; }
B_parity
A 2; B 2
