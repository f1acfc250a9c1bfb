#!/usr/bin/env bash
# Download into .whl/ (git-ignored) the wheels that the GPU host lacks, as listed in
# scripts/gpu_wheels.txt: cp312 manylinux x86_64 or pure-python wheels, no dependencies
# (the list is the whole closure). glibc 2.28 wheels at most; pure-python ones where a
# package has no such build (debugpy). Run on a machine with PyPI; carry .whl/ to the host and
# install there with:
#   python3 -m pip install --no-deps --no-index --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LIST=scripts/gpu_wheels.txt
OUT=.whl

mkdir -p "$OUT"
rm -f "$OUT"/*.whl
mapfile -t reqs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$LIST" | grep -v '^$')
for req in "${reqs[@]}"; do
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$OUT" "$req"
done

# One wheel per listed package, nothing else.
count=$(find "$OUT" -maxdepth 1 -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#reqs[@]}" ]; then
  echo "fetch_wheels: $count wheels in $OUT for ${#reqs[@]} listed packages" >&2
  exit 1
fi

# Baselines: mamba-ssm as a pure-python wheel (no binary wheel exists) and
# flash-linear-attention 0.6.0 with fla-core.
PYTHON=${VENV_PYTHON:-.venv/bin/python} bash "$(dirname "$0")/build_baseline_wheels.sh"
count=$(find "$OUT" -maxdepth 1 -type f -name '*.whl' | wc -l)
echo "fetch_wheels: $count wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
