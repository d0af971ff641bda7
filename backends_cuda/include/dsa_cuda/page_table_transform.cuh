// dsa.page_table_transform: request-relative token indices -> physical KV slots.
//
//   out[r, j] = page_table[b, ps + i / P] * P + i % P      (i = indices[r, j])
//
// b = row_to_batch[r] (or r), ps = page_table_row_starts[r] (or 0). -1 wherever i < 0, b is outside
// [0, batches), the page slot is outside [0, max_pages), the page entry is negative, or the slot id
// does not fit in int32. Nothing outside the table is read. `out` may equal `indices` (in place).
//
// Torch-free. Plain C++ sees the params struct and the launcher; nvcc also sees the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa_cuda {

struct PageTableTransformParams {
  const int32_t* indices;                // [rows, k], contiguous
  int32_t* out;                          // [rows, k], contiguous; may equal `indices`
  const int32_t* page_table;             // [batches, max_pages], unit last stride
  const int32_t* row_to_batch;           // [rows] or nullptr: row r uses table row r
  const int32_t* page_table_row_starts;  // [rows] or nullptr: first page slot 0
  int64_t row_to_batch_stride;           // elements between consecutive entries
  int64_t page_table_row_starts_stride;
  int64_t rows;
  int64_t k;
  int64_t batches;
  int64_t max_pages;
  int64_t page_table_stride;  // elements between page-table rows
  int64_t page_size;          // a power of two
};

// Enqueue the transform on `stream` (PDL launch on SM90+). Empty inputs launch nothing.
cudaError_t launch_page_table_transform(const PageTableTransformParams& params, cudaStream_t stream);

}  // namespace dsa_cuda

#ifdef __CUDACC__

#include "common_launch.cuh"

