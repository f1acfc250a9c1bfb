// Persistent kernels of the dense family at D = 2048 (bf16, sm_90): the grid design.
//
// W_h (8 MiB of bf16) does not fit in one cluster, and at most 30 clusters of 4, 15 of 8 or
// 7 of 16 CTAs fit on an H100 at once (run dev-s6-occupancy), so this design uses no
// clusters: 128 CTAs, all resident (a cooperative launch guarantees it), hold W_h (forward)
// or W_h^T (backward) in registers for the whole sequence. CTA c owns the 64 rows
// [64 r, 64 r + 64) (r = c / 4) and the quarter q = c % 4 of the columns, [512 q, 512 q + 512):
// a 64 x 512 tile, held by 16 warps in a 2 x 8 grid as mma.sync A fragments (32 registers a
// thread). A step crosses L2 twice, each time with no flag and no fence: every 8-byte word
// exchanged carries its own tag (the step it belongs to) beside 4 bytes of data, written and
// read as one single-copy-atomic 64-bit access, so a reader that sees the tag has the data
// (the low-latency protocol of NCCL's LL transport). Per step:
//   1. state: the tile's columns are the state of row blocks 8q .. 8q + 7; the two warps of
//      column group k load block 8q + k (pairs of bf16 with their tag) from its global slot,
//      re-reading a word until its tag is the step's, into shared memory, and multiply as
//      soon as their block is in (mma.m16n8k16, fp32 accumulate);
//   2. partial sums: the CTA sums its 8 column groups and writes its 64 x bc fp32 partial
//      product (each value with its tag) to global memory;
//   3. reduce and epilogue: CTA (r, q) finishes rows [64 r + 16 q, + 16) of the step: it reads
//      the four partials of those rows as they arrive, adds them in the order q = 0..3 (the
//      same sum on every run), applies the epilogue functor of dense_cell.cuh, and writes its
//      rows of the new state into row block r's slot, then stores the step's outputs.
// The slots and the partial sums are double-buffered by step parity. A CTA writes buffer
// s + 2 only after a chain through every CTA's step s + 1, which starts after every read of
// buffer s (each row block's state at s + 1 needs all four quarters of the state at s, hence
// every CTA's multiply of step s + 1, which follows, and depends on, that CTA's reads of step
// s); so a reader never sees a tag of s + 2 where it waits for s. The workspace is zeroed
// before each launch (tags start at 1). B beyond 64 runs in successive launches of 64 batch
// columns. Per-step inputs of the CTA's 16 rows are staged three steps ahead with cp.async,
// as in the cluster design, and everything of the epilogue that needs no product is
// computed first.
#include <cuda_bf16.h>

#include <cstdint>

#include "cluster.cuh"
#include "dense.h"
#include "dense_cell.cuh"

