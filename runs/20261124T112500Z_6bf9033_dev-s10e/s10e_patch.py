"""Dev-only patch of lib/csrc/dense_grid.cu for run s10e: the grid design's per-step chores
off warp 0 (the input copies from the last threads; the partial-sum count and wait and the
publish's release by lane 0 of the last warp instead of thread 0)."""
import sys
path = sys.argv[1]
s = open(path).read()


def rep(old, new, n=1):
    global s
    assert s.count(old) == n, old
    s = s.replace(old, new)


rep("    for (int c = threadIdx.x; !skip && c < kIn * kChunks; c += kThreads) {",
    "    for (int c = kThreads - 1 - int(threadIdx.x); !skip && c < kIn * kChunks; c += kThreads) {")
rep("    if (threadIdx.x == 0) {  // the block barrier, then a release at GPU scope: every",
    "    if (int(threadIdx.x) == kThreads - 32) {  // the block barrier, then a release at GPU scope: every")
rep("""    __syncthreads();
    if (threadIdx.x == 0) {
      count_release(&p.counters[r]);""", """    __syncthreads();
    if (int(threadIdx.x) == kThreads - 32) {
      count_release(&p.counters[r]);""")
open(path, "w").write(s)
print(path, "patched")
