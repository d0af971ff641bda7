// dsa.sparse_mla_decode: sparse MLA decode attention over a paged fp8 MLA cache (FlashMLA's sparse
// decode contract; the spec is ops_core/ops/sparse_mla_decode.py's reference).
//
//   out[b, i, h] = sum_j p_j V_j / sum_j p_j,  p_j = exp(scale * q[b, i, h] . K_j - max),
//   lse[b, h, i] = natural-log sum-exp of the scaled scores (+inf where no token is valid)
//
// over the selected slots j of indices[b, i, :] that are valid (0 <= slot < num_blocks * P, position
// < topk_lens[b]); K_j is the dequantised cache row (576 wide "v32", 512 wide "v4"), V_j its first 512
// columns. attn_sink[h] rescales out by exp(lse) / (exp(lse) + exp(sink)). Kernels: sm90_sparse_mla_decode.cuh
// (Hopper, wgmma; runs on the H200) and sm100_sparse_mla_decode.cuh (Blackwell, tcgen05; compiled, not
// run), sharing smxx_sparse_mla_decode.cuh.
//
// Torch-free. Plain C++ sees the params struct and the launcher; nvcc also sees the kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa_cuda {

struct SparseMlaDecodeParams {
  const void* q;               // bf16 [B, s_q, H, D] (D 576 v32, 512 v4), unit last stride, rows 16-byte aligned
  const void* kv_cache;        // uint8 [num_blocks, P, 1, bytes a token], pages contiguous inside, 16-byte aligned
  const int32_t* indices;      // [B, s_q, topk], any strides
  const int32_t* topk_lens;    // [B] or nullptr
  const float* attn_sink;      // [H] or nullptr
  void* out;                   // bf16 [B, s_q, H, 512], unit last stride, 8-byte aligned rows
  float* lse;                  // fp32 [B, H, s_q] contiguous
  float* workspace;            // fp32, sparse_mla_decode_workspace_floats() of them (used when splits > 1)
  int64_t batch;
  int64_t s_q;
  int64_t heads;               // a multiple of 64
  int64_t topk;
  int64_t num_blocks;
  int64_t page_size;           // P
  int64_t page_stride;         // bytes between pages (a multiple of 16)
  int64_t q_batch_stride;      // elements
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t idx_batch_stride;    // elements
  int64_t idx_token_stride;
  int64_t idx_pos_stride;
  int64_t out_batch_stride;    // elements
  int64_t out_token_stride;
  int64_t out_head_stride;
  int64_t topk_lens_stride;    // elements
  float softmax_scale;
  bool v4;                     // layout "v4" (else "v32")
  // Splits of each query token's top-k axis (split-KV): 1 is the single pass; more write fp32 partials
  // into the workspace and a combine kernel writes out and lse.
  int64_t splits;
  // Kernel variant on SM90: 0 sm90_sparse_mla_decode.cuh (every warp loads and computes; forced only), 3
  // sm90_sparse_mla_decode_ws.cuh (producer, QK and PV warpgroups; the provider's choice on SM90). (1, the first
  // form of 3, is removed.) Only 0 on the SM100 family.
  int64_t variant = 0;
};

// fp32 elements of the split-KV workspace: per (query token, 64-head block, split) a [64, 512] partial
// output and 64 row maxima and sums. 0 when splits <= 1.
int64_t sparse_mla_decode_workspace_floats(int64_t batch, int64_t s_q, int64_t heads, int64_t splits);

// Why the shape cannot run (nullptr when it can): the launcher's own limits.
const char* sparse_mla_decode_unsupported(const SparseMlaDecodeParams& params);

// Enqueue the decode (and the combine when splits > 1) on `stream` (PDL launches). Empty outputs launch
// nothing. SM90 runs the wgmma kernel, SM100 family (compute capability 10.x) the tcgen05 kernel (compiled,
// not run); cudaErrorNotSupported on any other GPU or for a shape sparse_mla_decode_unsupported() refuses.
cudaError_t launch_sparse_mla_decode(const SparseMlaDecodeParams& params, cudaStream_t stream);

}  // namespace dsa_cuda

#ifdef __CUDACC__
#include "sm100_sparse_mla_decode.cuh"
#include "sm90_sparse_mla_decode.cuh"
#include "sm90_sparse_mla_decode_ws.cuh"
#endif
