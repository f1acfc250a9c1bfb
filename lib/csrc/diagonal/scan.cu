// The diagonal family's scan kernels, forward and backward, and their launchers.
//
// One launch walks the whole sequence. A thread owns kVec consecutive elements of the
// flattened [B * D] step (each its own channel: channel d = element % D, so kVec need only
// divide B * D) and keeps their state in registers (fp32) for all T steps. Per step it reads
// each input once and writes out_t and h_t once, as one access of kVec * sizeof(T) bytes (16
// where B * D and the pointers allow); a warp's accesses are consecutive, so every load and
// store is coalesced.
//
// Without loads in flight well ahead of their use the scan is bound by memory latency: one
// round trip a step (about 0.4 us on the H100, whatever B * D). The loads do not depend on the
// state, so each thread keeps kStages steps of its inputs in flight in a ring of its own in
// shared memory, filled by cp.async: at step t it waits for the group of step t (cp.async.
// wait_group kStages - 1), reads the slot, refills it with step t + kStages and computes. The
// ring lives in shared memory because ptxas, given a ring of registers, copies them at the
// loop's back edge, which waits for the loads just issued. Near the end the refill re-reads
// the last step (a line already in L2), so every step commits one group.
//
// Bytes in flight: at most kRingBytes = 384 bytes a thread (48 KB a block of 128 threads: no
// opt-in needed). At B = 64, D = 2048 in bf16 the plan takes 8 elements (16 bytes) a thread,
// 16384 threads (124 an SM): a forward with k inputs keeps (kStages - 1) * 16 * k bytes a
// thread in flight, 15 * 16 = 240 bytes for k = 1, so about 30 KB an SM; the backward (k + 2
// words a step) 3 to 7 steps, 20 to 30 KB an SM. Little's law asks for about 20 KB an SM
// (3 TB/s * ~0.8 us / 132 SMs), and the reads are half or less of the traffic.
//
// 2-byte words (bf16 one element a thread: B * D odd, or a view aligned to 2 bytes only) have
// no cp.async: the thread copies them through a register, one latency a step (correct, slow).
//
// The backward walks t = T - 1 .. 0 with the same layout. It reads h_{t-1} (h_all[t]) once;
// h_t is the previous iteration's h_{t-1}, kept in a register. d_params are summed over T in
// registers and written once per element as per-sequence partial sums (no atomics); Python
// sums them over B. Global loads bypass L1 and stores carry the streaming hint (.cs): every
// byte is touched once.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "diagonal/diagonal.h"
#include "diagonal/steps.cuh"

namespace elman {
namespace {

constexpr int kMaxThreads = 128;
constexpr int kMaxBytes = 16;  // the widest access of a thread
// The plan takes the widest access while it leaves at least this many threads an SM (two
// warps: with the ring, a warp keeps its SM's share of the bandwidth in flight by itself).
constexpr int kMinThreadsPerSm = 64;
constexpr int kRingBytes = 384;  // shared memory of a thread's ring, at most

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T x[V];
};

// The unsigned type of an access of `Bytes` bytes: what the ring holds and the stores write.
template <int Bytes>
struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };
template <class T, int V>
using WordOf = typename Word<int(sizeof(T)) * V>::type;

// The j-th 32-bit word of a word of 4, 8 or 16 bytes (j a constant after unrolling).
__device__ __forceinline__ unsigned part(unsigned w, int) { return w; }
__device__ __forceinline__ unsigned part(uint2 w, int j) { return j == 0 ? w.x : w.y; }
__device__ __forceinline__ unsigned part(uint4 w, int j) {
  return j == 0 ? w.x : (j == 1 ? w.y : (j == 2 ? w.z : w.w));
}

// Element e of a word in fp32 (exact: a bf16 is the high half of its fp32).
template <class T, int V>
__device__ __forceinline__ float element(const WordOf<T, V>& w, int e) {
  if constexpr (std::is_same<T, float>::value) {
    return __uint_as_float(part(w, e));
  } else if constexpr (V == 1) {
    return __uint_as_float(unsigned(w) << 16);
  } else {
    const unsigned x = part(w, e / 2);
    return __uint_as_float(e % 2 == 0 ? x << 16 : x & 0xffff0000u);
  }
}

template <class T, int V>
__device__ __forceinline__ WordOf<T, V> load(const T* p) {
  return __ldcs(reinterpret_cast<const WordOf<T, V>*>(p));
}

