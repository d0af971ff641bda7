// Launcher of dsa.indexer_logits: the SM90 kernels (include/dsa_cuda/sm90_indexer_logits*.cuh) on compute
// capability 9.x, the SM100 one (sm100_indexer_logits.cuh; compiled, not run) on 10.x.
// Torch-free: the compile gates build this file alone with nvcc.
#include "dsa_cuda/indexer_logits.cuh"

#include <algorithm>

namespace dsa_cuda {
namespace {

namespace k = sm90_indexer;
namespace k100 = sm100_indexer;

template <int kMode, int kHeads>
cudaError_t launch(const k::KernelArgs& a, int grid, cudaStream_t stream) {
  using C = k::Cfg<kMode>;
  constexpr auto kernel = &k::indexer_logits_kernel<kMode, kHeads>;
  return launch_pdl_smem<kernel>(dim3(unsigned(grid)), dim3(C::kThreads), C::kSmemBytes, stream, a);
}

template <int kMode>
cudaError_t launch_mode(const k::KernelArgs& a, int64_t heads, int grid, cudaStream_t stream) {
  return heads == 64 ? launch<kMode, 64>(a, grid, stream) : launch<kMode, 32>(a, grid, stream);
}

using smxx::EncodeTiled;
using smxx::encode_tiled;

// The keys as a [N, 128] byte tensor, boxes of `box_rows` keys x 128 bytes with the 128-byte swizzle (the
// MMA descriptors' K-major layout), rows past N zero-filled. Encoded on every launch (host work, no device
// call); the map travels as a kernel parameter.
cudaError_t kv_tensor_map(EncodeTiled encode, const k::KernelArgs& a, int box_rows, CUtensorMap* map) {
  const cuuint64_t dims[2] = {cuuint64_t(k::kDim), cuuint64_t(a.keys)};
  const cuuint64_t strides[1] = {cuuint64_t(a.kv_row_stride)};  // bytes; a multiple of 16 (checked)
  const cuuint32_t box[2] = {cuuint32_t(k::kDim), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(a.kv), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The key scales as a 1-D fp32 tensor, boxes of `box` keys, past N zero-filled (contiguous and 16-byte aligned:
// sm90_tma_takes).
cudaError_t scale_tensor_map(EncodeTiled encode, const k::KernelArgs& a, int box, CUtensorMap* map) {
  const cuuint64_t dims[1] = {cuuint64_t(a.keys)};
  const cuuint64_t strides[1] = {0};  // rank 1: no stride is read
  const cuuint32_t boxes[1] = {cuuint32_t(box)};
  const cuuint32_t elem_strides[1] = {1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, const_cast<float*>(a.kv_scale), dims, strides,
                            boxes, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int kWgs, int kMode = k::kFp8Mma>
cudaError_t launch_tma(const k::KernelArgs& a, int64_t heads, int grid, cudaStream_t stream) {
  using C = k::TmaCfg<kWgs, kMode>;
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) {  // not cudaErrorNotSupported: the binding reads that as "not an SM90 GPU"
    return cudaErrorSymbolNotFound;
  }
  CUtensorMap map, scale_map;
  DSA_CUDA_CHECK(kv_tensor_map(encode, a, C::kTileKeys, &map));
  if constexpr (C::kScaleBytes > 0) {
    DSA_CUDA_CHECK(scale_tensor_map(encode, a, C::kTileKeys, &scale_map));
  } else {
    scale_map = map;  // not read
  }
  const dim3 block(C::kThreads);
  if (heads == 64) {
    return launch_pdl_smem<&k::indexer_logits_tma_kernel<kWgs, 64, kMode>>(dim3(unsigned(grid)), block,
                                                                           C::kSmemBytes, stream, map, scale_map, a);
  }
  return launch_pdl_smem<&k::indexer_logits_tma_kernel<kWgs, 32, kMode>>(dim3(unsigned(grid)), block,
                                                                         C::kSmemBytes, stream, map, scale_map, a);
}

// SM100: the keys' map with 128-key boxes and q as [T][H][128] bytes, boxes of the item's 128 / H rows x H
// heads (rows past T zero-filled), 128-byte swizzle.
cudaError_t launch_sm100(const k::KernelArgs& a, int64_t heads, int grid, cudaStream_t stream) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) {
    return cudaErrorSymbolNotFound;
  }
  CUtensorMap kv_map, q_map;
  DSA_CUDA_CHECK(kv_tensor_map(encode, a, k100::kTileKeys, &kv_map));
  const cuuint64_t dims[3] = {cuuint64_t(k::kDim), cuuint64_t(heads), cuuint64_t(a.rows)};
  const cuuint64_t strides[2] = {cuuint64_t(a.q_head_stride), cuuint64_t(a.q_row_stride)};  // bytes
  const cuuint32_t box[3] = {cuuint32_t(k::kDim), cuuint32_t(heads), cuuint32_t(k::kN / heads)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(&q_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(a.q), dims, strides,
                            box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return cudaErrorInvalidValue;
  }
  const dim3 block(k100::kThreads);
  if (heads == 64) {
    return launch_pdl_smem<&k100::indexer_logits_kernel<64>>(dim3(unsigned(grid)), block, k100::kSmemBytes, stream,
                                                             kv_map, q_map, a);
  }
  return launch_pdl_smem<&k100::indexer_logits_kernel<32>>(dim3(unsigned(grid)), block, k100::kSmemBytes, stream,
                                                           kv_map, q_map, a);
}

// The kernel a config runs, the default filled in: the one place it is chosen. H200, fp8 MMAs, 4096 rows, one
// run (docs/design_indexer.md, TMA kernel): 32768 keys H 64 causal: TMA with 4 math warpgroups 2117 us, 3
// 2302, cp.async 2998 (DeepGEMM 1941); 131072 causal: 9023 / 9594 / 11914 (9291); H 32, 32768 full: 1256 /
// 1298 / 1717 (1117). TMA needs fp8 operands with fp8 MMAs and rows that do not overlap (a tensor map's row
// stride is at least its 128-byte row). fp8 operands in the exact mode take config 4 (TMA, 3 math warpgroups, fp16
// MMAs from e4m3 widened in registers; bitwise config 3): H200, H 64, 4096 x 32768 full / causal, 131072 causal,
// H 32 32768 full: 3776 / 3534 / 14361 / 2017 us against cp.async 4396 / 4155 / 16929 / 2381 (Triton 3912 /
// 3742 / 15458 / 2125). Everything else runs the cp.async kernel.
enum class Kernel { kCpAsync, kTma4, kTma3, kTma3F16 };

bool tma_takes(const IndexerLogitsParams& p) {
  return p.dtype == IndexerDtype::kFp8E4m3 && p.fp8_mma && p.kv_row_stride >= k::kDim;
}

// The SM90 fp8-MMA TMA kernels (configs 1 and 2): tma_takes, and each stage's key scales copied by TMA, so
// kv_scale contiguous and 16-byte aligned.
bool sm90_tma_takes(const IndexerLogitsParams& p) {
  return tma_takes(p) && p.kv_scale != nullptr && p.kv_scale_stride == 1 && is_aligned16(p.kv_scale);
}

bool tma_f16_takes(const IndexerLogitsParams& p) {
  return p.dtype == IndexerDtype::kFp8E4m3 && !p.fp8_mma && p.kv_row_stride >= k::kDim;
}

Kernel resolve(const IndexerLogitsParams& p) {
  switch (p.config) {
    case 1:
      return Kernel::kTma4;
    case 2:
      return Kernel::kTma3;
    case 3:
      return Kernel::kCpAsync;
    case 4:
      return Kernel::kTma3F16;
    default:
      return sm90_tma_takes(p) ? Kernel::kTma4 : tma_f16_takes(p) ? Kernel::kTma3F16 : Kernel::kCpAsync;
  }
}

}  // namespace

const char* indexer_logits_unsupported(const IndexerLogitsParams& p) {
  if (p.heads != 32 && p.heads != 64) {
    return "the CUDA indexer kernel takes 32 or 64 heads";
  }
  if (p.head_dim != k::kDim) {
    return "the CUDA indexer kernel takes head dim 128";
  }
  if (p.rows >= int64_t{INT32_MAX}) {
    return "the CUDA indexer kernel takes fewer than 2^31 - 1 rows";
  }
  // The math threads' -inf fill (fill_neg_inf) strides up to 512 keys past the last one in int32.
  if (p.keys > int64_t{INT32_MAX} - 16 * k::kWgKeys) {
    return "the CUDA indexer kernel takes fewer than 2^31 - 1024 keys";
  }
  const int64_t elem = p.dtype == IndexerDtype::kBf16 ? 2 : 1;
  if (!is_aligned16(p.q) || (p.q_row_stride * elem) % 16 != 0 || (p.q_head_stride * elem) % 16 != 0) {
    return "the CUDA indexer kernel needs q's data and row/head strides 16-byte aligned";
  }
  if (!is_aligned16(p.kv) || (p.kv_row_stride * elem) % 16 != 0) {
    return "the CUDA indexer kernel needs kv's data and row stride 16-byte aligned";
  }
  if (p.dtype == IndexerDtype::kFp8E4m3 && p.kv_scale == nullptr) {
    return "fp8 keys need kv_scale";
  }
  if (p.config < 0 || p.config > 4) {
    return "the CUDA indexer kernel's config is 0 (default), 1 or 2 (TMA key tiles, 4 or 3 math warpgroups), 3 "
           "(cp.async key tiles) or 4 (TMA key tiles, exact mode)";
  }
  if ((p.config == 1 || p.config == 2) && !sm90_tma_takes(p)) {
    return "configs 1 and 2 (TMA key tiles, A from shared memory) take fp8 operands with fp8 MMAs (precise=False), "
           "kv rows that do not overlap (row stride >= 128) and contiguous, 16-byte aligned kv_scale";
  }
  if (p.config == 4 && !tma_f16_takes(p)) {
    return "config 4 (TMA key tiles, A widened to fp16 in registers) takes fp8 operands in the exact mode "
           "(precise=True) and kv rows that do not overlap (row stride >= 128)";
  }
  return nullptr;
}

cudaError_t launch_indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.keys <= 0) {
    return cudaSuccess;
  }
  if (indexer_logits_unsupported(p) != nullptr) {
    return cudaErrorNotSupported;
  }
  int major = 0;
  DSA_CUDA_CHECK(current_arch_major(&major));
  // wgmma on SM90; on the SM100 family the tcgen05 kernel, which takes what the SM90 TMA kernels take
  // (config 0 only) with Q heads that do not overlap.
  const bool sm100 = major == 10;
  if (major != 9 && !(sm100 && p.config == 0 && tma_takes(p) && p.q_head_stride >= k::kDim)) {
    return cudaErrorNotSupported;
  }
  int sms = 0;
  DSA_CUDA_CHECK(current_sm_count(&sms));

  const int64_t elem = p.dtype == IndexerDtype::kBf16 ? 2 : 1;
  const int64_t rows_per_item = k::kN / p.heads;
  const int64_t row_blocks = (p.rows + rows_per_item - 1) / rows_per_item;
  // 128 keys a stage in every mode of the cp.async kernel, 256 with TMA and 4 warpgroups, 192 with 3.
  // SM100: 128 keys a tile (the MMA's M).
  const Kernel kernel = resolve(p);
  const int64_t tile_keys = sm100                     ? k100::kTileKeys
                            : kernel == Kernel::kTma4 ? k::TmaCfg<4>::kTileKeys
                            : kernel == Kernel::kTma3 || kernel == Kernel::kTma3F16 ? k::TmaCfg<3>::kTileKeys
                                                      : k::Cfg<k::kFp8Mma>::kTileKeys;
  const int64_t key_tiles = (p.keys + tile_keys - 1) / tile_keys;
  // Chunks of at most kMaxChunkTiles x 128 keys (bounded Q reloads), and enough items for every SM to
  // have several (load balance) when the rows alone do not give that. The TMA kernels take 4x longer
  // chunks (fewer Q restages): H200, 4096 x 131072 causal H 64, 4 warpgroups 9316 -> 9023 us (DeepGEMM
  // 9291), 3 warpgroups 10012-10479 -> 9544-9568 in two runs; at 32768 keys 0-4% and within the spread.
  const int64_t chunk_keys = (sm100 || kernel != Kernel::kCpAsync ? 4 : 1) * k::kMaxChunkTiles * 128;
  const int64_t max_chunk_tiles = chunk_keys / tile_keys;
  int64_t chunks = (key_tiles + max_chunk_tiles - 1) / max_chunk_tiles;
  chunks = std::max(chunks, std::min(key_tiles, (8 * int64_t(sms) + row_blocks - 1) / row_blocks));
  const int64_t chunk_tiles = (key_tiles + chunks - 1) / chunks;
  chunks = (key_tiles + chunk_tiles - 1) / chunk_tiles;

  k::KernelArgs a;
  a.q = static_cast<const uint8_t*>(p.q);
  a.kv = static_cast<const uint8_t*>(p.kv);
  a.kv_scale = p.kv_scale;
  a.weights = p.weights;
  a.ks = p.ks;
  a.ke = p.ke;
  a.out = p.out;
  a.rows = p.rows;
  a.q_row_stride = p.q_row_stride * elem;
  a.q_head_stride = p.q_head_stride * elem;
  a.kv_row_stride = p.kv_row_stride * elem;
  a.kv_scale_stride = p.kv_scale_stride;
  a.w_row_stride = p.weights_row_stride;
  a.w_head_stride = p.weights_head_stride;
  a.ks_stride = p.ks_stride;
  a.ke_stride = p.ke_stride;
  a.out_row_stride = p.out_row_stride;
  a.row_blocks = int32_t(row_blocks);
  a.chunks = int32_t(chunks);
  const int64_t items = row_blocks * chunks;
  a.keys = int32_t(p.keys);
  a.key_tiles = int32_t(key_tiles);
  a.chunk_tiles = int32_t(chunk_tiles);
  a.clean = p.clean;
  const int grid = int(std::min<int64_t>(items, sms));
  // TailSplitCursor's share arithmetic is 32-bit: grid x tail_tiles < sms^2 x 342 (chunk_tiles <= 65536 / 192).
  a.tail_item = int32_t(items / grid * grid);
  a.tail_tiles = int32_t((items - a.tail_item) * chunk_tiles);
  if (int64_t(grid) * a.tail_tiles >= int64_t{INT32_MAX}) {
    a.tail_item = int32_t(items);  // no split (not reached below ~2500 SMs)
    a.tail_tiles = 0;
  }

  if (sm100) {
    return launch_sm100(a, p.heads, grid, stream);
  }
  switch (kernel) {
    case Kernel::kTma4:
      return launch_tma<4>(a, p.heads, grid, stream);
    case Kernel::kTma3:
      return launch_tma<3>(a, p.heads, grid, stream);
    case Kernel::kTma3F16:
      return launch_tma<3, k::kFp8AsF16>(a, p.heads, grid, stream);
    default:
      break;
  }
  if (p.dtype == IndexerDtype::kBf16) {
    return launch_mode<k::kBf16>(a, p.heads, grid, stream);
  }
  return p.fp8_mma ? launch_mode<k::kFp8Mma>(a, p.heads, grid, stream)
                   : launch_mode<k::kFp8AsF16>(a, p.heads, grid, stream);
}

}  // namespace dsa_cuda
