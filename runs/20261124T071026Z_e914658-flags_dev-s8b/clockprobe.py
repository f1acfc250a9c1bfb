"""Dev: the SM clock a kernel sees (clock64 against %globaltimer) while it does one kind of
work, on `blocks` CTAs of 512 threads for about 1 ms. Modes (bits): 1 dependent FMAs,
2 each warp stores 64 bytes (2 bytes a thread) to HBM every round, 4 the same as 16-byte
stores (512 bytes a warp), 8 mma.sync bursts, 16 __nanosleep(200) each round."""
import torch
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <cuda_bf16.h>
__device__ __forceinline__ long long gtime() { long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void probe(int mode, int rounds, long long* out, unsigned short* buf, size_t buf_elems) {
  long long c0 = clock64(), g0 = gtime();
  float x = threadIdx.x * 1e-3f, y = 1.0001f;
  unsigned a0 = threadIdx.x, a1 = 3, a2 = 5, a3 = 7, b0 = 11, b1 = 13;
  float acc[4] = {0, 0, 0, 0};
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < rounds; ++r) {
    if (mode & 1) {
#pragma unroll 16
      for (int i = 0; i < 64; ++i) x = fmaf(x, y, 1e-7f);
    }
    if (mode & 8) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    if (mode & 2) {
      size_t i = (size_t(r) * stride + size_t(blockIdx.x) * blockDim.x + threadIdx.x) % buf_elems;
      buf[i] = (unsigned short)(x + acc[0]);
    }
    if (mode & 4) {
      if (threadIdx.x < 64) {  // same bytes as mode 2: 1 KB a CTA and round
        size_t i = ((size_t(r) * gridDim.x + blockIdx.x) * 64 + threadIdx.x) * 8 % buf_elems;
        *reinterpret_cast<uint4*>(buf + i) = make_uint4(__float_as_uint(x), 1, 2, 3);
      }
    }
    if (mode & 16) __nanosleep(200);
  }
  long long c1 = clock64(), g1 = gtime();
  if (threadIdx.x == 0) {
    out[4 * blockIdx.x] = c1 - c0; out[4 * blockIdx.x + 1] = g1 - g0;
    out[4 * blockIdx.x + 2] = (long long)(x + acc[0] + acc[1]);
  }
}
void run(int64_t mode, int64_t rounds, int64_t blocks, torch::Tensor out, torch::Tensor buf) {
  probe<<<blocks, 512>>>(mode, rounds, reinterpret_cast<long long*>(out.data_ptr<int64_t>()), (unsigned short*)buf.data_ptr(), buf.numel());
}
"""
CPP = "void run(int64_t mode, int64_t rounds, int64_t blocks, torch::Tensor out, torch::Tensor buf);"


def main():
    m = load_inline("clockprobe", CPP, cuda_sources=SRC, functions=["run"],
                    extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])
    buf = torch.zeros(256 << 20, dtype=torch.int16, device="cuda")  # 512 MB: beyond L2
    res = []
    for blocks in (16, 32, 128):
        for mode, rounds in ((1, 4000), (1 | 2, 4000), (1 | 4, 4000), (8, 4000), (8 | 2, 4000),
                             (16, 4000), (16 | 2, 4000), (1 | 16, 4000)):
            out = torch.zeros(4 * blocks, dtype=torch.int64, device="cuda")
            for _ in range(3):
                m.run(mode, rounds, blocks, out, buf)
            torch.cuda.synchronize()
            o = out.view(blocks, 4).double()
            ghz = (o[:, 0] / o[:, 1])
            line = (f"clock probe blocks={blocks} mode={mode}: {ghz.median():.3f} GHz "
                    f"(min {ghz.min():.3f}, max {ghz.max():.3f}), {o[:, 1].median() / 1e3:.0f} us")
            print(line, flush=True)
            res.append((blocks, mode, ghz.median().item(), ghz.min().item(), o[:, 1].median().item()))
    return res


if __name__ == "__main__":
    main()
