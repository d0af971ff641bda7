// Dev tool (GPU, plain nvcc): does compute-sanitizer's synccheck report "divergent threads" for a correct
// two-warpgroup named-barrier handover? sparse_mla_decode's three-role kernel hands P from its QK to its PV
// warpgroup with bar.sync id, 256 on converged warps, and synccheck reports divergent threads there
// (docs/design_attention.md); this kernel is that protocol alone, so a report here is the tool's, not the kernel's.
//
//   nvcc -O3 -std=c++17 -Ibackends_cuda/include -gencode=arch=compute_90a,code=sm_90a -o /tmp/synccheck_handover \
//     tools/synccheck_handover.cu
//   for m in 0 1 2 3 4 5 6 7; do compute-sanitizer --tool synccheck --error-exitcode 9 /tmp/synccheck_handover $m; done
//
// Mode bits, each a feature of the MLA kernel: 1 setmaxnreg per role (producer down to 40, math up to 232); 2 the
// barrier out of line (__noinline__, one PC for both warpgroups); 4 the producer warpgroup waits at a 384-thread
// barrier at the end instead of exiting early. Each run prints the CUDA status and checks the values handed over.
#include <cstdio>
#include <cstdlib>

#include "dsa_cuda/sm90_sparse_mla_decode_ws.cuh"  // the kernel's own bar_sync and handover

constexpr int kIters = 64;

// Warpgroup 1 writes p, warpgroup 2 reads it: barrier 1 "p ready", barrier 2 "p free", as the MLA kernel's
// kBarPReady / kBarPFree. Warpgroup 0 stands for the producer.
__global__ void __launch_bounds__(384, 1) handover_kernel(float* out, int mode) {
#if DSA_SM90_INDEXER_DEVICE  // sm_90a device code only: the kernel's helpers exist there
  using dsa_cuda::sm90_indexer::setmaxnreg_dec;
  using dsa_cuda::sm90_indexer::setmaxnreg_inc;
  using dsa_cuda::sm90_mla_decode_ws::bar_sync;  // __syncwarp, then bar.sync: the handover's barrier inline
  // The handover as the kernel makes it: out of line (one PC for both warpgroups, mode bit 2) or inline.
  const auto hand = [mode](int id) {
    if (mode & 2) {
      dsa_cuda::sm90_mla_decode_ws::handover(id);
    } else {
      bar_sync(id, 256);
    }
  };
  __shared__ float p[128];
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  if (wg == 0) {
    if (mode & 1) setmaxnreg_dec<40>();
    if (mode & 4) bar_sync(3, 384);
    return;
  }
  if (mode & 1) setmaxnreg_inc<232>();
  float acc = 0.f;
  for (int i = 0; i < kIters; ++i) {
    if (wg == 1) {
      p[t] = float(i + t);
      hand(1);  // p ready
      hand(2);  // p free
    } else {
      hand(1);
      acc += p[127 - t];
      hand(2);
    }
  }
  if (wg == 2) out[blockIdx.x * 128 + t] = acc;
  if (mode & 4) bar_sync(3, 384);
#endif
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  const int ctas = 132;
  float* out = nullptr;
  cudaMalloc(&out, ctas * 128 * sizeof(float));
  handover_kernel<<<ctas, 384>>>(out, mode);
  const cudaError_t e = cudaDeviceSynchronize();
  float* h = static_cast<float*>(malloc(ctas * 128 * sizeof(float)));
  cudaMemcpy(h, out, ctas * 128 * sizeof(float), cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (int c = 0; c < ctas; ++c) {
    for (int t = 0; t < 128; ++t) {
      // sum over i of (i + 127 - t)
      const float want = float(kIters * (kIters - 1) / 2 + kIters * (127 - t));
      wrong += h[c * 128 + t] != want;
    }
  }
  printf("mode %d: %s, %d wrong values\n", mode, cudaGetErrorString(e), wrong);
  free(h);
  cudaFree(out);
  return (e != cudaSuccess || wrong) ? 1 : 0;
}
