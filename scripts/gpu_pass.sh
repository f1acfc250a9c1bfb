#!/usr/bin/env bash
# One whole GPU pass on a host with no network: install the carried wheels, build the
# extension, run the GPU tests (parity of every variant), record parity and benchmarks,
# execute the chapters with papermill, optionally train, and pack everything into one
# archive under $OUT.
#
#   scripts/gpu_pass.sh [STAGE ...]      stages, run in the order named: setup build dev warm test parity bitwise gdn
#                                        diagonal headline widths lmprofile baselines bench sanitize
#                                        chapters preflight corpus train leaderboard pack (default:
#                                        all but dev, bitwise, diagonal, headline, widths, lmprofile,
#                                        baselines, preflight, corpus, train and leaderboard)
#   scripts/gpu_pass.sh setup build warm baselines pack     the baselines' run (issue 4) alone
#
# warm compiles, in parallel, the Triton kernels (mamba2, fla-gdn) of the stages that follow
# (`elman warm`); baselines = scripts/verify_gdn.py, the parity of the baselines and their
# layer benchmarks beside E1 (`elman bench --levels E1 <baselines> --no-cell`).
# Environment: OUT (where the archive goes; default ./out), ELMAN_COMMIT / ELMAN_DIRTY
# (the commit the tree is at, when the host has no .git or an outdated one; run.json records
# the sources' blob ids either way), ELMAN_RUN_DIR (default: a new
# runs/<UTC>_<commit>_<gpu>/), RUN_NOTE (what the run is for, into run.json), QUICK=1 (small
# benchmarks), TRAIN_JOBS (job file for preflight and train), CARRIED / CORPUS / CORPUS_WAIT (the corpus stage), PREFLIGHT_JOBS, PREFLIGHT_MODES (default trainer-graph), SCHED_ARGS (extra `elman sched` flags, e.g. --stop-after 22), TEST_FILES (GPU test paths; default tests),
# BENCH_ARGS (extra `elman bench` flags), WARM_ARGS (extra `elman warm` flags, e.g. -j 8), PROFILE_ARGS (lmprofile),
# CHAPTERS (names: only those chapters), BUILD (extensions to build first), PARITY_FAMILIES or PARITY_LEVELS, DEV_CHECKS (the dev stage's programs, dev/*_gpu_check.*:
# each runs with a DEV_LIMIT (default 420) s limit and logs into the run folder), STAGE_LIMIT / LIMIT_<stage>
# (seconds a stage may run before it is stopped and the pass goes on). scripts/gpu_session.sh runs a
# pass longer than one device call in the background and polls it. Carry .whl in every call.
# The corpus for train is the packed file that `elman data --pack 1200 --part-mb 40` writes
# (or `elman data --repart FILE.xz --part-mb 40`): carry .cache/data/debian-mix-1200M.txt.json
# and one part a call (.xz.000 ... .004): a call carries the tree and its carried paths, 64 MiB
# at most, and the host keeps what was carried while it stays warm. Stage corpus (before train)
# waits for the last part, so one pass can start with the first call:
#   gpu_session.sh start setup build test preflight corpus train   (then a call a part, then polls)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
STAGES=${*:-setup build warm test parity gdn bench sanitize chapters pack}
BASELINES="mamba2 fla-gdn gru lstm llama"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$ROOT/lib${PYTHONPATH:+:$PYTHONPATH}
export ELMAN_BUILD_DIR=${ELMAN_BUILD_DIR:-/tmp/elman-build}
LOG=$OUT/gpu_pass.log
failed=()

