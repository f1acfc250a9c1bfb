// Launchers of the warp kernels (warp.cuh): one warp a (batch, head) for square states n = v in
// {8, 16, 24, 32}, lane tile A = 4 row groups of n / 4 rows and n / 8 columns; dispatch on the
// input path (a.group == kMatrixRing: the cp.async ring, else one step ahead in registers), n,
// the compute dtype and the step functor. A translation unit of its own so that it compiles
// beside recurrence.cu.
#include <cuda_bf16.h>

#include <cstdint>

#include "matrix/matrix.h"
#include "matrix/steps.cuh"
#include "matrix/warp.cuh"

namespace elman {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

struct Device {
  int sms = 0, smem_sm = 0, reserved = 0, optin = 0;
};

Device device() {
  Device d;
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&d.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  cudaDeviceGetAttribute(&d.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
  cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return d;
}

// The backward's slots: a.slots where set (within the opt-in limit), else the most that keep
// every warp of the grid resident at once (B H warps over the SMs, as far as registers allow):
// a second wave would cost a whole extra pass, fewer slots only a partial recompute. `fixed`:
// the bytes before the slots (the input ring).
template <typename Kernel>
int slots_of(Kernel kernel, const MatrixArgs& a, int slot_bytes, int fixed) {
  const Device d = device();
  const int most = a.K < a.T ? a.K : a.T;
  int s;
  if (a.slots > 0) {
    s = a.slots < most ? a.slots : most;
  } else {
    int by_regs = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, kernel, 32, 0);
    const int64_t ctas = int64_t(a.B) * a.H;
    int64_t per_sm = (ctas + d.sms - 1) / (d.sms > 0 ? d.sms : 1);
    if (by_regs > 0 && per_sm > by_regs) per_sm = by_regs;
    if (per_sm < 1) per_sm = 1;
    const int64_t budget = int64_t(d.smem_sm) / per_sm - d.reserved - fixed;
    s = int(budget / slot_bytes);
    if (s > most) s = most;
  }
  while (s > 1 && int64_t(s) * slot_bytes + fixed > d.optin) --s;
  return s < 1 ? 1 : s;
}

template <int A, int NR, int NC, typename T, class Step, bool kRing>
cudaError_t launch(const MatrixArgs& args, bool backward) {
  const unsigned grid = unsigned(args.B) * unsigned(args.H);
  constexpr int N = A * NR, V = (32 / A) * NC;
  constexpr int ring = kRing ? matrix::warp::ring_bytes<N, V, int(sizeof(T))>() : 0;
  if (!backward) {
    matrix::warp::forward_kernel<A, NR, NC, T, Step, kRing><<<grid, 32, ring, args.stream>>>(args);
    return cudaGetLastError();
  }
  auto kernel = matrix::warp::backward_kernel<A, NR, NC, T, Step, kRing>;
  constexpr int bytes = matrix::warp::slot_bytes<A, NR, NC>();
  MatrixArgs a = args;
  a.slots = slots_of(kernel, args, bytes, ring);
  const int smem = ring + a.slots * bytes;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  // The slots were sized for the whole shared-memory carveout; a smaller default carveout would
  // leave fewer warps resident than the grid needs.
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             int(cudaSharedmemCarveoutMaxShared));
  if (e != cudaSuccess) return e;
  kernel<<<grid, 32, smem, a.stream>>>(a);
  return cudaGetLastError();
}

template <typename T, class Step, bool kRing>
cudaError_t by_size(const MatrixArgs& a, bool backward) {
  switch (a.n) {
    case 8: return launch<4, 2, 1, T, Step, kRing>(a, backward);
    case 16: return launch<4, 4, 2, T, Step, kRing>(a, backward);
    case 24: return launch<4, 6, 3, T, Step, kRing>(a, backward);
    case 32: return launch<4, 8, 4, T, Step, kRing>(a, backward);
    default: return cudaErrorInvalidValue;
  }
}

template <class Step, bool kRing>
cudaError_t by_dtype(const MatrixArgs& a, bool backward) {
  return a.bf16 ? by_size<__nv_bfloat16, Step, kRing>(a, backward) : by_size<float, Step, kRing>(a, backward);
}

}  // namespace

bool matrix_warp_fits(int n, int v) { return n == v && (n == 8 || n == 16 || n == 24 || n == 32); }

bool matrix_warp_runs(const MatrixArgs& a, bool backward) {
  if (!matrix_warp_fits(a.n, a.v)) return false;
  const void* shared[] = {a.q, a.k, a.v_in, a.decay, a.beta, a.h0, a.o, a.S_T, a.ckpt};
  const void* grads[] = {a.d_o, a.d_ST, a.dq, a.dk, a.dv, a.d_decay, a.d_beta, a.dh0};
  for (const void* p : shared)
    if (p && !aligned16(p)) return false;
  if (backward)
    for (const void* p : grads)
      if (p && !aligned16(p)) return false;
  return true;
}

cudaError_t matrix_warp_run(const MatrixArgs& a, bool backward) {
  return with_step(a.step, [&](auto step) {
    return a.group == kMatrixRing ? by_dtype<decltype(step), true>(a, backward)
                                  : by_dtype<decltype(step), false>(a, backward);
  });
}

}  // namespace elman
