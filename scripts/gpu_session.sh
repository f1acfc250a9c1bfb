#!/usr/bin/env bash
# A GPU pass longer than one device call (10 minutes): start it in the background on a copy of
# the tree, then poll it with later calls, each bringing back what the pass has written so far.
#
#   bash scripts/gpu_session.sh start [STAGE ...]   copy the tree to $WORK (default /tmp/p) and
#                                                   start scripts/gpu_pass.sh STAGE... there,
#                                                   detached; the environment (ELMAN_COMMIT,
#                                                   TEST_FILES, CHAPTERS, ...) passes through
#   bash scripts/gpu_session.sh start FILE.sh       the same with a plan: a bash file of several
#                                                   gpu_pass.sh calls, each with its own
#                                                   environment and run folder, run in order
#   bash scripts/gpu_session.sh poll [SECONDS]      wait until the passes end or SECONDS pass
#                                                   (default 540), print the stage lines, and
#                                                   pack the run folders, the chapters and the
#                                                   log into $OUT/pass.tgz
#
# The copy matters: each device call re-syncs the repository's own tree, which would change
# files under a running pass. A warm host is given back 30 s after a call ends, so the next
# poll must follow at once; a pass that ended is packed by the poll that sees it end.
set -uo pipefail
WORK=${WORK:-/tmp/p}
verb=${1:-poll}; shift || true

case $verb in
  start)
    export CARRIED=$PWD  # where later calls' carried files land (gpu_pass.sh's corpus stage)
    rm -rf "$WORK" && mkdir -p "$WORK/out" && cp -a . "$WORK/"
    cd "$WORK" || exit 1
    if [ -f "${1:-}" ]; then cmd=(bash "$1"); else cmd=(bash scripts/gpu_pass.sh "$@"); fi
    OUT=$WORK/out setsid nohup bash -c '"$@"; echo "[gpu_session] all passes ended"' session "${cmd[@]}" \
      > "$WORK/out/console.log" 2>&1 < /dev/null &
    echo "started ${cmd[*]} in $WORK (pid $!)"
    ;;
  poll)
    limit=${1:-540}
    log=$WORK/out/gpu_pass.log
    for ((t = 0; t < limit; t += 5)); do
      grep -q "^\[gpu_session\] all passes ended" "$WORK/out/console.log" 2>/dev/null && break
      sleep 5
    done
    grep -a "^\[gpu_pass" "$log" 2>/dev/null | tail -40
    tail -c 2000 "$WORK/out/console.log" 2>/dev/null | tr '\r' '\n' | tail -8
    runs=$(grep -ao "run dir .*" "$log" 2>/dev/null | cut -c9- | sed "s|^$WORK/||")
    if [ -n "${OUT:-}" ] && [ -n "$runs" ]; then
      tar czf "$OUT/pass.tgz" -C "$WORK" $runs book/chapters out/gpu_pass.log 2>/dev/null
      ls -la "$OUT"
    fi
    ;;
  *) echo "usage: gpu_session.sh start [STAGE ...] | poll [SECONDS]" >&2; exit 2 ;;
esac