// v in T, stored at p (V elements) with the streaming hint.
template <class T, int V>
__device__ __forceinline__ void store(T* p, const float (&v)[V]) {
  using W = WordOf<T, V>;
  Pack<T, V> pk;
#pragma unroll
  for (int e = 0; e < V; ++e) pk.x[e] = from_float<T>(v[e]);
  W w;
  static_assert(sizeof(W) == sizeof(pk), "pack and word differ");
  __builtin_memcpy(&w, &pk, sizeof(pk));
  __stcs(reinterpret_cast<W*>(p), w);
}

// ---- the ring ------------------------------------------------------------------------------
// A thread's kStages slots of kPacks words in dynamic shared memory, laid out
// [kStages][kPacks][threads] so that a warp's accesses to one slot are consecutive words.
template <class T, int V, int kPacks>
struct Ring {
  using W = WordOf<T, V>;
  static constexpr int kWord = int(sizeof(W));
  static constexpr int kFit = kRingBytes / (kPacks * kWord);
  // a power of two (slot = step & (kStages - 1)), 2 to 16
  static constexpr int kStages = kFit >= 16 ? 16 : kFit >= 8 ? 8 : kFit >= 4 ? 4 : 2;
  static constexpr int kThreadBytes = kStages * kPacks * kWord;

  W* base;
  int threads;

  __device__ __forceinline__ W* at(int stage, int k) const {
    return base + (stage * kPacks + k) * threads;
  }
  // Start copying the word at src into (stage, k).
  __device__ __forceinline__ void fetch(int stage, int k, const T* src) const {
    W* dst = at(stage, k);
    if constexpr (kWord >= 4) {
      const unsigned s = unsigned(__cvta_generic_to_shared(dst));
      if constexpr (kWord == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(src) : "memory");
      else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" :: "r"(s), "l"(src), "n"(kWord) : "memory");
    } else {
      *dst = load<T, V>(src);
    }
  }
  __device__ __forceinline__ static void commit() {
    if constexpr (kWord >= 4) asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  // Wait until at most kStages - 1 groups are pending: the oldest slot is filled.
  __device__ __forceinline__ static void wait_oldest() {
    if constexpr (kWord >= 4) asm volatile("cp.async.wait_group %0;\n" :: "n"(kStages - 1) : "memory");
  }
  __device__ __forceinline__ static void wait_all() {
    if constexpr (kWord >= 4) asm volatile("cp.async.wait_all;\n" ::: "memory");
  }
  __device__ __forceinline__ W read(int stage, int k) const { return *at(stage, k); }
};

template <class T, int V, int kPacks>
__device__ __forceinline__ Ring<T, V, kPacks> ring_of() {
  extern __shared__ __align__(16) unsigned char smem[];
  return {reinterpret_cast<WordOf<T, V>*>(smem) + threadIdx.x, int(blockDim.x)};
}

// c = h * silu(h) and its derivative.
__device__ __forceinline__ float out_of(float h, float s) { return h * h * s; }
__device__ __forceinline__ float dout_dh(float h, float s) { return h * s * (2.f + h * (1.f - s)); }

// The rings of a step's kernels: its inputs (forward); its inputs, d_out and h_{t-1} (backward).
template <class S, class T, int V>
struct ForwardKernel {
  using R = Ring<T, V, S::kInputs>;
};
template <class S, class T, int V>
struct BackwardKernel {
  using R = Ring<T, V, S::kInputs + 2>;
};

template <class S, class T, int V>
__global__ void __launch_bounds__(kMaxThreads) scan_forward(DiagonalForward a) {
  constexpr int K = S::kInputs, P = S::kParams;
  using R = typename ForwardKernel<S, T, V>::R;
  constexpr int kStages = R::kStages;
  constexpr bool kApprox = std::is_same<T, __nv_bfloat16>::value;
  const int n = a.batch * a.dim;  // below 2^31 (the binding checks)
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  const R ring = ring_of<T, V, K>();
  const int steps = a.steps;
  const T* in[K];
#pragma unroll
  for (int k = 0; k < K; ++k) in[k] = static_cast<const T*>(a.inputs[k]) + i;
  T* out = static_cast<T*>(a.out) + i;
  T* h_all = static_cast<T*>(a.h_all) + i;

  // slot p holds step p (the last step again beyond it)
#pragma unroll
  for (int p = 0; p < kStages; ++p) {
    const int64_t off = int64_t(p < steps ? p : steps - 1) * n;
#pragma unroll
    for (int k = 0; k < K; ++k) ring.fetch(p, k, in[k] + off);
    R::commit();
  }

  float q[V][P > 0 ? P : 1];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int d = (i + e) % a.dim;
#pragma unroll
    for (int j = 0; j < P; ++j) q[e][j] = a.params[j][d];
  }
  float h[V];
  {
    const auto w = load<T, V>(static_cast<const T*>(a.h0) + i);
#pragma unroll
    for (int e = 0; e < V; ++e) h[e] = element<T, V>(w, e);
    store<T, V>(h_all, h);
  }

#pragma unroll 2
  for (int t = 0; t < steps; ++t) {
    const int stage = t & (kStages - 1);
    R::wait_oldest();
    float u[K][V];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const auto w = ring.read(stage, k);
#pragma unroll
      for (int e = 0; e < V; ++e) u[k][e] = element<T, V>(w, e);
    }
    const int64_t next = int64_t(t + kStages < steps ? t + kStages : steps - 1) * n;
#pragma unroll
    for (int k = 0; k < K; ++k) ring.fetch(stage, k, in[k] + next);
    R::commit();
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      Arr<K> ue;
#pragma unroll
      for (int k = 0; k < K; ++k) ue[k] = u[k][e];
      h[e] = S::forward(h[e], ue, q[e]);
      o[e] = out_of(h[e], Act<kApprox>::sig(h[e]));
    }
    const int64_t off = int64_t(t) * n;
    store<T, V>(out + off, o);
    store<T, V>(h_all + off + n, h);
  }
  R::wait_all();
}

