// The binding entry of the top-k family (csrc/topk.cpp), shared with the C++ route of the dsa ops
// (csrc/topk_route.cpp) so that the checks and the params filling exist once.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

namespace dsa_cuda_binding {

using torch::stable::Tensor;

// torch.ops.dsa_cuda.topk_out: checks what keeps the launch in bounds, then launches on torch's
// current stream. `page_table` selects the page-table form, `offsets` the ragged form.
void topk_out(Tensor scores, int64_t k, std::optional<Tensor> lengths, std::optional<Tensor> row_starts,
              bool deterministic, std::optional<Tensor> page_table, std::optional<Tensor> page_table_row_starts,
              std::optional<Tensor> row_to_batch, int64_t page_size, std::optional<Tensor> offsets, Tensor out,
              std::optional<Tensor> out_raw);

}  // namespace dsa_cuda_binding
