#!/usr/bin/env bash
# The Python wheels the GPU host lacks for the baselines, into .whl/ (git-ignored).
#
# The host (KINDS.md: python 3.12, torch 2.11 + CUDA 13, triton 3.6.0, transformers 5.17.0,
# huggingface_hub, einops, packaging) cannot download. It needs:
#   mamba-ssm 2.3.2.post1      built here as a pure-Python wheel (no CUDA extension; the
#                              compiled Mamba1 scan it imports is answered by elman.mamba)
#   flash-linear-attention 0.6.0 and fla-core 0.6.0   pure-Python wheels from PyPI
# Every other dependency of these three that elman's paths import is on the host already.
#
# Run here:  bash scripts/build_baseline_wheels.sh          (uses .venv, which has torch)
# On the host (carry [".whl"]):
#   python3 -m pip install --no-deps --no-index .whl/*.whl   (or the --target form of
#   scripts/fetch_wheels.sh, which installs every wheel of .whl/)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import torch" || { echo "building mamba-ssm needs torch importable by $PY" >&2; exit 1; }
mkdir -p .whl
# only this script's own wheels are replaced; other wheels in .whl/ (scripts/fetch_wheels.sh) stay
rm -f .whl/mamba_ssm-*.whl .whl/flash_linear_attention-*.whl .whl/fla_core-*.whl
# MAMBA_FORCE_BUILD: build locally instead of looking for a prebuilt CUDA wheel to download;
# MAMBA_SKIP_CUDA_BUILD: no extension, so the wheel is py3-none-any.
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
  "$PY" -m pip wheel --no-build-isolation --no-deps --no-cache-dir mamba-ssm==2.3.2.post1 -w .whl
"$PY" -m pip download --no-deps --only-binary=:all: flash-linear-attention==0.6.0 fla-core==0.6.0 -d .whl
for w in .whl/mamba_ssm-*.whl .whl/flash_linear_attention-*.whl .whl/fla_core-*.whl; do
  case "$w" in *-py3-none-any.whl) ls -l "$w" ;; *) echo "not a pure-Python wheel: $w" >&2; exit 1 ;; esac
done
