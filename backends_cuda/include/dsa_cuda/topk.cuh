// dsa.topk, dsa.topk_page_table_transform and dsa.topk_ragged_transform: exact top-k of a window
// of each row (DESIGN.md), optionally mapped through a page table or shifted by a per-row offset.
//
// Row r's window is [start, start + len) clipped to [0, width), start = row_starts[r] (or 0),
// len = lengths[r] (or width - start; negative means 0). Output j of row r is a relative index
// i - start of the selection, or -1 past the n <= k keys of a short window. Every output row is in
// ascending index order when `deterministic` is set, in an unspecified order otherwise.
//
// Torch-free. Plain C++ sees the params struct and the launcher; kernels/topk.cu holds the kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa_cuda {

enum class TopkDtype : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

enum class TopkMode : int32_t {
  kPlain = 0,      // out = relative index
  kPageTable = 1,  // out = page_table[b, ps + i / P] * P + i % P (or -1); out_raw = i
  kRagged = 2,     // out = i + offsets[r] (or -1 when i < 0 or the sum leaves int32)
};

struct TopkParams {
  const void* scores;  // [rows, width], unit last stride
  TopkDtype dtype;
  int64_t rows;
  int64_t width;       // < 2^31
  int64_t row_stride;  // elements between rows
  int64_t k;           // >= 1, < 2^31
  // true: every output row in ascending index order (an ordered write); false: any order (the
  // filter kernel, kernels/topk_filter.cu, writes in the order it finds the keys).
  bool deterministic;
  // true: NaN ranks above every number (torch.topk's order); false: below every number.
  bool nan_first;

  const int32_t* lengths;  // [rows] or nullptr (to the row end)
  int64_t lengths_stride;
  const int32_t* row_starts;  // [rows] or nullptr (0)
  int64_t row_starts_stride;

  int32_t* out;  // [rows, k], unit last stride
  int64_t out_stride;
  int32_t* out_raw;  // [rows, k] or nullptr; kPageTable only: the relative indices
  int64_t out_raw_stride;

  TopkMode mode;
  // kPageTable
  const int32_t* page_table;  // [batches, max_pages], unit last stride
  int64_t batches;
  int64_t max_pages;
  int64_t page_table_stride;
  const int32_t* row_to_batch;  // [rows] or nullptr (row r)
  int64_t row_to_batch_stride;
  const int32_t* page_table_row_starts;  // [rows] or nullptr (0)
  int64_t page_table_row_starts_stride;
  int64_t page_size;  // a power of two
  // kRagged
  const int32_t* offsets;  // [rows]
  int64_t offsets_stride;
};

// Enqueue the top-k on `stream` (PDL launch on SM90+). No host synchronisation, no allocation:
// CUDA-graph safe. Empty inputs launch nothing.
cudaError_t launch_topk(const TopkParams& params, cudaStream_t stream);

}  // namespace dsa_cuda
