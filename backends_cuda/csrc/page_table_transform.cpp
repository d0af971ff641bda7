// Torch binding of dsa.page_table_transform for CUDA: torch.ops.dsa_cuda.page_table_transform_out.
// Stable ABI only (build with -DUSE_CUDA for the stream shim and -DTORCH_TARGET_VERSION for the
// oldest torch to load under), so one binary loads under torch 2.11 through 2.14.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

#include "dsa_cuda/page_table_transform.cuh"
#include "page_table_transform_binding.h"

namespace {

using torch::stable::Tensor;

void page_table_transform_out(Tensor indices, Tensor page_table, std::optional<Tensor> row_to_batch,
                              std::optional<Tensor> page_table_row_starts, int64_t page_size, Tensor out) {
  dsa_binding::page_table_transform_out<dsa_cuda::PageTableTransformParams>(
      "dsa_cuda.page_table_transform_out", indices, page_table, row_to_batch, page_table_row_starts, page_size, out,
      [](const dsa_cuda::PageTableTransformParams& p, void* stream) -> const char* {
        const cudaError_t err = dsa_cuda::launch_page_table_transform(p, static_cast<cudaStream_t>(stream));
        return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
      });
}

}  // namespace

// A fragment, not STABLE_TORCH_LIBRARY: every op's binding file adds its own schema to the one
// dsa_cuda namespace, and torch allows only one non-fragment definition block per namespace.
STABLE_TORCH_LIBRARY_FRAGMENT(dsa_cuda, m) { m.def(dsa_binding::kPageTableTransformOutSchema); }

STABLE_TORCH_LIBRARY_IMPL(dsa_cuda, CUDA, m) {
  m.impl("page_table_transform_out", TORCH_BOX(&page_table_transform_out));
}