namespace elman {
namespace {

constexpr int kDim = 2048;
constexpr int kRows = 64;                         // rows of a CTA's tile
constexpr int kQuarters = 4;                      // column quarters: CTAs per row block
constexpr int kCols = kDim / kQuarters;           // columns of a tile
constexpr int kBlocks = kDim / kRows;             // row blocks (32)
constexpr int kCtas = kBlocks * kQuarters;        // 128
constexpr int kSources = kCols / kRows;           // row blocks whose state a tile reads (8)
constexpr int kSub = kRows / kQuarters;           // rows a CTA finishes (16)
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kKGroups = 8;                       // warps splitting the columns: one source each
constexpr int kMTiles = 2;                        // 16-row mma tiles per warp
constexpr int kSteps = kCols / kKGroups / 16;     // mma k-steps per warp (4)
constexpr int kRedStride = kRows + 4;             // floats per (k-group, batch) row of partials
constexpr int kLead = 3;
constexpr int kStages = kLead + 1;
constexpr int kMaxBc = 64;
static_assert(kSources == kKGroups, "one warp column group per source row block");

struct Args {
  int steps, batch, n0;                  // n0: first batch column of this launch
  const __nv_bfloat16* w;
  const __nv_bfloat16* b;
  const __nv_bfloat16* wx;
  const __nv_bfloat16* z;
  const __nv_bfloat16* h0;
  __nv_bfloat16* out;
  __nv_bfloat16* h_all;
  const __nv_bfloat16* d_out;
  const __nv_bfloat16* d_hT;
  __nv_bfloat16* dv;
  __nv_bfloat16* dz;
  __nv_bfloat16* dh0;
  uint64_t* slots;      // [2][kBlocks][bc][32]: pairs of state values (rows 2i, 2i + 1), tagged
  uint64_t* partials;   // [2][kBlocks][kQuarters][bc][64]: fp32 partial sums, tagged
  long long* trace;     // optional: per-step phase clocks of CTA 0
};

// The trace has the layout of the cluster design's (dense_persistent.cu): clock64 at six
// phase boundaries of each step (start, state block 0 in, multiplied, partial sums written,
// reduced and epilogue done, slot written), then clock64 and %globaltimer at kernel start
// and end. Only the traced instantiation has the marks.
constexpr int kTracePhases = 6;
template <bool kTrace>
__device__ __forceinline__ void mark(const Args& p, int step, int phase) {
  if (kTrace && blockIdx.x == 0 && threadIdx.x == 0) p.trace[step * kTracePhases + phase] = clock64();
}
template <bool kTrace>
__device__ __forceinline__ void stamp(const Args& p, int slot) {
  if (kTrace && blockIdx.x == 0 && threadIdx.x == 0) {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    p.trace[p.steps * kTracePhases + 2 * slot] = clock64();
    p.trace[p.steps * kTracePhases + 2 * slot + 1] = t;
  }
}

// A state block in shared memory is [batch column n][64 values]; value k of column n sits at
// k ^ 8 (n % 8), so that the mma B-fragment loads of an n-tile's 8 columns hit 32 banks.
__device__ __forceinline__ int swz(int n, int k) { return k ^ ((n & 7) << 3); }

__device__ __forceinline__ uint32_t pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Tagged words: data in the low 32 bits, the tag in the high 32, one 64-bit access.
__device__ __forceinline__ void put_tagged(uint64_t* w, uint32_t data, uint32_t tag) {
  const uint64_t v = uint64_t(data) | (uint64_t(tag) << 32);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(w), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t get_tagged(const uint64_t* w) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(w) : "memory");
  return v;
}
__device__ __forceinline__ bool tagged(uint64_t v, uint32_t tag) { return uint32_t(v >> 32) == tag; }
// The data of word w once it carries `tag`; v is a first read of it.
__device__ __forceinline__ uint32_t await_tagged(const uint64_t* w, uint64_t v, uint32_t tag) {
  while (!tagged(v, tag)) v = get_tagged(w);
  return uint32_t(v);
}
__device__ __forceinline__ void pair_barrier(int id) {  // the two warps of a column group
  asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory");
}

template <int NT, int kIn>
struct Tile {
  static constexpr int kBc = NT * 8;
  static constexpr int kSlice = kBc * kRows;                  // one source's state block
  static constexpr int kSlotWords = kBc * kRows / 2;          // tagged pairs of a block
  static constexpr int kSubElems = kBc * kSub;                // the CTA's rows of a step
  static constexpr int kPairs = kSubElems / 2;                // ... as pairs of rows
  static constexpr int kPerPartial = kBc * kRows / kThreads;  // partial sums per thread
  static constexpr int kWordsPerThread = kSlotWords / 64;     // of a block, per warp pair
  static_assert(kPairs <= kThreads, "one pair of rows per thread at most");
  // Shared memory: state[source][n][64] | red[k-group][n][kRedStride] | stage
  static constexpr int kRedOffset = kSources * kSlice * 2;
  static constexpr int kStageOffset = kRedOffset + kKGroups * kBc * kRedStride * 4;
  static constexpr int kSmem = kStageOffset + kStages * kIn * kSubElems * 2;

  unsigned char* base;
  int r, q;
  uint32_t a[kMTiles][kSteps][4];

  __device__ __nv_bfloat16* state() const { return reinterpret_cast<__nv_bfloat16*>(base); }
  __device__ float* red() const { return reinterpret_cast<float*>(base + kRedOffset); }
  __device__ __nv_bfloat16* stage() const {
    return reinterpret_cast<__nv_bfloat16*>(base + kStageOffset);
  }
  __device__ static int lane() { return int(threadIdx.x) & 31; }
  __device__ static int kgroup() { return (int(threadIdx.x) >> 5) % kKGroups; }
  __device__ static int mwarp() { return (int(threadIdx.x) >> 5) / kKGroups; }
  __device__ static int mrow0() { return mwarp() * kMTiles * 16; }
  __device__ int row0() const { return r * kRows; }
  __device__ int sub0() const { return r * kRows + q * kSub; }  // first row this CTA finishes

