// dsa.indexer_logits: DSA indexer scores (DeepGEMM's fp8_mqa_logits contract).
//
//   out[t, j] = sum_h weights[t, h] * relu(dot(q[t, h], kv[j]) * kv_scale[j])   for ks[t] <= j < ke[t]
//
// (windows clipped to [0, N)), -inf elsewhere. q [T, H, D], kv [N, D]: fp8 e4m3 or bf16, D = 128,
// H = 32 or 64. The kernel is Hopper-only (wgmma): see sm90_indexer_logits.cuh. An SM100 variant
// (tcgen05) goes in its own sm100_ header behind the same params and launcher.
//
// Torch-free. Plain C++ sees the params struct and the launcher; nvcc also sees the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa_cuda {

enum class IndexerDtype : int32_t { kFp8E4m3 = 0, kBf16 = 1 };

struct IndexerLogitsParams {
  const void* q;            // [T, H, D], unit last stride; rows and heads 16-byte aligned
  const void* kv;           // [N, D], unit last stride; rows 16-byte aligned
  const float* kv_scale;    // [N] (fp8), nullptr for bf16
  const float* weights;     // [T, H], any strides
  const int32_t* ks;        // [T]
  const int32_t* ke;        // [T]
  float* out;               // [T, N] rows of stride out_row_stride, unit last stride
  int64_t rows;             // T
  int64_t keys;             // N
  int64_t heads;            // H: 32 or 64
  int64_t head_dim;         // D: 128
  int64_t q_row_stride;     // elements
  int64_t q_head_stride;    // elements
  int64_t kv_row_stride;    // elements
  int64_t kv_scale_stride;  // elements
  int64_t weights_row_stride;
  int64_t weights_head_stride;
  int64_t ks_stride;
  int64_t ke_stride;
  int64_t out_row_stride;
  IndexerDtype dtype;
  // fp8 only: feed e4m3 straight to the fp8 tensor cores (2x rate; Hopper accumulates their products
  // with ~14 mantissa bits, so scores miss the 1e-5-of-row-norm contract). false: widen e4m3 to fp16
  // in registers (exact) and use the fp16 tensor cores with fp32 accumulation.
  bool fp8_mma;
  bool clean;  // write -inf outside the windows
  // Kernel: 0 the launcher's choice (TMA with 4 math warpgroups where it takes the call, else cp.async); 1 TMA key tiles, wgmma with A from shared memory, 4 math warpgroups; 2 the same with 3
  // (sm90_indexer_logits_tma.cuh; fp8 operands with fp8_mma, kv row stride >= 128); 3 cp.async key tiles,
  // A from registers, every mode (sm90_indexer_logits.cuh).
  int32_t config = 0;
};

// Why the shape cannot run (nullptr when it can): the launcher's own limits.
const char* indexer_logits_unsupported(const IndexerLogitsParams& params);

// Enqueue the scores on `stream` (PDL launch). Empty inputs launch nothing. cudaErrorNotSupported on a
// GPU that is not SM90 or for a shape indexer_logits_unsupported() refuses.
cudaError_t launch_indexer_logits(const IndexerLogitsParams& params, cudaStream_t stream);

}  // namespace dsa_cuda

#ifdef __CUDACC__
#include "sm100_indexer_logits.cuh"
#include "sm90_indexer_logits.cuh"
#include "sm90_indexer_logits_tma.cuh"
#endif
