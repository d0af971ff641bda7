// dsa.page_table_transform, native HIP for gfx950 (wave64). Through dsa_hip/hip_compat.h the same
// source builds with nvcc (warp 32) for the H200 correctness run.
//
// One flat 1-D grid over quads of 4 elements; each thread moves two quads (16-byte loads and stores
// where indices and out are 16-byte aligned), maps every element through the page table, and
// writes back. Each thread reads its quads before writing them and quads are disjoint, so
// out == indices is safe.
#include "dsa_hip/page_table_transform.h"

namespace dsa_hip {
namespace page_table_transform_detail {

// Block shape from the wave size: 256 threads, one wave per SIMD on a gfx950 CU (4 x 64), two warps
// per SM sub-partition on NVIDIA (8 x 32).
template <int kWarpSize>
struct Config {
  static_assert(kWarpSize == 32 || kWarpSize == 64, "wave size is 32 or 64");
  static constexpr int kWavesPerBlock = 256 / kWarpSize;
  static constexpr int kThreads = kWarpSize * kWavesPerBlock;
  // Two 16-byte loads in flight per thread before the first dependent page-table read.
  static constexpr int kQuadsPerThread = 2;
};

// Grid-stride loop past this many blocks, so any size works with a 1-D grid.
constexpr uint64_t kMaxBlocks = uint64_t{1} << 20;

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
  uint64_t grid_quads;  // quads one sweep of the whole grid covers (the grid-stride step)
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
      a.row_to_batch != nullptr ? int64_t{a.row_to_batch[int64_t(row) * a.row_to_batch_stride]} : int64_t(row);
  const bool ok = b >= 0 && b < a.batches;
  RowView v;
  v.table_row = a.table_empty ? &kNoPage : a.page_table + (ok ? b : 0) * a.table_stride;
  v.first_slot = a.row_starts != nullptr ? int64_t{a.row_starts[int64_t(row) * a.row_starts_stride]} : 0;
  v.slots = ok ? uint64_t(a.max_pages) : 0;
  return v;
}

__device__ __forceinline__ int32_t map_index(const KernelArgs& a, const RowView& v, int32_t i) {
  // Branch-free: the gather always reads a valid entry (slot 0 of the row for an invalid index, or
  // kNoPage for an empty table), so a thread's gathers issue back to back, not one after another.
  // 64-bit: a huge row start plus a huge page number must not wrap into range.
  const int64_t slot = v.first_slot + (i >> a.log2_page);
  const bool in_table = i >= 0 && uint64_t(slot) < v.slots;  // unsigned: negative slots fail too
  const int32_t page = v.table_row[in_table ? slot : 0];
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
    if (e0 + Index(j) < n) {
      v[j] = map_index(a, row_view(a, (e0 + Index(j)) / k), v[j]);
    }
  }
}

template <typename Index, bool kVec>
__device__ __forceinline__ void load_quad(const KernelArgs& a, Index e0, Index n, int32_t (&v)[4]) {
  if (kVec && e0 + 4 <= n) {
    const Int4 x = *reinterpret_cast<const Int4*>(a.indices + e0);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = e0 + Index(j) < n ? a.indices[e0 + j] : -1;
    }
  }
}

template <typename Index, bool kVec>
__device__ __forceinline__ void store_quad(const KernelArgs& a, Index e0, Index n, const int32_t (&v)[4]) {
  if (kVec && e0 + 4 <= n) {
    Int4 x;
    x.x = v[0];
    x.y = v[1];
    x.z = v[2];
    x.w = v[3];
    *reinterpret_cast<Int4*>(a.out + e0) = x;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (e0 + Index(j) < n) {
        a.out[e0 + j] = v[j];
      }
    }
  }
}

// Index is uint32_t when numel <= 2^31 (cheap division), uint64_t otherwise. kVec: indices and out
// are 16-byte aligned, so full quads move as one vector; otherwise every element moves alone.
template <int kWarpSize, typename Index, bool kVec>
__global__ void __launch_bounds__(Config<kWarpSize>::kThreads) page_table_transform_kernel(KernelArgs a) {
  using C = Config<kWarpSize>;
  const Index n = Index(a.numel);
  const Index quads = (n + 3) / 4;
  const Index per_block = Index(C::kThreads) * C::kQuadsPerThread;
  const Index step = Index(a.grid_quads);
  for (Index base = Index(block_id_x()) * per_block + thread_id_x(); base < quads; base += step) {
    int32_t v[C::kQuadsPerThread][4];
#pragma unroll
    for (int u = 0; u < C::kQuadsPerThread; ++u) {
      const Index q = base + Index(u) * C::kThreads;
      if (q < quads) {
        load_quad<Index, kVec>(a, q * 4, n, v[u]);
      }
    }
    // All gathers before any store: a store may alias the table as far as the compiler knows.
#pragma unroll
    for (int u = 0; u < C::kQuadsPerThread; ++u) {
      const Index q = base + Index(u) * C::kThreads;
      if (q < quads) {
        map_quad<Index>(a, q * 4, n, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < C::kQuadsPerThread; ++u) {
      const Index q = base + Index(u) * C::kThreads;
      if (q < quads) {
        store_quad<Index, kVec>(a, q * 4, n, v[u]);
      }
    }
  }
}

}  // namespace page_table_transform_detail

hipError_t launch_page_table_transform(const PageTableTransformParams& p, hipStream_t stream) {
  namespace d = page_table_transform_detail;
  using C = d::Config<DSA_WARP_SIZE>;
  if (p.rows <= 0 || p.k <= 0) {
    return hipSuccess;
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
  const uint64_t per_block = uint64_t(C::kThreads) * C::kQuadsPerThread;
  uint64_t blocks = (quads + per_block - 1) / per_block;
  blocks = blocks < d::kMaxBlocks ? blocks : d::kMaxBlocks;
  a.grid_quads = blocks * per_block;
  const bool vec = ((reinterpret_cast<uintptr_t>(p.indices) | reinterpret_cast<uintptr_t>(p.out)) & 15u) == 0;
  const bool narrow = a.numel <= (uint64_t{1} << 31);

  using Kernel = void (*)(d::KernelArgs);
  const Kernel kernel = narrow ? (vec ? d::page_table_transform_kernel<DSA_WARP_SIZE, uint32_t, true>
                                      : d::page_table_transform_kernel<DSA_WARP_SIZE, uint32_t, false>)
                               : (vec ? d::page_table_transform_kernel<DSA_WARP_SIZE, uint64_t, true>
                                      : d::page_table_transform_kernel<DSA_WARP_SIZE, uint64_t, false>);
  hipLaunchKernelGGL(kernel, dim3(unsigned(blocks)), dim3(C::kThreads), 0, stream, a);
  return hipGetLastError();
}

}  // namespace dsa_hip