  __device__ explicit Tile(unsigned char* smem) : base(smem) {
    r = int(blockIdx.x) / kQuarters;
    q = int(blockIdx.x) % kQuarters;
  }

  __device__ void load_weights(const __nv_bfloat16* w, bool transposed) {
    const int g = lane() >> 2, qq = lane() & 3;
    const int k0 = q * kCols + kgroup() * (kCols / kKGroups);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = row0() + mrow0() + mt * 16 + g + ((i & 1) ? 8 : 0);
          const int col = k0 + s * 16 + 2 * qq + ((i & 2) ? 8 : 0);
          const size_t lo = transposed ? size_t(col) * kDim + row : size_t(row) * kDim + col;
          const size_t hi =
              transposed ? size_t(col + 1) * kDim + row : size_t(row) * kDim + col + 1;
          a[mt][s][i] = pack(w[lo], w[hi]);
        }
  }

  __device__ static const __nv_bfloat16* source(const Args& p, int k) {
    if (kIn == 2) return k == 0 ? p.wx : p.z;
    return k == 0 ? p.d_out : k == 1 ? p.h_all + size_t(p.batch) * kDim : p.z;
  }
  // Stage step t of the inputs of this CTA's 16 rows into ring buffer i: [kIn][bc][16].
  __device__ void stage_inputs(int i, const Args& p, int t, bool skip) const {
    __nv_bfloat16* dst = stage() + (i % kStages) * kIn * kSubElems;
    constexpr int kChunks = kBc * 2;  // two 16-byte chunks per (column, 16 rows)
    for (int c = threadIdx.x; !skip && c < kIn * kChunks; c += kThreads) {
      const int tensor = c / kChunks, n = (c % kChunks) / 2, half = c % 2;
      if (p.n0 + n >= p.batch) continue;
      const __nv_bfloat16* g =
          source(p, tensor) + (size_t(t) * p.batch + p.n0 + n) * kDim + sub0() + half * 8;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                       smem_u32(dst + tensor * kSubElems + n * kSub + half * 8)),
                   "l"(g));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  }
  __device__ static void wait_inputs() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kLead - 1) : "memory");
  }
  __device__ const __nv_bfloat16* inputs(int i) const {
    return stage() + (i % kStages) * kIn * kSubElems;
  }

  __device__ uint64_t* slot(const Args& p, int e, int block) const {
    return p.slots + (size_t(e & 1) * kBlocks + block) * kSlotWords;
  }
  __device__ uint64_t* partial(const Args& p, int m, int block, int quarter) const {
    return p.partials + ((size_t(m & 1) * kBlocks + block) * kQuarters + quarter) * kSlice;
  }

  // Exchange e (tag e + 1): the two warps of column group k read the state block of row
  // block 8q + k into shared memory, every word issued before any is waited for.
  __device__ void load_state(const Args& p, int e) const {
    const int k = kgroup(), t = mwarp() * 32 + lane();
    const uint64_t* src = slot(p, e, q * kSources + k);
    // Word t + 64 i is the pair at rows 2 lane of column n = mwarp + 2 i: its swizzle
    // repeats every 4 words (one register each), the column is an immediate offset.
    __nv_bfloat16* dst = state() + k * kSlice + mwarp() * kRows;
    int off[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) off[i] = (2 * lane()) ^ (((mwarp() + 2 * i) & 7) << 3);
    // At most 16 words in flight per thread (32 at bc = 64 would spill): two rounds there.
    constexpr int kChunk = kWordsPerThread < 16 ? kWordsPerThread : 16;
#pragma unroll
    for (int c = 0; c < kWordsPerThread; c += kChunk) {
      uint64_t v[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = get_tagged(src + t + 64 * (c + i));
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int w = t + 64 * (c + i);
        *reinterpret_cast<uint32_t*>(dst + 2 * (c + i) * kRows + off[(c + i) % 4]) =
            await_tagged(src + w, v[i], uint32_t(e + 1));
      }
    }
    pair_barrier(1 + k);
  }

  // This warp's partial product with its state block, into red[k-group][n][row].
  __device__ void multiply() {
    const int g = lane() >> 2, qq = lane() & 3, k = kgroup();
    const __nv_bfloat16* src = state() + k * kSlice;
    // n-tiles in groups (at 8 n-tiles, of 2: more accumulators would spill); with one
    // n-tile two alternating chains keep four mma in flight.
    constexpr int kGroup = NT > 4 ? 2 : NT;
    constexpr int kChains = NT == 1 ? 2 : 1;
    float* mine = red() + k * kBc * kRedStride;
#pragma unroll
    for (int n0 = 0; n0 < NT; n0 += kGroup) {
      float acc[kChains][kMTiles][kGroup][4] = {};
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
#pragma unroll
        for (int nt = 0; nt < kGroup; ++nt) {
          // Column n = 8 nt' + g of an n-tile has n % 8 = g: one swizzle per lane and k-step,
          // the n-tile an immediate offset (per-(n-tile, k-step) addresses would spill).
          const __nv_bfloat16* row = src + ((n0 + nt) * 8 + g) * kRows;
          const int kk = s * 16 + 2 * qq;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row + (kk ^ (g << 3)));
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + ((kk + 8) ^ (g << 3)));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) mma(acc[s % kChains][mt][nt], a[mt][s], b0, b1);
        }
      }
