// Launcher of dsa.page_table_transform (kernel in include/dsa_cuda/page_table_transform.cuh).
// Torch-free: the compile gates build this file alone with nvcc.
#include "dsa_cuda/page_table_transform.cuh"

#include <algorithm>

namespace dsa_cuda {

cudaError_t launch_page_table_transform(const PageTableTransformParams& p, cudaStream_t stream) {
  namespace d = page_table_transform_detail;
  if (p.rows <= 0 || p.k <= 0) {
    return cudaSuccess;
  }
  // page_size >= 2^31 behaves as 2^31: every valid index is then in page slot 0 and only page 0
  // keeps the slot id inside int32 (max_page below becomes 0).
  int log2_page = 0;
  while (log2_page < 31 && (int64_t{1} << log2_page) < p.page_size) {
    ++log2_page;
  }
  d::KernelArgs a;
  a.indices = p.indices;
  a.out = p.out;
  a.page_table = p.page_table;
  a.row_to_batch = p.row_to_batch;
  a.row_starts = p.page_table_row_starts;
  a.row_to_batch_stride = p.row_to_batch_stride;
  a.row_starts_stride = p.page_table_row_starts_stride;
  a.numel = uint64_t(p.rows) * uint64_t(p.k);
  a.k = uint64_t(p.k);
  a.batches = p.batches;
  a.max_pages = p.max_pages;
  a.table_stride = p.page_table_stride;
  a.log2_page = log2_page;
  a.offset_mask = int32_t((uint32_t{1} << log2_page) - 1u);
  a.max_page = int32_t(INT32_MAX >> log2_page);
  a.table_empty = p.batches <= 0 || p.max_pages <= 0;

  const uint64_t quads = (a.numel + 3) / 4;
  const uint64_t per_block = uint64_t(d::kThreads) * d::kQuadsPerThread;
  const unsigned blocks = unsigned(std::min((quads + per_block - 1) / per_block, d::kMaxBlocks));
  const bool vec = ((reinterpret_cast<uintptr_t>(p.indices) | reinterpret_cast<uintptr_t>(p.out)) & 15u) == 0;
  // 32-bit element arithmetic while every index + slack fits (the common case by far).
  const bool narrow = a.numel <= (uint64_t{1} << 31);

  using Kernel = void (*)(d::KernelArgs);
  const Kernel kernel = narrow ? (vec ? d::page_table_transform_kernel<uint32_t, true>
                                      : d::page_table_transform_kernel<uint32_t, false>)
                               : (vec ? d::page_table_transform_kernel<uint64_t, true>
                                      : d::page_table_transform_kernel<uint64_t, false>);
  return launch_pdl(kernel, dim3(blocks), dim3(d::kThreads), 0, stream, a);
}

}  // namespace dsa_cuda