log() { echo "[gpu_pass $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
# stage NAME COMMAND...: run, log, remember failures, go on. LIMIT_<NAME> (or STAGE_LIMIT) in
# seconds stops a stage that runs longer (a hung kernel) and the pass goes on with the next.
stage() {
  local name=$1; shift
  local limit_var=LIMIT_$name
  local limit=${!limit_var:-${STAGE_LIMIT:-0}}
  local note=""; [ "$limit" != 0 ] && note=" (limit $limit s)"
  log "stage $name: $*$note"
  local t0=$SECONDS
  if timeout -k 20 "$limit" bash -c '"$@"' "$name" "$@" 2>&1 | tee -a "$LOG"; then
    log "stage $name ok ($((SECONDS - t0)) s)"
  else log "stage $name FAILED ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}
has() { [[ " $STAGES " == *" $1 "* ]]; }

if [ -z "${ELMAN_RUN_DIR:-}" ] && [ "$STAGES" = pack ]; then
  echo "gpu_pass.sh pack alone packs an earlier pass: set ELMAN_RUN_DIR to its run folder" >&2
  exit 2
fi
if [ -z "${ELMAN_RUN_DIR:-}" ]; then
  gpu=$(python3 -c "import torch,re;print(re.sub(r'[^A-Za-z0-9]+','-',torch.cuda.get_device_name()).strip('-').lower())")
  commit=${ELMAN_COMMIT:-unknown}
  export ELMAN_RUN_DIR=$ROOT/runs/$(date -u +%Y%m%dT%H%M%SZ)_${commit:0:7}_$gpu
fi
mkdir -p "$ELMAN_RUN_DIR"
# run.json: the note and the git blob ids of the sources this pass builds and runs
python3 -c "import json,sys; from elman.core import records
json.dump({'note': sys.argv[1], 'sources': records.source_blobs()}, open(sys.argv[2], 'w'), indent=1)" \
  "${RUN_NOTE:-}" "$ELMAN_RUN_DIR/run.json"
log "run dir $ELMAN_RUN_DIR"
log "git status (tracked files): $(git status --porcelain --untracked-files=no 2>&1 | head -20 | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee -a "$LOG"

setup() {
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || return 1
  fi
  python3 -m ipykernel install --user --name python3 > /dev/null 2>&1 || true
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
}
# Every extension (each kernel family's and the dev probes'; BUILD names fewer), built side by
# side in processes of their own: a family's compile error fails the stage but not the others'
# builds. An extension not built here is built on its first use.
build() {
  local ok=0 pids=() n
  for n in ${BUILD:-$(python3 -c "from elman.core import extension; print(' '.join(extension.NAMES))")}; do
    python3 -c "from elman.core import extension; extension.load('$n')" & pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n" || ok=1; done
  return $ok
}
# Parity of every registered level is the parity stage's job (it records) and the GDN check
# the gdn stage's; the GPU tests check everything else.
gpu_tests() {
  python3 -X faulthandler -m pytest -v -m gpu ${TEST_FILES:-tests} -p no:cacheprovider \
    -k "not test_variant_parity and not test_baseline_parity and not test_gdn_verification_passes"
}
# The groups of calls `elman warm` compiles for: those of the stages in this pass.
# Whether the bench stage times a baseline's layer: always, unless BENCH_ARGS names --levels
# without one (warming every baseline's benchmark shapes takes minutes).
bench_times_baselines() {
  [[ " ${BENCH_ARGS:-} " != *" --levels "* ]] && return 0
  local b; for b in $BASELINES; do [[ " ${BENCH_ARGS:-} " == *" $b "* ]] && return 0; done
  return 1
}
warm_stage() {
  local groups=()
  case " ${TEST_FILES:-tests} " in *" tests "*|*" tests/ "*|*baselines*|*bad_inputs*) has test && groups+=(tests);; esac
  { has gdn || has baselines; } && groups+=(verify)
  has baselines && groups+=(parity)  # the parity stage checks the variants only
  { has baselines || { has bench && bench_times_baselines; }; } && groups+=(bench)
  has chapters && [[ -z ${CHAPTERS:-} || $CHAPTERS == *baselines* ]] && groups+=(chapters)
  has chapters && [[ -z ${CHAPTERS:-} || $CHAPTERS == *e88* ]] && groups+=(e88)
  if [ ${#groups[@]} -eq 0 ]; then echo "warm: no stage of this pass runs the baselines' Triton kernels"; return 0; fi
  python3 -m elman warm --groups "${groups[@]}" ${WARM_ARGS:-}
}
# The variants only: the baselines' parity (Triton kernels to compile) is the baselines stage's.
# One process a kernel family (PARITY_FAMILIES, in that order), so that a family whose kernel
# fails or hangs keeps the others' records; PARITY_LEVELS names levels instead (one process).
parity_stage() {
  local ok=0 f
  [ -n "${PARITY_LEVELS:-}" ] && { python3 -m elman parity --levels $PARITY_LEVELS; return; }
  for f in ${PARITY_FAMILIES:-diagonal dense matrix twogemm}; do
    python3 -m elman parity --levels $(python3 -c "from elman import registry
print(' '.join(e.name for e in registry.entries('variant', '$f')))") || ok=1
  done
  return $ok
}
bench_stage() { python3 -m elman bench --primitives ${QUICK:+--quick} ${BENCH_ARGS:-}; }
# compute-sanitizer on the persistent kernels: memcheck through the op (Python, every D the
# dense kernels take), then racecheck from a plain CUDA program (scripts/sanitize_persistent.cu:
# the parity suites' persistent shapes, dense and low-rank). Under a Python process that has
# loaded torch, racecheck of CUDA 13.0 stops with an internal error on these kernels (seen on
# the H100 host); from the plain program it checks them. A hazard or an error fails the stage.
sanitize() {
  local cs; cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  "$cs" --tool memcheck --error-exitcode 1 python3 scripts/sanitize_persistent.py || return 1
  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -gencode=arch=compute_90a,code=sm_90a \
    -Ilib/csrc scripts/sanitize_persistent.cu lib/csrc/dense/persistent.cu lib/csrc/dense/steps.cu \
    lib/csrc/twogemm/persistent.cu -o /tmp/sanitize_persistent || return 1
  timeout 540 "$cs" --tool racecheck --racecheck-report hazard --error-exitcode 1 \
    /tmp/sanitize_persistent
}
# E0/E1 on the persistent path against the kernels of a previous commit, bit for bit: the
# sources of that commit in BEFORE_SRC (default .cache/before, made with
# `git archive COMMIT lib/csrc | tar -x -C .cache/before` and carried).
bitwise_stage() { python3 dev/dense_bitwise.py --before "${BEFORE_SRC:-.cache/before}" --label "${BEFORE_LABEL:-a62a39d}"; }
gdn_stage() { python3 scripts/verify_gdn.py; }
dev_stage() {  # a kernel's own check program, before its family's pass: each in DEV_CHECKS
  local ok=0 c
  for c in ${DEV_CHECKS:-}; do
    log "dev check $c"
    case $c in *.py) timeout "${DEV_LIMIT:-420}" python3 "$c";; *) timeout "${DEV_LIMIT:-420}" bash "$c";; esac \
      > "$ELMAN_RUN_DIR/$(basename "${c%.*}").log" 2>&1 || ok=1
    tail -n 30 "$ELMAN_RUN_DIR/$(basename "${c%.*}").log"
  done
  return $ok
}
# The diagonal family's bandwidth table (issue 21's shapes): every diagonal level, forward and
# backward against the copy bandwidth, FLA's HGRN kernels beside E61, T = 512 then T = 4096
# (DIAGONAL_T, DIAGONAL_D; DIAGONAL_LEVELS: fewer levels).
diagonal_stage() {
  local levels ok=0 T
  levels=${DIAGONAL_LEVELS:-$(python3 -c "from elman import registry; print(' '.join(e.name for e in registry.entries(family='diagonal')))")}
  for T in ${DIAGONAL_T:-512 4096}; do
    python3 -m elman bench --levels $levels --B 4 16 64 --D ${DIAGONAL_D:-1024 2048 4096} --T $T --no-layers \
      ${QUICK:+--quick} ${BENCH_ARGS:-} || ok=1
  done
  return $ok
}
# The recurrence benchmarks at the shapes the family issues commit to: the dense variants
# beside E1 at D = 1024; E88 at the 480M shape (B = 16, H = 83, n = v = 32, d = 1920) with the
# fla-gdn and mamba2 layers beside it; E23 at B = 4, D = 512, N = 8 and the low-rank variants
# at D = 512 and 1024, each beside E1's persistent step.
headline_stage() {
  local ok=0 q=${QUICK:+--quick}
  python3 -m elman bench --levels E1 E33 E36 E37 E38 E39 E42 E56 --B 4 16 64 --D 1024 --no-layers $q || ok=1
  python3 -m elman bench --levels E88h83n32 fla-gdn mamba2 --B 16 --D 1920 --T 512 $q || ok=1
  python3 -m elman bench --levels E1 E23 --B 4 --D 512 --no-layers $q || ok=1
  python3 -m elman bench --levels E1 E4 E66 --B 4 64 --D 512 1024 --no-layers $q || ok=1
  return $ok
}
# Issue 20's sweep: E1's forward step on the persistent kernels and the graph beside them at
# every 128-aligned width from 256 to 2048 (the Kernel engineering chapter's latency-vs-width plot).
widths_stage() {
  python3 -m elman bench --levels E1 --B ${WIDTHS_B:-4 16 64} --D $(seq -s ' ' 256 128 2048) --T 512 \
    --no-layers ${QUICK:+--quick}
}
# Issue 20's training-step profile: E0, E1, E42 at d1280 x 6 (B 64) and E1 at the 100M shape,
# each as the trainer steps, without host reads and replayed from a CUDA graph, in two setups:
# `after` (the model elman train builds) and `before` (batch-major residual stream, strided GEMM
# inputs, three spectral-norm iterations a forward under autocast) (records 'lm_profile').
lmprofile_stage() { python3 -m elman.training.profile --preset issue20 --record ${PROFILE_ARGS:-}; }
baselines_stage() {  # fla-gdn verified, then every baseline's parity, then their layers beside E1
  local ok=0
  python3 scripts/verify_gdn.py || ok=1
  python3 -m elman parity --levels $BASELINES || ok=1
  python3 -m elman bench --levels E1 $BASELINES --no-cell ${QUICK:+--quick} ${BENCH_ARGS:-} || ok=1
  return $ok
}
chapters() {  # chapters [NAME ...]: those of the TOC whose file name contains a NAME
  local ok=0
  # torch's notice on a backward in a fresh thread names the host's site-packages path
  export PYTHONWARNINGS="ignore:Attempting to run cuBLAS:UserWarning"
  for nb in $(python3 -c "import yaml;t=yaml.safe_load(open('_toc.yml'));print(' '.join(c['file'] for p in t.get('parts',[t]) for c in p.get('chapters',[])))"); do
    nb=${nb%.ipynb}.ipynb
    [ -f "$nb" ] || continue
    if [ $# -gt 0 ]; then local hit=0; for n in "$@"; do [[ $nb == *$n* ]] && hit=1; done; [ $hit = 1 ] || continue; fi
    log "papermill $nb"
    python3 -m papermill "$nb" "$nb" -k python3 -p quick False -p device cuda \
      --cwd "$(dirname "$nb")" || ok=1
    python3 scripts/tag_chapters.py "$nb" || ok=1
  done
  return $ok
}
# Before a round of 10-minute runs: every job's model as elman train --graph builds and steps it,
# on random bytes (kernel paths, capture, tokens/s; records 'lm_profile'). PREFLIGHT_JOBS: job
# files (default TRAIN_JOBS), e.g. both tables' at once.
preflight_stage() {
  python3 -m elman.training.profile --jobs ${PREFLIGHT_JOBS:-${TRAIN_JOBS:-scripts/train_50m.jobs}} \
    --setup after --mode ${PREFLIGHT_MODES:-trainer-graph} --steps 5 --brief --record
}
# The packed corpus for train, carried one part a device call while earlier stages run: waits
# (at most CORPUS_WAIT s, default 900) for every part of CORPUS (default
# .cache/data/debian-mix-1200M.txt.xz) in CARRIED (the checkout the calls sync; gpu_session.sh
# start sets it; default this tree), then copies the manifest and the parts into this tree.
corpus_stage() {
  local xz=${CORPUS:-.cache/data/debian-mix-1200M.txt.xz}
  python3 -m elman data --collect "${CARRIED:-$ROOT}/$xz" --out "$ROOT/$(dirname "$xz")" --wait "${CORPUS_WAIT:-900}"
}
train_stage() { python3 -m elman sched "${TRAIN_JOBS:-scripts/train_50m.jobs}" --log-dir "$ELMAN_RUN_DIR/sched" ${SCHED_ARGS:-}; }
leaderboard() { chapters training_protocol leaderboard; }
pack() {
  tar czf "$OUT/run.tgz" -C "$ROOT" "$(realpath --relative-to="$ROOT" "$ELMAN_RUN_DIR")" book/chapters
  ls -la "$OUT"
}

# The stages run in the order they are named.
declare -A FN=([setup]=setup [build]=build [dev]=dev_stage [warm]=warm_stage [test]=gpu_tests
  [parity]=parity_stage [bitwise]=bitwise_stage [gdn]=gdn_stage [diagonal]=diagonal_stage
  [headline]=headline_stage [widths]=widths_stage [lmprofile]=lmprofile_stage
  [baselines]=baselines_stage [bench]=bench_stage
  [sanitize]=sanitize [chapters]=chapters [preflight]=preflight_stage [corpus]=corpus_stage [train]=train_stage
  [leaderboard]=leaderboard [pack]=pack)
export -f "${FN[@]}" log has bench_times_baselines
export LOG ROOT OUT STAGES BASELINES
for s in $STAGES; do
  if [ -z "${FN[$s]:-}" ]; then log "unknown stage $s"; failed+=("$s"); continue; fi
  if [ "$s" = chapters ]; then stage chapters chapters ${CHAPTERS:-}; else stage "$s" "${FN[$s]}"; fi
done
log "done; failed stages: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