#pragma unroll
      for (int c = 1; c < kChains; ++c)
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kGroup; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[0][mt][nt][i] += acc[c][mt][nt][i];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kGroup; ++nt) {
          const int row = mrow0() + mt * 16 + g, col = (n0 + nt) * 8 + 2 * qq;
          mine[col * kRedStride + row] = acc[0][mt][nt][0];
          mine[(col + 1) * kRedStride + row] = acc[0][mt][nt][1];
          mine[col * kRedStride + row + 8] = acc[0][mt][nt][2];
          mine[(col + 1) * kRedStride + row + 8] = acc[0][mt][nt][3];
        }
    }
  }

  // After the multiply and a block barrier: the CTA's partial product of multiply m (tag
  // m + 1) to global memory.
  __device__ void write_partials(const Args& p, int m) const {
    uint64_t* dst = partial(p, m, r, q);
#pragma unroll
    for (int i = 0; i < kPerPartial; ++i) {
      const int j = int(threadIdx.x) + i * kThreads, n = j / kRows, row = j % kRows;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kKGroups; ++k) s += red()[(k * kBc + n) * kRedStride + row];
      put_tagged(dst + j, __float_as_uint(s), uint32_t(m + 1));
    }
  }
  // This thread's pair of rows: batch column n = pair / 8, rows 2 (pair % 8) and + 1 of the
  // CTA's 16 (element index j = 2 pair in the staged [bc][16] inputs).
  __device__ static int pair() { return int(threadIdx.x); }
  __device__ static bool has_pair() { return int(threadIdx.x) < kPairs; }
  // The sums of multiply m for this thread's two rows, quarters added in order.
  __device__ void reduce(const Args& p, int m, float (&acc)[2]) const {
    const int n = pair() / 8, row = q * kSub + 2 * (pair() % 8);
    uint64_t v[kQuarters][2];
#pragma unroll
    for (int k = 0; k < kQuarters; ++k)
#pragma unroll
      for (int i = 0; i < 2; ++i) v[k][i] = get_tagged(partial(p, m, r, k) + n * kRows + row + i);
    acc[0] = acc[1] = 0.f;
#pragma unroll
    for (int k = 0; k < kQuarters; ++k)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        acc[i] += __uint_as_float(
            await_tagged(partial(p, m, r, k) + n * kRows + row + i, v[k][i], uint32_t(m + 1)));
  }
  // This thread's two new state values into row block r's slot for exchange e (tag e + 1).
  __device__ void publish(const Args& p, int e, __nv_bfloat16 lo, __nv_bfloat16 hi) const {
    const int n = pair() / 8;
    put_tagged(slot(p, e, r) + n * (kRows / 2) + (q * kSub) / 2 + pair() % 8, pack(lo, hi),
               uint32_t(e + 1));
  }
  __device__ size_t offset(const Args& p) const {  // of the pair's first row in a [B][D] plane
    return size_t(p.n0 + pair() / 8) * kDim + sub0() + 2 * (pair() % 8);
  }
  __device__ bool live(const Args& p) const { return has_pair() && p.n0 + pair() / 8 < p.batch; }
  __device__ static void store2(__nv_bfloat16* dst, __nv_bfloat16 lo, __nv_bfloat16 hi) {
    *reinterpret_cast<uint32_t*>(dst) = pack(lo, hi);
  }
};

