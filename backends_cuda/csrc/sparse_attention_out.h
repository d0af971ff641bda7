// The binding entry of dsa.sparse_attention's CUDA kernel (csrc/sparse_attention.cpp), shared with the op's C++
// route (csrc/sparse_attention_route.cpp).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

namespace dsa_cuda_binding {

// torch.ops.dsa_cuda.sparse_attention_out: checks what keeps the launch in bounds, then launches on torch's current
// stream of q's device.
void sparse_attention_out(torch::stable::Tensor q, torch::stable::Tensor k_cache, torch::stable::Tensor v_cache,
                          torch::stable::Tensor indices, torch::stable::Tensor block_table,
                          torch::stable::Tensor token_to_req, double softmax_scale, double k_scale, double v_scale,
                          int64_t splits, int64_t whole, int64_t cta_warps, torch::stable::Tensor out,
                          torch::stable::Tensor workspace);

}  // namespace dsa_cuda_binding
