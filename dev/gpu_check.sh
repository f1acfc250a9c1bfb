# Sourced by the dev/*_gpu_check.sh programs: the repository root as working folder, the
# environment they share, and `build FAMILY...`, which builds those extensions side by side and
# stops the check if one fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
export ELMAN_BUILD_DIR=${ELMAN_BUILD_DIR:-/tmp/elman-build}
PY=${PYTHON:-python3}
# Records (parity, benchmarks) go under $OUT when a device call collects it, else to runs/.
[ -n "${OUT:-}" ] && export ELMAN_RUN_DIR=${ELMAN_RUN_DIR:-$OUT/run}

build() {
  echo "== build"
  local start=$SECONDS pids=() f ok=1
  for f in "$@"; do
    $PY -c "from elman.core import extension; extension.load('$f', verbose=False); print('elman_$f built')" &
    pids+=($!)
  done
  for f in "${pids[@]}"; do wait "$f" || ok=0; done
  [ $ok = 1 ] || { echo "BUILD FAILED: rerun with extension.load(NAME, verbose=True) for the compiler's output"; exit 1; }
  echo "build: $((SECONDS - start)) s"
}