template <int NT, class Epi, bool kTrace>
__global__ void __launch_bounds__(kThreads, 1) grid_forward(Args p) {
  using G = Tile<NT, 2>;
  extern __shared__ __align__(128) unsigned char smem[];
  G g(smem);
  stamp<kTrace>(p, 0);
  const size_t BD = size_t(p.batch) * kDim;
  for (int i = 0; i < kLead; ++i) g.stage_inputs(i, p, i, i >= p.steps);
  g.load_weights(p.w, false);
  // The first multiply's state: h0's columns of this quarter.
  for (int i = threadIdx.x; i < G::kBc * kCols; i += kThreads) {
    const int n = i / kCols, k = i % kCols;
    const __nv_bfloat16 v = p.n0 + n < p.batch ? p.h0[size_t(p.n0 + n) * kDim + g.q * kCols + k]
                                               : __float2bfloat16_rn(0.f);
    g.state()[(k / kRows) * G::kSlice + n * kRows + swz(n, k % kRows)] = v;
  }
  const int j = 2 * (G::pair() % G::kPairs);  // this thread's rows in the staged inputs
  if (g.live(p))
    *reinterpret_cast<uint32_t*>(p.h_all + g.offset(p)) =
        *reinterpret_cast<const uint32_t*>(p.h0 + g.offset(p));
  G::wait_inputs();
  __syncthreads();

  for (int t = 0; t < p.steps; ++t) {
    const bool last = t + 1 == p.steps;
    mark<kTrace>(p, t, 0);
    const __nv_bfloat16* in = g.inputs(t);
    float pre_v[2], pre_g[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      pre_v[i] = to_float(in[j + i]) + to_float(p.b[g.sub0() + j % kSub + i]);  // L1-resident
      pre_g[i] = Epi::gate(to_float(in[G::kSubElems + j + i]));
    }
    g.stage_inputs(t + kLead, p, t + kLead, t + kLead >= p.steps);
    if (t > 0) g.load_state(p, t - 1);           // h_t is exchange t - 1 (h0: the prologue)
    mark<kTrace>(p, t, 1);
    g.multiply();
    __syncthreads();                             // partial sums of the 8 column groups
    mark<kTrace>(p, t, 2);
    g.write_partials(p, t);
    mark<kTrace>(p, t, 3);
    __nv_bfloat16 hb[2], ob[2];
    if (G::has_pair()) {
      float acc[2];
      g.reduce(p, t, acc);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float h = Epi::act(acc[i] + pre_v[i]);
        hb[i] = __float2bfloat16_rn(h);
        ob[i] = __float2bfloat16_rn(h * pre_g[i]);
      }
      mark<kTrace>(p, t, 4);
      if (!last) g.publish(p, t, hb[0], hb[1]);
    }
    mark<kTrace>(p, t, 5);
    G::wait_inputs();  // step t + 1's inputs; the barrier shows them and ends reads of red
    __syncthreads();
    if (g.live(p)) {
      G::store2(p.out + t * BD + g.offset(p), ob[0], ob[1]);
      G::store2(p.h_all + (t + 1) * BD + g.offset(p), hb[0], hb[1]);
    }
  }
  stamp<kTrace>(p, 1);
}