template <class S, class T, int V>
__global__ void __launch_bounds__(kMaxThreads) scan_backward(DiagonalBackward a) {
  constexpr int K = S::kInputs, P = S::kParams;
  using R = typename BackwardKernel<S, T, V>::R;
  constexpr int kStages = R::kStages;
  constexpr bool kApprox = std::is_same<T, __nv_bfloat16>::value;
  const int n = a.batch * a.dim;
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  const R ring = ring_of<T, V, K + 2>();
  const int steps = a.steps;
  // src[k]: inputs 0..K-1, then d_out (K), then h_all (K + 1: h_{t-1} = h_all[t]).
  const T* src[K + 2];
  T* d_in[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    src[k] = static_cast<const T*>(a.inputs[k]) + i;
    d_in[k] = static_cast<T*>(a.d_inputs[k]) + i;
  }
  src[K] = static_cast<const T*>(a.d_out) + i;
  src[K + 1] = static_cast<const T*>(a.h_all) + i;

  // slot p holds step T - 1 - p (step 0 again beyond it)
#pragma unroll
  for (int p = 0; p < kStages; ++p) {
    const int64_t off = int64_t(p < steps ? steps - 1 - p : 0) * n;
#pragma unroll
    for (int k = 0; k < K + 2; ++k) ring.fetch(p, k, src[k] + off);
    R::commit();
  }

  float q[V][P > 0 ? P : 1], dq[V][P > 0 ? P : 1];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int d = (i + e) % a.dim;
#pragma unroll
    for (int j = 0; j < (P > 0 ? P : 1); ++j) {
      q[e][j] = j < P ? a.params[j][d] : 0.f;
      dq[e][j] = 0.f;
    }
  }
  float h[V], dh[V];
  {
    const auto wh = load<T, V>(src[K + 1] + int64_t(steps) * n);
    const auto wd = load<T, V>(static_cast<const T*>(a.d_hT) + i);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      h[e] = element<T, V>(wh, e);
      dh[e] = element<T, V>(wd, e);
    }
  }

#pragma unroll 2
  for (int s = 0; s < steps; ++s) {
    const int t = steps - 1 - s;
    const int stage = s & (kStages - 1);
    R::wait_oldest();
    float u[K + 2][V];
#pragma unroll
    for (int k = 0; k < K + 2; ++k) {
      const auto w = ring.read(stage, k);
#pragma unroll
      for (int e = 0; e < V; ++e) u[k][e] = element<T, V>(w, e);
    }
    const int64_t next = int64_t(t - kStages >= 0 ? t - kStages : 0) * n;
#pragma unroll
    for (int k = 0; k < K + 2; ++k) ring.fetch(stage, k, src[k] + next);
    R::commit();
    float du[K][V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      Arr<K> ue, g;
#pragma unroll
      for (int k = 0; k < K; ++k) ue[k] = u[k][e];
      const float hp = u[K + 1][e];
      const float total = fmaf(u[K][e], dout_dh(h[e], Act<kApprox>::sig(h[e])), dh[e]);
      dh[e] = S::backward(hp, h[e], ue, q[e], total, g, dq[e]);
#pragma unroll
      for (int k = 0; k < K; ++k) du[k][e] = g[k];
      h[e] = hp;
    }
    const int64_t off = int64_t(t) * n;
#pragma unroll
    for (int k = 0; k < K; ++k) store<T, V>(d_in[k] + off, du[k]);
  }
  R::wait_all();
  store<T, V>(static_cast<T*>(a.dh0) + i, dh);