namespace dsa_cuda {
namespace page_table_transform_detail {

constexpr int kThreads = 256;
// Two 16-byte loads in flight per thread before the first dependent gather: more bytes in flight
// per SM than one quad per thread gives, which is what a streaming kernel is bound by. (Measured on
// the H200 at 16384 x 2048: 2 quads 74.4 us, 4 quads 79.3 us.)
constexpr int kQuadsPerThread = 2;
// Grid-stride loop past this many blocks, so any size works with a 1-D grid.
constexpr uint64_t kMaxBlocks = uint64_t{1} << 20;

// What the kernel reads: the params with the page-size arithmetic precomputed.
struct KernelArgs {
  const int32_t* indices;
  int32_t* out;
  const int32_t* page_table;
  const int32_t* row_to_batch;
  const int32_t* row_starts;
  int64_t row_to_batch_stride;
  int64_t row_starts_stride;
  uint64_t numel;
  uint64_t k;
  int64_t batches;
  int64_t max_pages;
  int64_t table_stride;
  int32_t log2_page;
  int32_t offset_mask;  // page_size - 1 (clamped to 2^31 - 1)
  int32_t max_page;     // largest page with page * page_size + offset <= INT32_MAX for every offset
  bool table_empty;     // no batches or no page slots: every gather reads kNoPage instead
};

// What an empty table's rows point at, so the unconditional gather always has a valid address.
__device__ const int32_t kNoPage = -1;

// One index row's window into the page table. slots == 0 when the batch row is out of range, so
// every index of the row maps to -1 and the table is never touched.
struct RowView {
  const int32_t* table_row;
  int64_t first_slot;
  uint64_t slots;
};

__device__ __forceinline__ RowView row_view(const KernelArgs& a, uint64_t row) {
  const int64_t b =
      a.row_to_batch != nullptr ? int64_t{__ldg(a.row_to_batch + int64_t(row) * a.row_to_batch_stride)} : int64_t(row);
  const bool ok = b >= 0 && b < a.batches;
  RowView v;
  v.table_row = a.table_empty ? &kNoPage : a.page_table + (ok ? b : 0) * a.table_stride;
  v.first_slot = a.row_starts != nullptr ? int64_t{__ldg(a.row_starts + int64_t(row) * a.row_starts_stride)} : 0;
  v.slots = ok ? uint64_t(a.max_pages) : 0;
  return v;
}

__device__ __forceinline__ int32_t map_index(const KernelArgs& a, const RowView& v, int32_t i) {
  // Branch-free: the gather always reads a valid table entry (slot 0 of the row when the index is
  // invalid), so the compiler can issue all of a thread's gathers back to back instead of one
  // dependent load after another. An empty table reads kNoPage.
  // 64-bit: a huge row start plus a huge page number must not wrap into range.
  const int64_t slot = v.first_slot + (i >> a.log2_page);
  const bool in_table = i >= 0 && uint64_t(slot) < v.slots;  // unsigned: negative slots fail too
  const int32_t page = __ldg(v.table_row + (in_table ? slot : 0));
  // Negative pages wrap to huge and fail too.
  const bool ok = in_table && uint32_t(page) <= uint32_t(a.max_page);
  return ok ? (page << a.log2_page) | (i & a.offset_mask) : -1;
}

// Map the (up to) 4 elements starting at flat index e0 (elements past n hold -1 and stay -1). The
// row is computed per element only when the quad crosses a row boundary (k % 4 != 0, or k < 4).
template <typename Index>
__device__ __forceinline__ void map_quad(const KernelArgs& a, Index e0, Index n, int32_t (&v)[4]) {
  const Index k = Index(a.k);
  const Index row = e0 / k;
  const Index col = e0 - row * k;
  if (col + 3 < k) {
    const RowView view = row_view(a, row);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = map_index(a, view, v[j]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const Index r = (e0 + Index(j)) / k;
    if (e0 + Index(j) < n) {
      v[j] = map_index(a, row_view(a, r), v[j]);
    }
  }
}

template <typename Index, bool kVec>
__device__ __forceinline__ void load_quad(const KernelArgs& a, Index e0, Index n, int32_t (&v)[4]) {
  // Streaming loads (evict-first): indices are read once; keep the cache for the page table.
  if (kVec && e0 + 4 <= n) {
    const int4 x = __ldcs(reinterpret_cast<const int4*>(a.indices + e0));
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = e0 + Index(j) < n ? __ldcs(a.indices + e0 + j) : -1;
    }
  }
}

template <typename Index, bool kVec>
__device__ __forceinline__ void store_quad(const KernelArgs& a, Index e0, Index n, const int32_t (&v)[4]) {
  if (kVec && e0 + 4 <= n) {
    // Streaming store: the output is not read again by this kernel.
    __stcs(reinterpret_cast<int4*>(a.out + e0), make_int4(v[0], v[1], v[2], v[3]));
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (e0 + Index(j) < n) {
        a.out[e0 + j] = v[j];
      }
    }
  }
}

// One flat 1-D grid over quads of 4 elements. Index is uint32_t when numel <= 2^31 (cheap
// division), uint64_t otherwise. kVec: indices and out are 16-byte aligned, so full quads move as
// int4; otherwise every element moves alone. Each thread reads its quads before writing them and
// quads are disjoint, so out == indices is safe.
template <typename Index, bool kVec>
__global__ void __launch_bounds__(kThreads) page_table_transform_kernel(const __grid_constant__ KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const Index n = Index(a.numel);
  const Index quads = (n + 3) / 4;
  const Index per_block = Index(kThreads) * kQuadsPerThread;
  for (Index base = Index(blockIdx.x) * per_block + threadIdx.x; base < quads;
       base += Index(gridDim.x) * per_block) {
    int32_t v[kQuadsPerThread][4];
#pragma unroll
    for (int u = 0; u < kQuadsPerThread; ++u) {
      const Index q = base + Index(u) * kThreads;
      if (q < quads) {
        load_quad<Index, kVec>(a, q * 4, n, v[u]);
      }
    }
    // All gathers before any store: a store may alias the table as far as the compiler knows, so
    // mapping after a store would serialise the second quad's gathers behind the first's.
#pragma unroll
    for (int u = 0; u < kQuadsPerThread; ++u) {
      const Index q = base + Index(u) * kThreads;
      if (q < quads) {
        map_quad<Index>(a, q * 4, n, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kQuadsPerThread; ++u) {
      const Index q = base + Index(u) * kThreads;
      if (q < quads) {
        store_quad<Index, kVec>(a, q * 4, n, v[u]);
      }
    }
  }
}

}  // namespace page_table_transform_detail
}  // namespace dsa_cuda

#endif  // __CUDACC__
