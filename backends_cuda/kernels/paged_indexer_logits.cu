// Launcher of dsa.paged_indexer_logits (kernel in include/dsa_cuda/sm90_paged_indexer_logits.cuh).
// Torch-free: the compile gates build this file alone with nvcc.
#include "dsa_cuda/paged_indexer_logits.cuh"

#include <algorithm>

namespace dsa_cuda {
namespace {

namespace k = sm90_paged_indexer;

template <int kMode, int kHeads, int kRows, int kWgs, bool kBulk, bool kWgProducer = false, bool kTma = false>
cudaError_t launch(const CUtensorMap& map, const k::KernelArgs& a, int grid, cudaStream_t stream) {
  using C = k::Cfg<kMode, kHeads * kRows, kWgs, kWgProducer>;
  constexpr auto kernel = &k::paged_indexer_logits_kernel<kMode, kHeads, kRows, kWgs, kBulk, kWgProducer, kTma>;
  return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(C::kThreads), C::kSmemBytes, stream, map, a);
}

// Whether 3 math warpgroups are offered: at MMA N <= 64. 416 threads get 128 registers a thread, too few
// for N = 128's 64 accumulators and 32 weights; with the weights in shared memory the fp8 cp.async variant
// fit (126 registers) but was slower than 2 warpgroups (H200, 64 x 65536, next_n 2: 276.4 us against
// 206.0, balanced schedule).
constexpr bool three_wgs_fit(int heads, int rows) { return heads * rows <= 64; }

// Whether config digit 4 (3 math warpgroups fed by a producer warpgroup, setmaxnreg 40 / 152; the default
// there) is offered: at MMA N = 128 only, where 3 warpgroups with a producer warp do not fit; at
// N <= 64 digit 3 already runs 3 math warpgroups.
constexpr bool producer_wg_offered(int heads, int rows) { return heads * rows == 128; }

// Whether config digit 5 (4 math warpgroups fed by a producer warpgroup, setmaxnreg 32 / 112) is offered
// with the A-in-registers loaders (1, 2): at MMA N <= 64, where 112 registers hold a math thread's 32
// accumulators and 16 weights. At N = 128 it is offered with loader 3 (A from shared memory) only.
constexpr bool four_wgs_offered(int heads, int rows) { return heads * rows <= 64; }

// Whether loader 3 (TMA pages into swizzled rows, the MMAs' A read from shared memory) is offered: with 3 or 4
// math warpgroups fed by a producer warpgroup at MMA N = 128, in the fp8 mode only. At N = 64 (next_n 1, H 64)
// it measured level with digit 5's bulk loader on distinct pages and 5% slower on L2-resident ones (H100: 186.7
// / 122.5 us against 188.2 / 116.9), so it is not built there.
constexpr bool tma_offered(int mode, int heads, int rows) {
  return mode == k::kFp8Mma && producer_wg_offered(heads, rows);
}

template <int kMode, int kHeads, int kRows, bool kBulk, bool kTma>
cudaError_t launch_wgs(const CUtensorMap& map, const k::KernelArgs& a, int wgs, bool producer_wg, int grid,
                       cudaStream_t stream) {
  if constexpr (kTma) {
    if constexpr (tma_offered(kMode, kHeads, kRows)) {
      if (wgs == 3 && producer_wg) {
        return launch<kMode, kHeads, kRows, 3, true, true, true>(map, a, grid, stream);
      }
      if (wgs == 4 && producer_wg) {
        return launch<kMode, kHeads, kRows, 4, true, true, true>(map, a, grid, stream);
      }
    }
    return cudaErrorNotSupported;
  } else {
    if constexpr (three_wgs_fit(kHeads, kRows)) {
      if (wgs == 3 && !producer_wg) {
        return launch<kMode, kHeads, kRows, 3, kBulk>(map, a, grid, stream);
      }
    }
    if constexpr (four_wgs_offered(kHeads, kRows)) {
      if (wgs == 4 && producer_wg) {
        return launch<kMode, kHeads, kRows, 4, kBulk, true>(map, a, grid, stream);
      }
    }
    if constexpr (producer_wg_offered(kHeads, kRows)) {
      if (wgs == 3 && producer_wg) {
        return launch<kMode, kHeads, kRows, 3, kBulk, true>(map, a, grid, stream);
      }
    }
    return wgs == 2 && !producer_wg ? launch<kMode, kHeads, kRows, 2, kBulk>(map, a, grid, stream)
                                    : cudaErrorNotSupported;
  }
}

// heads, rows and wgs as paged_indexer_logits_unsupported and resolve leave them: H 32 or 64,
// rows * H <= 128, 2 or 3 warpgroups where three_wgs_fit, 3 with a producer warpgroup where
// producer_wg_offered, 4 with one where four_wgs_offered; loader 3 (kTma) where tma_offered.
template <int kMode, bool kBulk, bool kTma = false>
cudaError_t launch_variant(const CUtensorMap& map, const k::KernelArgs& a, int64_t heads, int rows, int wgs,
                           bool producer_wg, int grid, cudaStream_t stream) {
  if (heads == 64) {
    return rows == 1 ? launch_wgs<kMode, 64, 1, kBulk, kTma>(map, a, wgs, producer_wg, grid, stream)
                     : launch_wgs<kMode, 64, 2, kBulk, kTma>(map, a, wgs, producer_wg, grid, stream);
  }
  if (rows == 1) {
    return launch_wgs<kMode, 32, 1, kBulk, kTma>(map, a, wgs, producer_wg, grid, stream);
  }
  return rows == 2 ? launch_wgs<kMode, 32, 2, kBulk, kTma>(map, a, wgs, producer_wg, grid, stream)
                   : launch_wgs<kMode, 32, 4, kBulk, kTma>(map, a, wgs, producer_wg, grid, stream);
}

// The cache's values as a [blocks][64 rows][128 bytes] tensor (rows 128 bytes apart, blocks block_stride),
// boxes of one block's 64 rows with the 128-byte swizzle (the MMA descriptors' K-major layout). Encoded on
// every launch (host work, no device call); the map travels as a kernel parameter.
cudaError_t page_tensor_map(const k::KernelArgs& a, CUtensorMap* map) {
  const smxx::EncodeTiled encode = smxx::encode_tiled();
  if (encode == nullptr) {  // not cudaErrorNotSupported: the binding reads that as "not an SM90 GPU"
    return cudaErrorSymbolNotFound;
  }
  const cuuint64_t dims[3] = {cuuint64_t(k::kDim), cuuint64_t(k::kPage), cuuint64_t(a.num_blocks)};
  const cuuint64_t strides[2] = {cuuint64_t(k::kDim), cuuint64_t(a.block_stride)};  // bytes, multiples of 16
  const cuuint32_t box[3] = {cuuint32_t(k::kDim), cuuint32_t(k::kPage), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(a.cache), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The variant a config runs (PagedIndexerLogitsParams::config), defaults filled in: the one place the
// defaults are chosen. Measured on the H200, fp8 mode, H 64, 64 x 65536 (docs/design_indexer.md, Paged
// CUDA kernel), next_n 1: balanced + bulk + 3 warpgroups 141.8 us against 163.9 for chunks + cp.async +
// 3 (2 warpgroups: 153.4 balanced + bulk); next_n 2 (MMA N = 128): balanced + bulk + 3 math warpgroups fed
// by a producer warpgroup 182.4 us against 212.8 with 2 warpgroups (chunks + cp.async + 2: 220.7). 4 math
// warpgroups fed by a producer warpgroup at N <= 64 against 3 with a producer warp (H100, next_n 1, the
// same process): 195.7 against 196.9 us on distinct pages (the copy rate binds), 117.1 against 131.1 with
// the tables drawn from 2048 L2-resident pages (the math bound, which the H200's faster memory exposes).
// Loader 3 with 4 math warpgroups at N = 128 (fp8 mode) against 3 fed by a producer warpgroup with the bulk
// loader (H100, next_n 2, the same process): 203.0 against 205.3 us on distinct pages, 150.8 against 162.5 on
// L2-resident ones. Defaults: balanced; at MMA N <= 64 bulk and 4 math warpgroups fed by a producer
// warpgroup; at N = 128 loader 3 and 4 math warpgroups in the fp8 mode, bulk and 3 in the exact mode.
// Only for a valid config (the caller checks).
struct Variant {
  int wgs;  // math warpgroups
  bool producer_wg;
  bool bulk;
  bool tma;  // loader 3: TMA pages, A from shared memory (with bulk scales)
  bool balanced;
};

Variant resolve(int32_t config, int64_t heads, int rows, bool fp8_mma) {
  const int wgs = config % 10, schedule = config / 100;
  const bool producer_wg = wgs == 0 || wgs == 4 || wgs == 5;
  const bool n128_fp8 = heads * rows == 128 && fp8_mma;
  const int loader = config / 10 % 10 != 0 ? config / 10 % 10 : n128_fp8 && producer_wg ? 3 : 2;
  // A default warpgroup count follows the loader: 4 at N = 128 only with loader 3 (the others' A fragments
  // do not fit 112 registers there), so an explicit loader 1 or 2 keeps 3 fed by a producer warpgroup.
  const bool four = wgs == 5 || (wgs == 0 && (heads * rows <= 64 || loader == 3));
  const int math_wgs = four ? 4 : wgs == 0 || wgs == 4 ? 3 : wgs;
  return Variant{math_wgs, producer_wg, loader != 1, loader == 3, schedule != 1};
}

// Tokens per item: the MMA's N is rows * H <= 128; no padded rows where next_n fits.
int rows_per_item(int64_t heads, int64_t next_n) {
  const int max_rows = int(128 / heads);
  int rows = 1;
  while (rows < max_rows && rows < next_n) {
    rows *= 2;
  }
  return rows;
}

}  // namespace

const char* paged_indexer_logits_unsupported(const PagedIndexerLogitsParams& p) {
  if (p.heads != 32 && p.heads != 64) {
    return "the CUDA paged indexer kernel takes 32 or 64 heads";
  }
  if (p.head_dim != k::kDim) {
    return "the CUDA paged indexer kernel takes head dim 128";
  }
  if (p.config < 0 || p.config > 299 || p.config % 10 == 1 || p.config % 10 > 5 || p.config / 10 % 10 > 3) {
    return "config must be 3 decimal digits: schedule 0-2, loader 0-3, math warpgroups 0, 2, 3, 4 (3 fed by a "
           "producer warpgroup) or 5 (4 fed by a producer warpgroup)";
  }
  // The math threads' -inf fill (fill_neg_inf) strides up to 512 keys past the last one in int32.
  if (p.max_context_len > int64_t{INT32_MAX} - 16 * k::kPage) {
    return "the CUDA paged indexer kernel takes max_context_len below 2^31 - 1024";
  }
  if (p.next_n > 1024 || p.batch * p.next_n >= int64_t{1} << 28) {
    return "the CUDA paged indexer kernel takes next_n <= 1024 and fewer than 2^28 query rows";
  }
  if (p.batch * p.next_n * ((p.max_context_len + 2 * k::kPage - 1) / (2 * k::kPage)) >= int64_t{1} << 35) {
    return "the CUDA paged indexer kernel takes fewer than 2^35 128-position output tiles";
  }
  if (p.batch > 0 && p.next_n > 0 && p.max_context_len > 0) {
    const int rows = rows_per_item(p.heads, p.next_n);
    const Variant v = resolve(p.config, p.heads, rows, p.fp8_mma);
    const int mode = p.fp8_mma ? k::kFp8Mma : k::kFp8AsF16;
    if (v.tma && !(v.producer_wg && tma_offered(mode, int(p.heads), rows))) {
      return "config: loader 3 (TMA pages, the MMAs' A from shared memory) is offered with math warpgroups fed by "
             "a producer warpgroup (4 or 5) at MMA N = next_n tokens x heads = 128 in the fp8 mode (precise=False) "
             "only";
    }
    if (v.wgs == 4 && !v.tma && !four_wgs_offered(int(p.heads), rows)) {
      return "config: 5 (4 math warpgroups fed by a producer warpgroup) is offered at MMA N = next_n tokens x "
             "heads <= 64 (next_n 1 at 64 heads, <= 2 at 32), and at N = 128 with loader 3 only";
    }
    if (v.wgs == 3 && v.producer_wg && !producer_wg_offered(int(p.heads), rows)) {
      return "config: 4 (3 math warpgroups fed by a producer warpgroup) is offered at MMA N = next_n tokens x "
             "heads = 128 only (next_n >= 2 at 64 heads, >= 3 at 32); at N <= 64 config 3 runs 3 math warpgroups";
    }
    if (v.wgs == 3 && !v.producer_wg && !three_wgs_fit(int(p.heads), rows)) {
      return "config: 3 math warpgroups are offered at MMA N = next_n tokens x heads <= 64 only (next_n 1 at "
             "64 heads, <= 2 at 32)";
    }
    const int64_t tile_keys = int64_t(k::kPage) * v.wgs;
    const int64_t tiles = p.batch * ((p.next_n + rows - 1) / rows) * ((p.max_context_len + tile_keys - 1) / tile_keys);
    if (v.balanced && tiles >= int64_t{INT32_MAX}) {
      return "the CUDA paged indexer kernel's balanced schedule takes fewer than 2^31 - 1 tiles";
    }
  }
  if (p.num_blocks >= int64_t{INT32_MAX}) {
    return "the CUDA paged indexer kernel takes fewer than 2^31 - 1 cache blocks";
  }
  if (!is_aligned16(p.q) || p.q_batch_stride % 16 != 0 || p.q_token_stride % 16 != 0 || p.q_head_stride % 16 != 0) {
    return "the CUDA paged indexer kernel needs q's data and batch/token/head strides 16-byte aligned";
  }
  if (!is_aligned16(p.kv_cache) || p.block_stride % 16 != 0) {
    return "the CUDA paged indexer kernel needs kv_cache's data and block stride 16-byte aligned";
  }
  return nullptr;
}

cudaError_t launch_paged_indexer_logits(const PagedIndexerLogitsParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.next_n <= 0 || p.max_context_len <= 0) {
    return cudaSuccess;
  }
  if (paged_indexer_logits_unsupported(p) != nullptr) {
    return cudaErrorNotSupported;
  }
  int major = 0;
  DSA_CUDA_CHECK(current_arch_major(&major));
  if (major != 9) {  // wgmma exists on SM90 only
    return cudaErrorNotSupported;
  }
  int sms = 0;
  DSA_CUDA_CHECK(current_sm_count(&sms));

  const int rows = rows_per_item(p.heads, p.next_n);
  const Variant v = resolve(p.config, p.heads, rows, p.fp8_mma);
  const int wgs = v.wgs;
  const int64_t tile_keys = int64_t(k::kPage) * wgs;
  const int64_t max_chunk_tiles = k::kItemPages / wgs;
  const int64_t groups = (p.next_n + rows - 1) / rows;
  const int64_t row_blocks = p.batch * groups;
  const int64_t key_tiles = (p.max_context_len + tile_keys - 1) / tile_keys;
  const int64_t total_tiles = row_blocks * key_tiles;
  // kBalanced: items of up to 64 pages inside a CTA's range. kChunks: chunks of up to 64 pages, short
  // enough that there are about 8 items per SM when the requests alone do not give that (decode with few
  // requests), but never below one tile.
  const int64_t chunk_tiles =
      v.balanced ? max_chunk_tiles
                 : std::max<int64_t>(1, std::min<int64_t>(max_chunk_tiles,
                                                          (total_tiles + 8 * sms - 1) / (8 * int64_t(sms))));
  const int64_t chunks = (key_tiles + chunk_tiles - 1) / chunk_tiles;
  const int64_t items = row_blocks * chunks;  // < 2^31 under the tile limit above

  k::KernelArgs a;
  a.q = static_cast<const uint8_t*>(p.q);
  a.cache = static_cast<const uint8_t*>(p.kv_cache);
  a.weights = p.weights;
  a.ctx = p.context_lens;
  a.table = p.block_table;
  a.out = p.out;
  a.q_batch_stride = p.q_batch_stride;
  a.q_token_stride = p.q_token_stride;
  a.q_head_stride = p.q_head_stride;
  a.block_stride = p.block_stride;
  a.w_row_stride = p.weights_row_stride;
  a.w_head_stride = p.weights_head_stride;
  a.ctx_stride = p.context_lens_stride;
  a.table_row_stride = p.block_table_row_stride;
  a.table_col_stride = p.block_table_col_stride;
  a.out_row_stride = p.out_row_stride;
  a.next_n = int32_t(p.next_n);
  a.groups = int32_t(groups);
  a.row_blocks = int32_t(row_blocks);
  a.chunks = int32_t(chunks);
  a.chunk_tiles = int32_t(chunk_tiles);
  a.schedule = v.balanced ? k::kBalanced : k::kChunks;
  a.total_tiles = total_tiles;
  a.key_tiles = int32_t(key_tiles);
  a.width = int32_t(p.max_context_len);
  a.limit = int32_t(std::min<int64_t>(p.max_context_len, std::max<int64_t>(p.max_blocks, 0) * k::kPage));
  a.num_blocks = int32_t(std::max<int64_t>(p.num_blocks, 0));
  a.clean = p.clean;
  // kBalanced: every CTA gets at least one tile.
  const int grid = int(std::min<int64_t>(v.balanced ? total_tiles : items, sms));

  CUtensorMap map{};  // unused but by loader 3
  if (v.tma) {
    // With no blocks no page id is valid, so no TMA reads the map: it stays zero (a 0-block map cannot be
    // encoded) and the kernel does not prefetch it.
    if (a.num_blocks > 0) {
      DSA_CUDA_CHECK(page_tensor_map(a, &map));
    }
    return launch_variant<k::kFp8Mma, true, true>(map, a, p.heads, rows, wgs, v.producer_wg, grid, stream);
  }
  if (v.bulk) {
    return p.fp8_mma ? launch_variant<k::kFp8Mma, true>(map, a, p.heads, rows, wgs, v.producer_wg, grid, stream)
                     : launch_variant<k::kFp8AsF16, true>(map, a, p.heads, rows, wgs, v.producer_wg, grid, stream);
  }
  return p.fp8_mma ? launch_variant<k::kFp8Mma, false>(map, a, p.heads, rows, wgs, v.producer_wg, grid, stream)
                   : launch_variant<k::kFp8AsF16, false>(map, a, p.heads, rows, wgs, v.producer_wg, grid, stream);
}

}  // namespace dsa_cuda
