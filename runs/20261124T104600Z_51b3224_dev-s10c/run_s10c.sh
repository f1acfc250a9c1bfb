#!/usr/bin/env bash
# Three clean builds of the committed cluster kernels, each with the finer trace marks
# (s10c_patch.py marks; the untraced kernels are unchanged): B as committed, E1 with the
# expects spread over the warps, E2 also with the multicast issued by the last warp. Bitwise
# comparison, parity and jitter test of E2, then B, E1, E2, B, E1, E2.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
for v in B E1 E2; do rm -rf /tmp/v$v && mkdir -p /tmp/v$v && cp -r lib .dev tests pyproject.toml /tmp/v$v/; done
python3 .dev/s10c_patch.py /tmp/vB/lib/csrc/dense_persistent.cu marks
python3 .dev/s10c_patch.py /tmp/vE1/lib/csrc/dense_persistent.cu marks spread
python3 .dev/s10c_patch.py /tmp/vE2/lib/csrc/dense_persistent.cu marks spread last
for v in B E1 E2; do (cd /tmp/v$v && ELMAN_BUILD_DIR=/tmp/build-$v PYTHONPATH=/tmp/site:/tmp/v$v/lib python3 -c "from elman import ops; ops.load()") & done
wait
run() { (cd /tmp/v$1 && ELMAN_BUILD_DIR=/tmp/build-$1 PYTHONPATH=/tmp/site:/tmp/v$1/lib python3 .dev/s10c.py $1 $2 2>&1 | grep -v Warn); }
(cd /tmp/vE2 && ELMAN_BUILD_DIR=/tmp/build-E2 PYTHONPATH=/tmp/site:/tmp/vE2/lib timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_parity_gpu.py tests/test_jitter_gpu.py 2>&1 | tail -3)
run B 1; run E1 1; run E2 1
python3 -c "
import torch
a = torch.load('/tmp/s10c_B.pt')
for v in ('E1', 'E2'):
    b = torch.load(f'/tmp/s10c_{v}.pt')
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    print(f'bitwise B vs {v}: {len(a)} tensors compared, {len(bad)} differ', bad)"
run B 2; run E1 2; run E2 2
