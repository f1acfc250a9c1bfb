#!/usr/bin/env bash
# A/B on one machine, clean builds: A = HEAD's cluster kernels (.dev/dp_head.cu), B = this tree
# (the forward's outputs through a shared-memory outbox, written as 16-byte stores).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
rm -rf /tmp/va && mkdir -p /tmp/va && cp -r lib .dev /tmp/va/ && cp .dev/dp_head.cu /tmp/va/lib/csrc/dense_persistent.cu
diff /tmp/va/lib/csrc/dense_persistent.cu lib/csrc/dense_persistent.cu | head -80
(cd /tmp/va && ELMAN_BUILD_DIR=/tmp/build-a PYTHONPATH=/tmp/site:/tmp/va/lib python3 -c "from elman import ops; ops.load()") &
ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:$PWD/lib python3 -c "from elman import ops; ops.load()" &
wait
A() { (cd /tmp/va && ELMAN_BUILD_DIR=/tmp/build-a PYTHONPATH=/tmp/site:/tmp/va/lib python3 .dev/s9c.py A 2>&1 | grep -v Warn); }
B() { ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:$PWD/lib python3 .dev/s9c.py B 2>&1 | grep -v Warn; }
B_parity() { ELMAN_BUILD_DIR=/tmp/build-b PYTHONPATH=/tmp/site:$PWD/lib python3 -m pytest -q -p no:cacheprovider tests/test_parity_gpu.py 2>&1 | tail -2; }
B_parity
for i in 1 2; do A; B; done
