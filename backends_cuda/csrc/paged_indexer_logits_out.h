// The binding entry of dsa.paged_indexer_logits' CUDA kernels (csrc/paged_indexer_logits.cpp), shared with the op's
// C++ route (csrc/paged_indexer_logits_route.cpp).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

namespace dsa_cuda_binding {

// torch.ops.dsa_cuda.paged_indexer_logits_out: checks what keeps the launch in bounds, then launches on torch's
// current stream of q's device.
void paged_indexer_logits_out(torch::stable::Tensor q, torch::stable::Tensor kv_cache, torch::stable::Tensor weights,
                              torch::stable::Tensor context_lens, torch::stable::Tensor block_table,
                              int64_t max_context_len, bool clean, bool fp8_mma, int64_t config,
                              torch::stable::Tensor out);

}  // namespace dsa_cuda_binding
