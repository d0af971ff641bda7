// dsa.paged_indexer_logits: decode-time DSA indexer scores over a paged fp8 key cache
// (DeepGEMM's fp8_paged_mqa_logits contract).
//
//   out[b * next_n + i, p] = sum_h weights[b * next_n + i, h] * relu(dot(q[b, i, h], k_p) * s_p)
//
// for the visible positions p < context_lens[b] - next_n + i + 1 (clipped to [0, min(L, 64 * max_blocks))),
// where k_p, s_p are the fp8 key and fp32 scale of position p: cache block block_table[b, p / 64], slot
// p % 64. -inf elsewhere when `clean` (and always at a visible position whose block id is outside
// [0, num_blocks)). kv_cache is uint8 [num_blocks, 64, 1, D + 4]: per block 64 * D fp8 bytes, then 64
// fp32 scales. D = 128, H = 32 or 64, any next_n. The kernel is Hopper-only (wgmma) and scores with the
// same core as indexer_logits: see sm90_paged_indexer_logits.cuh.
//
// Torch-free. Plain C++ sees the params struct and the launcher; nvcc also sees the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa_cuda {

struct PagedIndexerLogitsParams {
  const void* q;              // fp8 e4m3 [B, next_n, H, D], unit last stride; rows 16-byte aligned
  const void* kv_cache;       // uint8 [num_blocks, 64, 1, D + 4], blocks contiguous inside, 16-byte aligned
  const float* weights;       // [B * next_n, H], any strides
  const int32_t* context_lens;  // [B]
  const int32_t* block_table;   // [B, max_blocks]
  float* out;                 // [B * next_n, L], rows of stride out_row_stride, unit last stride
  int64_t batch;              // B
  int64_t next_n;
  int64_t heads;              // H: 32 or 64
  int64_t head_dim;           // D: 128
  int64_t max_context_len;    // L
  int64_t num_blocks;
  int64_t max_blocks;
  int64_t q_batch_stride;     // elements (= bytes)
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t block_stride;       // bytes between cache blocks
  int64_t weights_row_stride;
  int64_t weights_head_stride;
  int64_t context_lens_stride;
  int64_t block_table_row_stride;
  int64_t block_table_col_stride;
  int64_t out_row_stride;
  // As in IndexerLogitsParams: true feeds e4m3 to the fp8 tensor cores (2x rate, ~14-bit accumulation,
  // misses the 1e-5 contract); false widens e4m3 to fp16 in registers (exact) for fp16 MMAs.
  bool fp8_mma;
  bool clean;  // write -inf outside the visible positions
  // Kernel variant, three decimal digits, each 0 for the launcher's default, which fits the digits named beside
  // it (resolve in paged_indexer_logits.cu, the one place the defaults are chosen):
  //   ones: math warpgroups per CTA, each one 64-position page of every tile: 2 or 3. 3 are offered at
  //         MMA N = next_n tokens x H <= 64 (416 threads get 128 registers a thread, too few at N = 128);
  //         elsewhere 3 is refused by name. 4: 3 math warpgroups fed by a producer warpgroup (setmaxnreg
  //         40 / 152), offered at N = 128 only (the default there), refused by name elsewhere. 5: 4 math
  //         warpgroups fed by a producer warpgroup (setmaxnreg 32 / 112), offered at N <= 64 (the default
  //         there) and with loader 3 at N = 128.
  //   tens: page loader: 1 cp.async by the producer warp into swizzled rows, 2 bulk copies (TMA) into plain
  //         rows, 3 a TMA box a page into swizzled rows read by the MMAs as A from shared memory (fp8 mode,
  //         with ones 4 or 5, at N = 128; refused by name elsewhere).
  //   hundreds: schedule: 1 fixed chunks strided over the grid, 2 balanced contiguous tile ranges.
  // Every variant computes the same scores bit for bit, but loader 3's (natural D order in its MMAs: the fp8
  // MMAs group the products otherwise; within the fp8 mode's bound).
  int32_t config;
};

// Why the shape cannot run (nullptr when it can): the launcher's own limits.
const char* paged_indexer_logits_unsupported(const PagedIndexerLogitsParams& params);

// Enqueue the scores on `stream` (PDL launch). Empty outputs launch nothing. cudaErrorNotSupported on a
// GPU that is not SM90 or for a shape paged_indexer_logits_unsupported() refuses.
cudaError_t launch_paged_indexer_logits(const PagedIndexerLogitsParams& params, cudaStream_t stream);

}  // namespace dsa_cuda

#ifdef __CUDACC__
#include "sm90_paged_indexer_logits.cuh"
#endif
