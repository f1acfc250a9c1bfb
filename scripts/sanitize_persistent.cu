// The persistent forward and backward kernels (the dense family's and the low-rank ones of
// the two-GEMM family) from a plain CUDA program (no Python, no torch), for compute-sanitizer's
// racecheck: under a Python process that has loaded torch, racecheck of CUDA 13.0 stops with an
// internal error on these kernels; from this program it checks them. gpu_pass.sh's `sanitize`
// stage builds and runs it:
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -gencode=arch=compute_90a,code=sm_90a \
//     -Ilib/csrc scripts/sanitize_persistent.cu lib/csrc/dense/persistent.cu \
//     lib/csrc/dense/steps.cu lib/csrc/twogemm/persistent.cu -o sanitize_persistent
//   compute-sanitizer --tool racecheck --error-exitcode 1 ./sanitize_persistent [T,B,D | T,B,D,r ...]
//
// Each shape runs the forward, then the backward on its h_all, on random bf16 inputs. The
// default shapes are the parity suite's that take the persistent path (the dense family's
// TEST_SHAPES), with T cut to at most 6: five exchanges reach both phases of both
// state buffers' barriers, which is all the protocol has; racecheck is slow. The grid design
// (D = 2048) runs with T = 4 (three fetches reach both phases of its barriers) at 8 and 16
// batch columns (its mma.sync multiply, one and two n-tiles) and at 32 and 64 (wgmma). The
// epilogue is E0/E1's (tanh_silu_gate, one gate input z). A shape with a fourth number r is a
// low-rank one (gated_tanh, the mode whose backward stages all five inputs): by default the
// parity suite's persistent edges with T cut to 5, among them rank tiles in shared memory
// (r above 256) on one 64-row CTA and on a 10-CTA cluster.
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dense/dense.h"
#include "dense/epilogues.cuh"
#include "twogemm/twogemm.h"

namespace {

struct Shape { int T, B, D, r; };  // r = 0: dense
const Shape kDefault[] = {{6, 4, 256}, {6, 5, 512}, {6, 16, 1024}, {6, 64, 512},
                          {5, 8, 768}, {6, 64, 1024}, {4, 130, 1024}, {4, 5, 2048},
                          {4, 16, 2048}, {4, 20, 2048}, {4, 64, 2048},
                          {1, 1, 48, 5}, {5, 3, 200, 17}, {5, 9, 520, 64}, {5, 4, 512, 128},
                          {5, 2, 1024, 256}, {5, 3, 768, 256}, {3, 2, 2048, 128},
                          {5, 2, 1280, 320}, {4, 9, 1160, 320}, {3, 1, 48, 300}};

bool check(cudaError_t e, const char* what, const Shape& s) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "T=%d B=%d D=%d r=%d: %s: %s\n", s.T, s.B, s.D, s.r, what, cudaGetErrorString(e));
  return false;
}

// n random bf16 values in [-scale/2, scale/2) on the device (a fixed LCG: reproducible).
__nv_bfloat16* random_bf16(size_t n, float scale, unsigned& seed) {
  std::vector<__nv_bfloat16> host(n);
  for (auto& x : host) {
    seed = seed * 1664525u + 1013904223u;
    x = __float2bfloat16(scale * (float(seed >> 8) / 16777216.f - 0.5f));
  }
  __nv_bfloat16* dev = nullptr;
  if (cudaMalloc(&dev, n * 2) != cudaSuccess) return nullptr;
  cudaMemcpy(dev, host.data(), n * 2, cudaMemcpyHostToDevice);
  return dev;
}

// The device buffers of one run, freed together: random bf16 inputs (seeded per run) and
// uninitialised outputs; ok() is false where an allocation failed.
struct Buffers {
  std::vector<void*> owned;
  unsigned seed;
  explicit Buffers(unsigned s) : seed(s) {}
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
  void* input(size_t n, float scale) {
    owned.push_back(random_bf16(n, scale, seed));
    return owned.back();
  }
  void* output(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
    owned.push_back(p);
    return p;
  }
  bool ok() const {
    for (void* p : owned)
      if (p == nullptr) return false;
    return true;
  }
};

constexpr int kEpilogue = elman::TanhSiluGate<true>::kId;