template <int NT, class Epi>
__global__ void __launch_bounds__(kThreads, 1) grid_backward(Args p) {
  using G = Tile<NT, 3>;  // staged: d_out_t, h_t, z_t
  extern __shared__ __align__(128) unsigned char smem[];
  G g(smem);
  const size_t BD = size_t(p.batch) * kDim;
  const int T = p.steps;
  for (int i = 0; i < kLead; ++i) g.stage_inputs(i, p, T - 1 - i, i >= T);
  g.load_weights(p.w, true);
  const int j = 2 * (G::pair() % G::kPairs);
  G::wait_inputs();
  __syncthreads();

  for (int u = 0; u < T; ++u) {  // u-th step from the end: t = T - 1 - u
    const int t = T - 1 - u;
    const __nv_bfloat16* in = g.inputs(u);
    float pre_c[2], pre_f[2];
    __nv_bfloat16 dzb[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float dz;
      Epi::backward_parts(to_float(in[j + i]), to_float(in[G::kSubElems + j + i]),
                          to_float(in[2 * G::kSubElems + j + i]), pre_c[i], pre_f[i], dz);
      dzb[i] = __float2bfloat16_rn(dz);
    }
    g.stage_inputs(u + kLead, p, t - kLead, u + kLead >= T);
    if (u > 0) {                                 // W_h^T dv_{t+1}: exchange u - 1
      g.load_state(p, u - 1);
      g.multiply();
      __syncthreads();
      g.write_partials(p, u - 1);
    }
    __nv_bfloat16 dvb[2];
    if (G::has_pair()) {
      float acc[2] = {0.f, 0.f};
      if (u > 0) {
        g.reduce(p, u - 1, acc);
      } else if (g.live(p)) {
#pragma unroll
        for (int i = 0; i < 2; ++i) acc[i] = to_float(p.d_hT[g.offset(p) + i]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) dvb[i] = __float2bfloat16_rn((acc[i] + pre_c[i]) * pre_f[i]);
      g.publish(p, u, dvb[0], dvb[1]);
    }
    G::wait_inputs();
    __syncthreads();
    if (g.live(p)) {
      G::store2(p.dv + t * BD + g.offset(p), dvb[0], dvb[1]);
      G::store2(p.dz + t * BD + g.offset(p), dzb[0], dzb[1]);
    }
  }
  // dh0 = W_h^T dv_0: exchange T - 1, multiply T - 1.
  g.load_state(p, T - 1);
  g.multiply();
  __syncthreads();
  g.write_partials(p, T - 1);
  if (G::has_pair()) {
    float acc[2];
    g.reduce(p, T - 1, acc);
    if (g.live(p))
      G::store2(p.dh0 + g.offset(p), __float2bfloat16_rn(acc[0]), __float2bfloat16_rn(acc[1]));
  }
}

using KernelPtr = void (*)(Args);
using Epi = TanhSiluGateT<true>;

KernelPtr pick(int nt, bool backward, bool trace = false) {
#define ELMAN_CASE(NT)                                                                     \
  case NT:                                                                                 \
    return backward ? grid_backward<NT, Epi>                                               \
                    : trace ? grid_forward<NT, Epi, true> : grid_forward<NT, Epi, false>;
  switch (nt) {
    ELMAN_CASE(1) ELMAN_CASE(2) ELMAN_CASE(4) ELMAN_CASE(8)
    default: return nullptr;
  }
#undef ELMAN_CASE
}
int smem_for(int nt, bool backward) {
  switch (nt) {
    case 1: return backward ? Tile<1, 3>::kSmem : Tile<1, 2>::kSmem;
    case 2: return backward ? Tile<2, 3>::kSmem : Tile<2, 2>::kSmem;
    case 4: return backward ? Tile<4, 3>::kSmem : Tile<4, 2>::kSmem;
    default: return backward ? Tile<8, 3>::kSmem : Tile<8, 2>::kSmem;
  }
}
int tiles_for(int batch) {  // n-tiles of 8 batch columns per launch: 1, 2, 4 or 8
  int nt = 1;
  while (nt < kMaxBc / 8 && nt * 8 < batch) nt *= 2;
  return nt;
}

// Workspace: slots | partials, tagged 8-byte words.
size_t slot_bytes(int bc) { return size_t(2) * kBlocks * bc * (kRows / 2) * 8; }
size_t partial_bytes(int bc) { return size_t(2) * kCtas * bc * kRows * 8; }

cudaError_t launch(const PersistentPlan& plan, bool backward, cudaStream_t stream, Args a,
                   void* xchg) {
  KernelPtr k = pick(plan.bc / 8, backward, a.trace != nullptr);
  if (a.trace != nullptr) {  // the plan set the attribute of the untraced kernel only
    const cudaError_t e =
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem);
    if (e != cudaSuccess) return e;
  }
  a.slots = static_cast<uint64_t*>(xchg);
  a.partials = a.slots + slot_bytes(plan.bc) / 8;
  for (int wave = 0; wave * plan.bc < a.batch; ++wave) {
    a.n0 = wave * plan.bc;
    cudaError_t e = cudaMemsetAsync(xchg, 0, plan.xchg_bytes, stream);  // no tag is 0
    if (e != cudaSuccess) return e;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(kCtas);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = plan.smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeCooperative;  // all 128 CTAs resident, or an error
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, k, a);
    if (e != cudaSuccess) return e;
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

PersistentPlan dense_grid_plan(int batch, int dim, bool backward) {
  PersistentPlan plan;
  plan.design = "grid";
  if (dim != kDim) { plan.reason = "the grid design takes D = 2048 only"; return plan; }
  if (batch < 1) { plan.reason = "B must be at least 1"; return plan; }
  int dev = 0;
  cudaGetDevice(&dev);
  const int nt = tiles_for(batch);
  const int smem = smem_for(nt, backward);
  static int cache[8][9][2];  // CTAs of this kernel the GPU holds at once, per device
  static bool cached[8][9][2];
  int& resident = cache[dev & 7][nt][backward];
  if (!cached[dev & 7][nt][backward]) {
    cached[dev & 7][nt][backward] = true;
    KernelPtr k = pick(nt, backward);
    int per_sm = 0, sms = 0;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      per_sm = sms = 0;
    }
    resident = per_sm * sms;
  }
  plan.max_active = resident;
  if (resident < kCtas) {
    plan.reason = "the grid design needs 128 resident CTAs of 512 threads (128 SMs)";
    return plan;
  }
  plan.ok = true;
  plan.cluster = 1;
  plan.bc = nt * 8;
  plan.clusters = kCtas;
  plan.smem = smem;
  plan.waves = (batch + plan.bc - 1) / plan.bc;
  plan.xchg_bytes = slot_bytes(plan.bc) + partial_bytes(plan.bc);
  if (plan.waves > 1) plan.reason = "B above 64 runs in successive launches of 64 columns";
  return plan;
}

