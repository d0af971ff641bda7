// dsa.page_table_transform for HIP: the params struct and the launcher (kernels/page_table_transform.hip).
// Torch-free; the binding in csrc/ includes only this.
//
//   out[r, j] = page_table[b, ps + i / P] * P + i % P      (i = indices[r, j])
//
// b = row_to_batch[r] (or r), ps = page_table_row_starts[r] (or 0). -1 wherever i < 0, b is outside
// [0, batches), the page slot is outside [0, max_pages), the page entry is negative, or the slot id
// does not fit in int32. Nothing outside the table is read. `out` may equal `indices` (in place).
#pragma once

#include <cstdint>

#include "hip_compat.h"

namespace dsa_hip {

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

// Enqueue the transform on `stream`. Empty inputs launch nothing.
hipError_t launch_page_table_transform(const PageTableTransformParams& params, hipStream_t stream);

}  // namespace dsa_hip
