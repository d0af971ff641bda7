// The binding entry of dsa.sparse_mla_decode's CUDA kernels (csrc/sparse_mla_decode.cpp), shared with the op's
// C++ route (csrc/sparse_mla_decode_route.cpp).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

namespace dsa_cuda_binding {

// torch.ops.dsa_cuda.sparse_mla_decode_out: checks what keeps the launch in bounds, then launches on torch's
// current stream of q's device.
void sparse_mla_decode_out(torch::stable::Tensor q, torch::stable::Tensor kv_cache, torch::stable::Tensor indices,
                           std::optional<torch::stable::Tensor> topk_lens,
                           std::optional<torch::stable::Tensor> attn_sink, double softmax_scale, bool v4,
                           int64_t splits, torch::stable::Tensor out, torch::stable::Tensor lse,
                           torch::stable::Tensor workspace, int64_t variant);

}  // namespace dsa_cuda_binding
