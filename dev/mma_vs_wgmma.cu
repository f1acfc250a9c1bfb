// The multiply of one step of the persistent cluster kernel at D = 1024, alone: a CTA's 64 rows
// of W_h held in registers times N = 8 or 16 batch columns of the state in shared memory, each
// round ending with the partial sums in shared memory and a block barrier, 132 CTAs at once.
// Two ways: mma.sync m16n8k16 in the kernel's 2 x 8 warp grid, and wgmma (4 warpgroups, a K
// quarter each, W as the register operand A, the state as a K-major shared-memory operand)
// with 1 to 8 independent accumulator chains. Check: every result against an fp64 product on
// the CPU. Time: SM cycles per round (CTA 0, and the slowest CTA). It shows why the kernel keeps
// mma.sync where each weight meets only 8 or 16 batch columns: the weight operand's flow into
// the tensor cores bounds both instructions there, and wgmma pays only from 32 columns on.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o mma_vs_wgmma dev/mma_vs_wgmma.cu && ./mma_vs_wgmma
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>

constexpr int D = 1024;
static int failures = 0;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32);
}
template <int N>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int scale_d);
template <>
__device__ __forceinline__ void wgmma<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
      "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

// W [64][D] row-major bf16; H [N][D] (column n of the state = row n). out [64][N] fp32.
// wgmma: smem B layout [kb = k/8][n][8]; warpgroup g covers k in [g D/4, (g+1) D/4).
template <int N, int LBO_IS_K, int CH = 1>
__global__ void __launch_bounds__(512, 1) wgmma_kernel(const __nv_bfloat16* W, const __nv_bfloat16* H,
                                                       float* out, int rounds, long long* cycles) {
  constexpr int KS = D / 4 / 16;
  __shared__ __align__(128) __nv_bfloat16 b[D * N];
  __shared__ float red[4][64][N];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int wg = warp >> 2, wr = (warp & 3) * 16;
  for (int i = tid; i < D * N; i += 512) {
    const int n = i / D, k = i % D;
    b[(k / 8) * N * 8 + n * 8 + k % 8] = H[n * D + k];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  uint32_t a[KS][4];
  for (int s = 0; s < KS; ++s)
    for (int r = 0; r < 4; ++r) {
      const int row = wr + g + ((r & 1) ? 8 : 0);
      const int col = wg * (D / 4) + s * 16 + 2 * q + ((r & 2) ? 8 : 0);
      a[s][r] = pack(W[row * D + col], W[row * D + col + 1]);
    }
  __syncthreads();
  const uint32_t base = smem_u32(b);
  const uint32_t kstep_bytes = 2 * N * 16;  // two k8 blocks
  const uint32_t lbo = LBO_IS_K ? N * 16 : 128, sbo = LBO_IS_K ? 128 : N * 16;
  long long t0 = 0;
  float dd[CH][N / 2];
  for (int it = 0; it <= rounds; ++it) {
    if (it == 1) t0 = clock64();
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < KS; ++s)
      wgmma<N>(dd[s % CH], a[s], desc(base + (wg * KS + s) * kstep_bytes, lbo, sbo), s >= CH);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float d[N / 2];
#pragma unroll
    for (int r = 0; r < N / 2; ++r) {
      d[r] = dd[0][r];
#pragma unroll
      for (int c = 1; c < CH; ++c) d[r] += dd[c][r];
    }
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      red[wg][wr + g][8 * j + 2 * q] = d[4 * j];
      red[wg][wr + g][8 * j + 2 * q + 1] = d[4 * j + 1];
      red[wg][wr + g + 8][8 * j + 2 * q] = d[4 * j + 2];
      red[wg][wr + g + 8][8 * j + 2 * q + 1] = d[4 * j + 3];
    }
    __syncthreads();
  }
  if (tid == 0) cycles[blockIdx.x] = clock64() - t0;
  if (blockIdx.x == 0)
    for (int i = tid; i < 64 * N; i += 512)
      out[i] = red[0][i / N][i % N] + red[1][i / N][i % N] + red[2][i / N][i % N] + red[3][i / N][i % N];
}

