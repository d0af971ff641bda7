// dsa.topk, dsa.topk_page_table_transform and dsa.topk_ragged_transform for HIP: the params struct
// and the launcher (kernels/topk.hip). Torch-free; the binding in csrc/ includes only this.
//
// Row r's window is [start, start + len) clipped to [0, width), start = row_starts[r] (or 0),
// len = lengths[r] (or width - start; negative means 0). Output j of row r is a relative index
// i - start of the exact top-k (larger first, ties to the smaller index, NaN below -inf, +0 == -0),
// or -1 past the n <= k keys of a short window. Every output row is in ascending index order, so
// `deterministic=True` holds on every call.
//
// split == 1: one workgroup per row. split > 1: each row's window is cut into `split` parts, one
// workgroup each, through a sequence of kernels that meet in `workspace` (no grid barrier); the
// caller allocates it from the shapes with topk_workspace_words().
#pragma once

#include <cstdint>

#include "hip_compat.h"

namespace dsa_hip {

enum class TopkDtype : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

enum class TopkMode : int32_t {
  kPlain = 0,      // out = relative index
  kPageTable = 1,  // out = page_table[b, ps + i / P] * P + i % P (or -1); out_raw = i
  kRagged = 2,     // out = i + offsets[r] (or -1 when i < 0 or the sum leaves int32)
};

struct TopkParams {
  const void* scores;  // [rows, width], unit last stride
  TopkDtype dtype;
  int64_t rows;        // < 2^31
  int64_t width;       // < 2^31
  int64_t row_stride;  // elements between rows
  int64_t k;           // >= 1, < 2^31
  bool nan_first;      // NaN ranks above every number (torch.topk's order); false: below every number

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

  // Workgroups per row (1 to kTopkMaxSplit) and, when > 1, topk_workspace_words(rows, split)
  // uint32 words of device memory (any contents: every word is written before it is read).
  int32_t split;
  uint32_t* workspace;
};

constexpr int kTopkMaxSplit = 64;
constexpr int kTopkBins = 4096;  // 12-bit digits

// Workspace of the split path: per (row, part) a histogram and two counts, per row 8 words of state.
inline int64_t topk_workspace_words(int64_t rows, int64_t split) {
  return split <= 1 ? 0 : rows * split * (kTopkBins + 2) + rows * 8;
}

// Enqueue the top-k on `stream`. No host synchronisation, no allocation: graph safe. Empty inputs
// launch nothing.
hipError_t launch_topk(const TopkParams& params, hipStream_t stream);

}  // namespace dsa_hip
