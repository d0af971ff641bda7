// The split plan of dsa.sparse_attention's CUDA kernel, for the C++ route of the op (csrc/sparse_attention_route.cpp).
// The same rules as providers_sparse_attention.split_count / split_plan / workspace_floats, which state the
// measurements behind them; tests/test_gpu_sparse_attention_route.py checks they agree. Torch-free, host only.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dsa_cuda::sparse_attention_heuristics {

constexpr int64_t kMaxGroup = 16;  // query heads per KV head: the MMA's M
constexpr int64_t kHeadDim = 128;
constexpr int64_t kStep = 16;      // tokens a warp step
constexpr int64_t kWarps = 4;
constexpr int64_t kSplitCtas = 128;  // split while (row, KV head) CTAs are fewer
constexpr int64_t kMaxSplits = 8;
constexpr int64_t kCtasPerSm = 4;
constexpr int64_t kMultiUnitMinSteps = 24;
constexpr int64_t kTailSplits = 4;
constexpr int64_t kTailMaxShareInv = 4;  // a split tail serves at most 1 / 4 of a wave past the first
constexpr int64_t kWideMinItems = 64;    // from this many items up to one an SM: one split in 16-warp CTAs

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits of each (row, KV head)'s top-k axis; 1 is the single pass.
inline int64_t split_count(int64_t rows, int64_t kv_heads, int64_t topk) {
  const int64_t items = std::max<int64_t>(1, rows * kv_heads);
  const int64_t steps = std::max<int64_t>(1, ceil_div(topk, kStep));
  const int64_t want = std::max<int64_t>(1, std::min({ceil_div(kSplitCtas, items), steps / kWarps, kMaxSplits}));
  return ceil_div(steps, ceil_div(steps, want));
}

struct SplitPlan {
  int64_t splits;
  int64_t whole;  // leading items run unsplit (a split tail); 0: every item split alike
};

// The split count and, with a split tail, the items of the first wave of `sms` x kCtasPerSm slots that run unsplit.
// kWideMinItems to `sms` items: one split (the launcher runs one 16-warp CTA an item).
inline SplitPlan split_plan(int64_t rows, int64_t kv_heads, int64_t topk, int64_t sms) {
  const int64_t items = rows * kv_heads, slots = sms * kCtasPerSm;
  if (items >= kWideMinItems && items <= sms) {
    return {1, 0};
  }
  const int64_t splits = split_count(rows, kv_heads, topk);
  const bool persistent = splits == 1 && ceil_div(topk, kStep) >= kMultiUnitMinSteps;
  if (kTailSplits > 0 && persistent && items > slots && kTailMaxShareInv * (items - slots) <= slots) {
    return {kTailSplits, slots};
  }
  return {splits, 0};
}

// fp32 elements of the split workspace; 0 for one split.
inline int64_t workspace_floats(int64_t rows, int64_t kv_heads, int64_t splits, int64_t whole) {
  const int64_t items = rows * kv_heads;
  return splits <= 1 ? 0 : (items - std::min(whole, items)) * splits * kMaxGroup * (kHeadDim + 2);
}

}  // namespace dsa_cuda::sparse_attention_heuristics
