// Launchers of the synchronisation primitives measured for the "Kernel engineering" chapter
// (primitives.cu; development extension only). Each runs `iters` repetitions inside one
// launch and returns a CUDA error code.
#pragma once

#include <cuda_runtime.h>

namespace elman {

cudaError_t launch_empty(cudaStream_t stream);
cudaError_t launch_grid_sync(cudaStream_t stream, int iters, bool use_cg, unsigned* flags);
cudaError_t launch_flag_pingpong(cudaStream_t stream, int iters, unsigned* flags);
cudaError_t launch_cluster_sync(cudaStream_t stream, int cluster, int iters);
cudaError_t launch_dsmem_pingpong(cudaStream_t stream, int iters);
// One cluster of `cluster` CTAs exchanging `slice`-byte blocks all-to-all `iters` times;
// method 0 st.async, 1 bulk copy shared-to-peer, 2 multicast bulk copy from global
// (`scratch`: 2 * cluster * slice bytes of global memory).
cudaError_t launch_allgather(cudaStream_t stream, int method, int cluster, int slice, int iters,
                             void* scratch);
// `blocks` CTAs of 512 threads doing `rounds` rounds of one kind of work (0 FMAs, 1 mma.sync
// back to back, 2 mma.sync bursts every 2 us); out[2 b], out[2 b + 1] = cycles, ns of CTA b.
cudaError_t launch_clock_probe(cudaStream_t stream, int work, int blocks, int rounds,
                               long long* out);
// `blocks` CTAs of `threads` threads issuing one instruction kind (op 0 tanh.approx.f32, 1
// ex2.approx.f32, 2 fma.rn.f32) in 8 independent chains of `iters` each; out[b] = CTA b's
// cycles; `sink` (one float) keeps the results.
cudaError_t launch_throughput(cudaStream_t stream, int op, int blocks, int threads, int iters,
                              long long* out, float* sink);

}  // namespace elman