#pragma unroll
  for (int j = 0; j < P; ++j)
#pragma unroll
    for (int e = 0; e < V; ++e) a.d_params[int64_t(j) * n + i + e] = dq[e][j];
}

// ---- launch choice -------------------------------------------------------------------------
bool aligned(const void* p, int bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int sm_count() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Threads per block for `needed` threads: 128, fewer while that would leave SMs without a block.
ScanPlan shape_of(int64_t n, int vec, int sms) {
  const int64_t needed = (n + vec - 1) / vec;
  int threads = kMaxThreads;
  while (threads > 32 && (needed + threads - 1) / threads < sms) threads /= 2;
  return {vec, threads, int((needed + threads - 1) / threads)};
}

template <class K>
int resident(K kernel, int threads, int smem) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != cudaSuccess) return 1;
  return blocks;
}

// Whether a thread may own v elements: v * size bytes at most kMaxBytes, v divides n (a
// thread's elements lie in one step) and every pointer is aligned to v * size bytes.
template <int N>
bool allowed(int v, int size, int64_t n, const void* const (&ptrs)[N]) {
  if (v * size > kMaxBytes || n % v != 0) return false;
  for (const void* p : ptrs)
    if (!aligned(p, v * size)) return false;
  return true;
}

// Calls f(std::integral_constant<int, v>) for v in {1, 2, 4, 8} (8: 2-byte types only).
template <class T, class F>
void with_width(int v, F&& f) {
  if (v == 1) f(std::integral_constant<int, 1>{});
  else if (v == 2) f(std::integral_constant<int, 2>{});
  else if (v == 4) f(std::integral_constant<int, 4>{});
  else if constexpr (sizeof(T) <= 2) { if (v == 8) f(std::integral_constant<int, 8>{}); }
}

// The elements per thread. `forced` (non-zero) takes that width if allowed (vec 0 if not).
// Otherwise the widest allowed width that leaves kMinThreadsPerSm threads an SM and whose
// blocks are all resident at once (a second wave would walk the whole sequence again); when
// none does (few channels), the narrowest resident one (the most threads and bytes in flight);
// when none is resident (a huge B * D), the widest allowed. A width whose copy is under 4
// bytes (bf16, one element) has no cp.async ring and waits one memory round trip a step, so
// it is taken only when no wider width is allowed. `blocks_of(v, threads)`: resident blocks an
// SM of the kernel of width v.
template <int N, class Blocks>
ScanPlan choose(int size, int64_t n, int forced, const void* const (&ptrs)[N], Blocks&& blocks_of) {
  const int sms = sm_count();
  if (forced != 0) {
    const bool ok = (forced == 1 || forced == 2 || forced == 4 || forced == 8) && allowed(forced, size, n, ptrs);
    return ok ? shape_of(n, forced, sms) : ScanPlan{0, 0, 0};
  }
  const auto fits = [&](const ScanPlan& p) { return p.blocks <= int64_t(sms) * blocks_of(p.vec, p.threads); };
  const auto ring = [&](int v) { return v * size >= 4; };  // cp.async copies 4, 8 or 16 bytes
  bool any_ring = false;
  for (const int v : {8, 4, 2, 1}) any_ring = any_ring || (ring(v) && allowed(v, size, n, ptrs));
  ScanPlan narrowest{0, 0, 0};
  for (const int v : {8, 4, 2, 1}) {
    if (!allowed(v, size, n, ptrs) || (any_ring && !ring(v))) continue;
    const ScanPlan plan = shape_of(n, v, sms);
    if (n / v >= int64_t(sms) * kMinThreadsPerSm && fits(plan)) return plan;
    if (fits(plan)) narrowest = plan;
  }
  if (narrowest.vec != 0) return narrowest;
  for (const int v : {8, 4, 2, 1})
    if (allowed(v, size, n, ptrs)) return shape_of(n, v, sms);
  return shape_of(n, 1, sms);
}