bool run_dense(const Shape& s) {
  const auto fwd = elman::dense_persistent_plan(kEpilogue, s.B, s.D, false);
  const auto bwd = elman::dense_persistent_plan(kEpilogue, s.B, s.D, true);
  if (!fwd.ok || !bwd.ok) {
    std::fprintf(stderr, "T=%d B=%d D=%d: the persistent kernels do not take it: %s\n", s.T, s.B,
                 s.D, fwd.ok ? bwd.reason : fwd.reason);
    return false;
  }
  const size_t tbd = size_t(s.T) * s.B * s.D, bd = size_t(s.B) * s.D;
  Buffers m(1);
  void* wx = m.input(tbd, 1.f);
  void* z = m.input(tbd, 2.f);
  void* w = m.input(size_t(s.D) * s.D, 16.f / float(s.D));
  void* b = m.input(s.D, 0.2f);
  void* h0 = m.input(bd, 1.f);
  void* d_out = m.input(tbd, 1.f);
  void* d_hT = m.input(bd, 1.f);
  void* out = m.output(tbd * 2);
  void* h_all = m.output((tbd + bd) * 2);
  void *dv = m.output(tbd * 2), *dz = m.output(tbd * 2), *dh0 = m.output(bd * 2);
  void *xf = m.output(fwd.xchg_bytes), *xb = m.output(bwd.xchg_bytes);
  if (!m.ok()) return check(cudaErrorMemoryAllocation, "allocation", s);
  elman::DenseForward f;
  f.steps = s.T; f.batch = s.B; f.dim = s.D;
  f.wx = wx; f.gates[0] = z; f.w_h = w; f.b = b; f.h0 = h0; f.out = out; f.h_all = h_all;
  f.xchg = xf;
  elman::DenseBackward g;
  g.steps = s.T; g.batch = s.B; g.dim = s.D;
  g.w_h = w; g.h_all = h_all; g.gates[0] = z; g.d_out = d_out; g.d_hT = d_hT; g.dv = dv;
  g.d_gates[0] = dz; g.dh0 = dh0; g.xchg = xb;
  bool ok = check(elman::dense_persistent_forward(kEpilogue, f), "forward", s) &&
            check(cudaDeviceSynchronize(), "forward", s) &&
            check(elman::dense_persistent_backward(kEpilogue, g), "backward", s) &&
            check(cudaDeviceSynchronize(), "backward", s);
  if (ok && fwd.cluster == 1)
    std::printf("T=%d B=%d D=%d (%s design: %d CTAs, %d batch columns): forward + backward ran\n",
                s.T, s.B, s.D, fwd.design, fwd.clusters, fwd.bc);
  else if (ok)
    std::printf("T=%d B=%d D=%d (%s design: %d clusters of %d CTAs, %d batch columns each): "
                "forward + backward ran\n",
                s.T, s.B, s.D, fwd.design, fwd.clusters, fwd.cluster, fwd.bc);
  return ok;
}

bool run_lowrank(const Shape& s) {
  const auto plan = elman::lowrank_persistent_plan(s.B, s.D, s.r, true);
  if (!plan.ok) {
    std::fprintf(stderr, "T=%d B=%d D=%d r=%d: the persistent kernels do not take it: %s\n", s.T,
                 s.B, s.D, s.r, plan.reason);
    return false;
  }
  const size_t tbd = size_t(s.T) * s.B * s.D, bd = size_t(s.B) * s.D, tbr = size_t(s.T) * s.B * s.r;
  Buffers m(2);
  elman::LowRankPersistent a = {};
  a.mode = elman::kGatedTanh; a.steps = s.T; a.batch = s.B; a.dim = s.D; a.rank = s.r;
  a.a = m.input(tbd, 1.f);
  a.c = m.input(tbd, 2.f);
  a.u = m.input(size_t(s.D) * s.r, 2.f / float(s.r));
  a.v = m.input(size_t(s.r) * s.D, 2.f / float(s.D));
  a.b = m.input(s.D, 0.2f);
  a.h0 = m.input(bd, 1.f);
  a.d_out = m.input(tbd, 1.f);
  a.d_hT = m.input(bd, 1.f);
  a.out = m.output(tbd * 2);
  a.h_all = m.output((tbd + bd) * 2);
  a.p_all = m.output(tbr * 2);
  a.aux = m.output(tbd * 2);
  a.d_pre = m.output(tbd * 2);
  a.d_c = m.output(tbd * 2);
  a.dp_all = m.output(tbr * 2);
  a.dh0 = m.output(bd * 2);
  if (!m.ok()) return check(cudaErrorMemoryAllocation, "allocation", s);
  bool ok = check(elman::lowrank_persistent_forward<__nv_bfloat16>(plan, a), "forward", s) &&
            check(cudaDeviceSynchronize(), "forward", s) &&
            check(elman::lowrank_persistent_backward<__nv_bfloat16>(plan, a), "backward", s) &&
            check(cudaDeviceSynchronize(), "backward", s);
  if (ok)
    std::printf("T=%d B=%d D=%d r=%d (low-rank: %d clusters of %d CTAs of %d rows, rank tiles %d): "
                "forward + backward ran\n",
                s.T, s.B, s.D, s.r, plan.clusters, plan.cluster, 16 * plan.ka, plan.r16);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    Shape s{};
    const int n = std::sscanf(argv[i], "%d,%d,%d,%d", &s.T, &s.B, &s.D, &s.r);
    if (n < 3 || s.T < 1 || s.B < 1 || (n == 4 && s.r < 1)) {
      std::fprintf(stderr, "usage: %s [T,B,D | T,B,D,r ...]   (got '%s')\n", argv[0], argv[i]);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty()) shapes.assign(std::begin(kDefault), std::end(kDefault));
  int failed = 0;
  for (const Shape& s : shapes) failed += !(s.r > 0 ? run_lowrank(s) : run_dense(s));
  return failed ? 1 : 0;
}