// mma.sync as in dense_persistent: 16 warps = 2 (32 rows) x 8 (D/8 columns); smem [n][D+8].
template <int N>
__global__ void __launch_bounds__(512, 1) mma_kernel(const __nv_bfloat16* W, const __nv_bfloat16* H,
                                                     float* out, int rounds, long long* cycles) {
  constexpr int NT = N / 8, KS = D / 8 / 16, MT = 2, CH = NT == 1 ? 2 : 1, RS = D + 8;
  __shared__ __align__(128) __nv_bfloat16 b[N * RS];
  __shared__ float red[8][64][N];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int kg = warp % 8, m0 = warp / 8 * 32, k0 = kg * (D / 8);
  for (int i = tid; i < D * N; i += 512) b[(i / D) * RS + i % D] = H[i];
  uint32_t a[MT][KS][4];
  for (int mt = 0; mt < MT; ++mt)
    for (int s = 0; s < KS; ++s)
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + mt * 16 + g + ((r & 1) ? 8 : 0);
        const int col = k0 + s * 16 + 2 * q + ((r & 2) ? 8 : 0);
        a[mt][s][r] = pack(W[row * D + col], W[row * D + col + 1]);
      }
  __syncthreads();
  long long t0 = 0;
  for (int it = 0; it <= rounds; ++it) {
    if (it == 1) t0 = clock64();
    float acc[CH][MT][NT][4] = {};
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __nv_bfloat16* row = b + (nt * 8 + g) * RS + k0 + s * 16 + 2 * q;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row + 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma(acc[s % CH][mt][nt], a[mt][s], b0, b1);
      }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (CH == 2)
          for (int r = 0; r < 4; ++r) acc[0][mt][nt][r] += acc[CH - 1][mt][nt][r];
        const int row = m0 + mt * 16 + g, col = nt * 8 + 2 * q;
        red[kg][row][col] = acc[0][mt][nt][0];
        red[kg][row][col + 1] = acc[0][mt][nt][1];
        red[kg][row + 8][col] = acc[0][mt][nt][2];
        red[kg][row + 8][col + 1] = acc[0][mt][nt][3];
      }
    __syncthreads();
  }
  if (tid == 0) cycles[blockIdx.x] = clock64() - t0;
  if (blockIdx.x == 0)
    for (int i = tid; i < 64 * N; i += 512) {
      float s = 0;
      for (int w = 0; w < 8; ++w) s += red[w][i / N][i % N];
      out[i] = s;
    }
}

template <class K>
void run(const char* name, K kernel, int n, const __nv_bfloat16* W, const __nv_bfloat16* H,
         const std::vector<float>& ref, int blocks) {
  float* out;
  long long* cyc;
  cudaMalloc(&out, 64 * 16 * 4);
  cudaMalloc(&cyc, 132 * 8);
  const int rounds = 2000;
  kernel<<<blocks, 512>>>(W, H, out, 10, cyc);
  kernel<<<blocks, 512>>>(W, H, out, rounds, cyc);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("%s: %s\n", name, cudaGetErrorString(e)); exit(1); }
  std::vector<float> o(64 * n);
  std::vector<long long> c(blocks);
  cudaMemcpy(o.data(), out, 64 * n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(c.data(), cyc, blocks * 8, cudaMemcpyDeviceToHost);
  double err = 0, mx = 0;
  for (int i = 0; i < 64 * n; ++i) { err = fmax(err, fabs(o[i] - ref[i])); mx = fmax(mx, fabs(ref[i])); }
  long long cmax = 0;
  for (long long x : c) cmax = x > cmax ? x : cmax;
  printf("%-22s N=%2d blocks=%3d: %7.1f cycles/round (max over CTAs %7.1f)  max|err| %.3g (|ref| %.3g) %s\n",
         name, n, blocks, double(c[0]) / rounds, double(cmax) / rounds, err, mx, err < 1e-3 * mx + 1e-3 ? "OK" : "WRONG");
  failures += !(err < 1e-3 * mx + 1e-3);
  cudaFree(out);
  cudaFree(cyc);
}

int main() {
  std::vector<__nv_bfloat16> w(64 * D), h(16 * D);
  std::vector<float> wf(64 * D), hf(16 * D);
  srand(1);
  for (int i = 0; i < 64 * D; ++i) { w[i] = __float2bfloat16((rand() % 2001 - 1000) / 1000.f); wf[i] = __bfloat162float(w[i]); }
  for (int i = 0; i < 16 * D; ++i) { h[i] = __float2bfloat16((rand() % 2001 - 1000) / 1000.f); hf[i] = __bfloat162float(h[i]); }
  __nv_bfloat16 *W, *H;
  cudaMalloc(&W, w.size() * 2);
  cudaMalloc(&H, h.size() * 2);
  cudaMemcpy(W, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(H, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
  for (int n : {8, 16}) {
    std::vector<float> ref(64 * n);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < n; ++c) {
        double s = 0;
        for (int k = 0; k < D; ++k) s += double(wf[r * D + k]) * hf[c * D + k];
        ref[r * n + c] = float(s);
      }
    for (int blocks : {132}) {
      if (n == 8) {
        run("mma.sync", mma_kernel<8>, 8, W, H, ref, blocks);
        run("wgmma ch1", wgmma_kernel<8, 1, 1>, 8, W, H, ref, blocks);
        run("wgmma ch2", wgmma_kernel<8, 1, 2>, 8, W, H, ref, blocks);
        run("wgmma ch4", wgmma_kernel<8, 1, 4>, 8, W, H, ref, blocks);
        run("wgmma ch8", wgmma_kernel<8, 1, 8>, 8, W, H, ref, blocks);
      } else {
        run("mma.sync", mma_kernel<16>, 16, W, H, ref, blocks);
        run("wgmma ch1", wgmma_kernel<16, 1, 1>, 16, W, H, ref, blocks);
        run("wgmma ch2", wgmma_kernel<16, 1, 2>, 16, W, H, ref, blocks);
        run("wgmma ch4", wgmma_kernel<16, 1, 4>, 16, W, H, ref, blocks);
      }
    }
  }
  return failures ? 1 : 0;
}
