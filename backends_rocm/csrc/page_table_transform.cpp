// Torch binding of the native HIP dsa.page_table_transform: torch.ops.dsa_hip.page_table_transform_out.
// Built by hipcc on ROCm torch, and on NVIDIA by the host compiler with -DDSA_HIP_ON_CUDA (the kernel
// then comes from nvcc through dsa_hip/hip_compat.h). The CUDA dispatch key serves both: ROCm torch
// uses it for its GPUs too.
// Stable ABI only (build with -DUSE_CUDA for the stream shim, which ROCm torch exports under the same
// name, and -DTORCH_TARGET_VERSION for the oldest torch to load under), so one binary loads under
// torch 2.11 through 2.14.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

#include "dsa_hip/page_table_transform.h"
#include "page_table_transform_binding.h"

namespace {

using torch::stable::Tensor;

void page_table_transform_out(Tensor indices, Tensor page_table, std::optional<Tensor> row_to_batch,
                              std::optional<Tensor> page_table_row_starts, int64_t page_size, Tensor out) {
  dsa_binding::page_table_transform_out<dsa_hip::PageTableTransformParams>(
      "dsa_hip.page_table_transform_out", indices, page_table, row_to_batch, page_table_row_starts, page_size, out,
      [](const dsa_hip::PageTableTransformParams& p, void* stream) -> const char* {
        const hipError_t err = dsa_hip::launch_page_table_transform(p, static_cast<hipStream_t>(stream));
        return err == hipSuccess ? nullptr : hipGetErrorString(err);
      });
}

}  // namespace

// A fragment, not STABLE_TORCH_LIBRARY: every op's binding file adds its own schema to the one
// dsa_hip namespace, and torch allows only one non-fragment definition block per namespace.
STABLE_TORCH_LIBRARY_FRAGMENT(dsa_hip, m) { m.def(dsa_binding::kPageTableTransformOutSchema); }

STABLE_TORCH_LIBRARY_IMPL(dsa_hip, CUDA, m) {
  m.impl("page_table_transform_out", TORCH_BOX(&page_table_transform_out));
}
