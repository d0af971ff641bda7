// dsa.sparse_attention: grouped-query attention of each query row over its selected tokens of a paged
// fp8 e4m3 K/V cache (the spec is ops_core/ops/sparse_attention.py's reference).
//
//   out[r, hq] = v_scale * sum_j p_j V_j / sum_j p_j,  p_j = exp(softmax_scale * k_scale * q[r, hq] . K_j - max)
//
// over the valid tokens j of indices[r, :] (request-relative positions mapped through block_table of
// request token_to_req[r]); KV head hq / (Hq / Hkv). Kernel: smxx_sparse_attention.cuh (warp MMAs; runs
// on the H200, compiled for sm_100a / sm_107a, not run there).
//
// Torch-free. Plain C++ sees the params struct and the launcher; nvcc also sees the kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa_cuda {

struct SparseAttentionParams {
  const void* q;             // bf16 [T, Hq, 128], unit last stride, rows and heads 16-byte aligned
  const void* k_cache;       // e4m3 [num_blocks, P, Hkv, 128], unit last stride, 16-byte aligned rows
  const void* v_cache;       // e4m3 [num_blocks, P, Hkv, 128], likewise
  const int32_t* indices;    // [T, topk], any strides
  const int32_t* block_table;  // [num_reqs, max_pages], any strides
  const int32_t* token_to_req;  // [T]
  void* out;                 // bf16 [T, Hq, 128], unit last stride
  float* workspace;          // fp32, sparse_attention_workspace_floats() of them (used when splits > 1)
  int64_t rows, q_heads, kv_heads, topk;
  int64_t num_blocks, page_size, num_reqs, max_pages;
  int64_t q_row_stride, q_head_stride;            // elements
  int64_t k_block_stride, k_page_stride, k_head_stride;  // elements (= bytes)
  int64_t v_block_stride, v_page_stride, v_head_stride;
  int64_t idx_row_stride, idx_pos_stride, bt_req_stride, bt_page_stride, t2r_stride;
  int64_t out_row_stride, out_head_stride;
  float softmax_scale, k_scale, v_scale;
  // Splits of each (row, KV head)'s top-k axis: 1 is the single pass; more write fp32 partials into the
  // workspace and a combine kernel writes out.
  int64_t splits;
  // With splits > 1, the first `whole` (row, KV head) items run unsplit, the rest split (a split tail: the
  // items past the first wave cut into small units for the slots the first wave frees). 0: all split.
  int64_t whole;
  // Warps a CTA: 0 the launcher's rule (16 for one split of at most one unit an SM, else 4); 4 or 16 forced.
  int64_t cta_warps;
};

// fp32 elements of the split workspace: per split (row, KV head, split) a [16, 128] partial and 16 maxima and
// sums. 0 when splits <= 1.
int64_t sparse_attention_workspace_floats(int64_t rows, int64_t kv_heads, int64_t splits, int64_t whole);

// Why the shape cannot run (nullptr when it can): the launcher's own limits.
const char* sparse_attention_unsupported(const SparseAttentionParams& params);

// Enqueue the attention (and the combine when splits > 1) on `stream` (PDL launches). cudaErrorNotSupported
// below compute capability 9.0 or for a shape sparse_attention_unsupported() refuses.
cudaError_t launch_sparse_attention(const SparseAttentionParams& params, cudaStream_t stream);

}  // namespace dsa_cuda

#ifdef __CUDACC__
#include "smxx_sparse_attention.cuh"
#endif