template <bool kBf16, class S>
ScanPlan plan_for(const DiagonalForward& a) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, float>;
  const void* const ptrs[] = {a.inputs[0], a.inputs[1], a.inputs[2], a.h0, a.out, a.h_all};
  return choose(int(sizeof(T)), int64_t(a.batch) * a.dim, a.vec, ptrs, [](int v, int threads) {
    int blocks = 1;
    with_width<T>(v, [&](auto w) {
      constexpr int V = decltype(w)::value;
      blocks = resident(scan_forward<S, T, V>, threads, threads * ForwardKernel<S, T, V>::R::kThreadBytes);
    });
    return blocks;
  });
}

template <bool kBf16, class S>
ScanPlan plan_for(const DiagonalBackward& a) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, float>;
  const void* const ptrs[] = {a.inputs[0], a.inputs[1], a.inputs[2], a.h_all, a.d_out,
                              a.d_hT,      a.d_inputs[0], a.d_inputs[1], a.d_inputs[2], a.dh0};
  return choose(int(sizeof(T)), int64_t(a.batch) * a.dim, a.vec, ptrs, [](int v, int threads) {
    int blocks = 1;
    with_width<T>(v, [&](auto w) {
      constexpr int V = decltype(w)::value;
      blocks = resident(scan_backward<S, T, V>, threads, threads * BackwardKernel<S, T, V>::R::kThreadBytes);
    });
    return blocks;
  });
}

template <class S, class T, int V>
void launch(const DiagonalForward& a, const ScanPlan& p) {
  const int smem = p.threads * ForwardKernel<S, T, V>::R::kThreadBytes;
  scan_forward<S, T, V><<<p.blocks, p.threads, smem, a.stream>>>(a);
}
template <class S, class T, int V>
void launch(const DiagonalBackward& a, const ScanPlan& p) {
  const int smem = p.threads * BackwardKernel<S, T, V>::R::kThreadBytes;
  scan_backward<S, T, V><<<p.blocks, p.threads, smem, a.stream>>>(a);
}

// Calls f(std::bool_constant<bf16>, S{}) with the step of `id`; false for an unknown id.
template <class A, class F>
bool with_types(int id, const A& a, F&& f) {
  if (a.bf16) return with_step<true>(id, [&](auto s) { f(std::true_type{}, s); });
  return with_step<false>(id, [&](auto s) { f(std::false_type{}, s); });
}

template <class A>
ScanPlan plan_of(int step, const A& a) {
  ScanPlan p{0, 0, 0};
  with_types(step, a, [&](auto bf16, auto s) { p = plan_for<decltype(bf16)::value, decltype(s)>(a); });
  return p;
}

template <class A>
cudaError_t run(int step, const A& a) {
  if (a.steps < 1 || a.batch < 1 || a.dim < 1) return cudaErrorInvalidValue;
  bool planned = false;
  const bool found = with_types(step, a, [&](auto bf16, auto s) {
    constexpr bool kBf16 = decltype(bf16)::value;
    using S = decltype(s);
    using T = std::conditional_t<kBf16, __nv_bfloat16, float>;
    const ScanPlan p = plan_for<kBf16, S>(a);
    if (p.vec == 0) return;
    planned = true;
    with_width<T>(p.vec, [&](auto w) { launch<S, T, decltype(w)::value>(a, p); });
  });
  if (!found || !planned) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

template <class List>
struct Infos;
template <template <bool> class... S>
struct Infos<StepList<S...>> {
  static constexpr int count = sizeof...(S);
  static StepInfo at(int index) {
    const StepInfo all[] = {{S<false>::kId, S<false>::kName, S<false>::kInputs, S<false>::kParams}...};
    return all[index];
  }
};

}  // namespace

// ---- the table and the launchers, as the binding sees them -------------------------------
int diagonal_step_count() { return Infos<DiagonalSteps>::count; }
StepInfo diagonal_step_info(int index) { return Infos<DiagonalSteps>::at(index); }
StepInfo diagonal_step_of(int id) {
  for (int i = 0; i < diagonal_step_count(); ++i)
    if (diagonal_step_info(i).id == id) return diagonal_step_info(i);
  return {-1, "", 0, 0};
}

ScanPlan diagonal_plan(int step, const DiagonalForward& a) { return plan_of(step, a); }
ScanPlan diagonal_plan(int step, const DiagonalBackward& a) { return plan_of(step, a); }
cudaError_t diagonal_forward(int step, const DiagonalForward& a) { return run(step, a); }
cudaError_t diagonal_backward(int step, const DiagonalBackward& a) { return run(step, a); }

}  // namespace elman
