// The split rule and workspace size of dsa.sparse_mla_decode's CUDA kernels, for the C++ route of the op (csrc/
// sparse_mla_decode_route.cpp). The same rule as providers_sparse_mla_decode.split_count, which states the
// measurements behind it; tests/test_gpu_sparse_mla_decode_route.py checks the two agree. Torch-free, host only.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dsa_cuda::sparse_mla_decode_heuristics {

constexpr int64_t kHeadsPerCta = 64;
constexpr int64_t kTile = 64;            // selected positions a step
constexpr int64_t kMinSplitTokens = 128;
constexpr int64_t kFewTiles = 4;
constexpr int64_t kMaxSplits = 64;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits of each (query token, 64-head block)'s top-k axis; 1 is the single pass: the most splits that keep the
// CTAs (one an SM) within half a wave of `sms`, or the whole wave when half leaves a split more than kFewTiles
// tiles; each split at least kMinSplitTokens positions, at most kMaxSplits, none empty.
inline int64_t split_count(int64_t batch, int64_t s_q, int64_t heads, int64_t topk, int64_t sms) {
  const int64_t ctas = std::max<int64_t>(1, batch * s_q * ceil_div(heads, kHeadsPerCta));
  const int64_t tiles = std::max<int64_t>(1, ceil_div(topk, kTile));
  auto within = [&](int64_t cap) {
    const int64_t want = std::max<int64_t>(1, std::min({cap / ctas, topk / kMinSplitTokens, tiles, kMaxSplits}));
    return ceil_div(tiles, ceil_div(tiles, want));
  };
  int64_t splits = within(sms / 2);
  if (ceil_div(tiles, splits) > kFewTiles) {
    splits = within(sms);
  }
  return splits;
}

// fp32 elements of the split workspace (partial outputs, row maxima and sums); 0 for one split. The binding
// checks the workspace it gets against the launcher's sparse_mla_decode_workspace_floats.
inline int64_t workspace_floats(int64_t batch, int64_t s_q, int64_t heads, int64_t splits) {
  return splits <= 1 ? 0 : batch * s_q * ceil_div(heads, kHeadsPerCta) * splits * kHeadsPerCta * (512 + 2);
}

}  // namespace dsa_cuda::sparse_mla_decode_heuristics