cudaError_t dense_grid_forward(cudaStream_t stream, int steps, int batch, const void* wx,
                               const void* z, const void* w_h, const void* b, const void* h0,
                               void* out, void* h_all, void* xchg, long long* trace) {
  const PersistentPlan plan = dense_grid_plan(batch, kDim, false);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  Args a = {};
  a.steps = steps; a.batch = batch;
  a.w = static_cast<const __nv_bfloat16*>(w_h);
  a.b = static_cast<const __nv_bfloat16*>(b);
  a.wx = static_cast<const __nv_bfloat16*>(wx);
  a.z = static_cast<const __nv_bfloat16*>(z);
  a.h0 = static_cast<const __nv_bfloat16*>(h0);
  a.out = static_cast<__nv_bfloat16*>(out);
  a.h_all = static_cast<__nv_bfloat16*>(h_all);
  a.trace = trace;
  return launch(plan, false, stream, a, xchg);
}

cudaError_t dense_grid_backward(cudaStream_t stream, int steps, int batch, const void* w_h,
                                const void* h_all, const void* z, const void* d_out,
                                const void* d_hT, void* dv, void* dz, void* dh0, void* xchg) {
  const PersistentPlan plan = dense_grid_plan(batch, kDim, true);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  Args a = {};
  a.steps = steps; a.batch = batch;
  a.w = static_cast<const __nv_bfloat16*>(w_h);
  a.z = static_cast<const __nv_bfloat16*>(z);
  a.h_all = static_cast<__nv_bfloat16*>(const_cast<void*>(h_all));
  a.d_out = static_cast<const __nv_bfloat16*>(d_out);
  a.d_hT = static_cast<const __nv_bfloat16*>(d_hT);
  a.dv = static_cast<__nv_bfloat16*>(dv);
  a.dz = static_cast<__nv_bfloat16*>(dz);
  a.dh0 = static_cast<__nv_bfloat16*>(dh0);
  return launch(plan, true, stream, a, xchg);
}

}  // namespace elman
