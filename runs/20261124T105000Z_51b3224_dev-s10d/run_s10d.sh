#!/usr/bin/env bash
# E2 of run s10c (expects spread over the warps, multicast by the last warp; finer trace marks)
# against F = E2 with the input staging's copies issued by the last warps. Bitwise
# comparison, then E2, F, E2, F.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
for v in E2 F; do rm -rf /tmp/v$v && mkdir -p /tmp/v$v && cp -r lib .dev tests pyproject.toml /tmp/v$v/; done
python3 .dev/s10c_patch.py /tmp/vE2/lib/csrc/dense_persistent.cu marks spread last
python3 .dev/s10c_patch.py /tmp/vF/lib/csrc/dense_persistent.cu marks spread last stagelast
for v in E2 F; do (cd /tmp/v$v && ELMAN_BUILD_DIR=/tmp/build-$v PYTHONPATH=/tmp/site:/tmp/v$v/lib python3 -c "from elman import ops; ops.load()") & done
wait
run() { (cd /tmp/v$1 && ELMAN_BUILD_DIR=/tmp/build-$1 PYTHONPATH=/tmp/site:/tmp/v$1/lib python3 .dev/s10c.py $1 $2 2>&1 | grep -v Warn); }
run E2 1; run F 1
python3 -c "
import torch
a, b = torch.load('/tmp/s10c_E2.pt'), torch.load('/tmp/s10c_F.pt')
bad = [k for k in a if not torch.equal(a[k], b[k])]
print(f'bitwise E2 vs F: {len(a)} tensors compared, {len(bad)} differ', bad)"
run E2 2; run F 2
