// tree_verify_mla: absorbed MLA attention under a tree ancestor mask, bf16 tensor cores, fp32 softmax.
// One CTA = 64 query rows (row = node * H + head) x one KV split; each 64-token x 576 KV tile is loaded once
// into shared memory and read both as K (576 columns) and V (first 512). Four MMA paths over one smem layout:
// the wgmma seesaw with TMA loads (sm_90a, the default there: tree_verify_mla_seesaw.h), the wgmma ping-pong
// (sm_90a, v3: tree_verify_mla_pingpong.h), wgmma lock-step (sm_90a, v2) and mma.sync (sm_80+ instructions, eight
// warps); all need ~231 KB of shared memory per block (H100/H200 class). Shared helpers: tree_verify_mla_tile.h.
// Design: plans/0004-kernels.md.
#include "tree_verify_mla.h"

#include "common.h"
#include "ptx_mma.h"
#include "tree_verify_mla_pingpong.h"
#include "tree_verify_mla_plan.h"
#include "tree_verify_mla_seesaw.h"
#include "tree_verify_mla_tile.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <cmath>

namespace kdb {
namespace tvm {

// ---- mma.sync path ----
// Per-lane ldmatrix offsets: off[i] = tile_off(row, 2 i + hi); chunk 8 k + 2 i + hi of the same row is at
// off[i] + k * kColBlockBytes, so the unrolled loops use 4 registers plus immediates.
__device__ __forceinline__ void chunk_offsets(uint32_t (&off)[4], int row, int hi) {
#pragma unroll
  for (int i = 0; i < 4; ++i) off[i] = tile_off(row, 2 * i + hi);
}

// S[16 x 32] = Q[rows 16*rg.., 576] . K[tokens 32*ch.., 576]^T; s[nt] covers tile columns 32*ch + 8*nt.
// ldmatrix A: lanes 0-15 address rows 0-15 at k-chunk 2kk, lanes 16-31 the same rows at 2kk+1.
// ldmatrix B (x4 = two n8 tiles): lanes 0-7 tokens 0-7 chunk 2kk, 8-15 tokens 0-7 chunk 2kk+1,
// 16-23 tokens 8-15 chunk 2kk, 24-31 tokens 8-15 chunk 2kk+1 -> {b0, b1} of n-tile 0, {b0, b1} of n-tile 1.
__device__ __forceinline__ void qk_tile_mma(float (&s)[4][4], uint32_t q_tile, uint32_t k_tile, Role w) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  uint32_t a_off[4], b_off[4];
  chunk_offsets(a_off, 16 * w.rg + (w.lane & 15), w.lane >> 4);
  chunk_offsets(b_off, 32 * w.ch + (w.lane & 7) + ((w.lane >> 4) << 3), (w.lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < kTvmDimQK / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(a, q_tile + a_off[kk & 3] + kColBlockBytes * (kk >> 2));
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // tokens +16 rows: same (row & 7), so the same swizzle
      uint32_t b[4];
      ldsm_x4(b, k_tile + b_off[kk & 3] + kColBlockBytes * (kk >> 2) + 16 * 128 * p);
      mma_16816(s[2 * p], a, b[0], b[1]);
      mma_16816(s[2 * p + 1], a, b[2], b[3]);
    }
  }
}

// O[16 x 256] += P[rows 16*rg.., 64 tokens] . V[64 tokens, dims 256*ch..]; acc[j] covers dims 256*ch + 8*j.
// ldmatrix.trans B (x4): lanes 0-7 tokens 0-7 dims +0, 8-15 tokens 8-15 dims +0, 16-23 tokens 0-7 dims +8,
// 24-31 tokens 8-15 dims +8 -> {b0, b1} of n-tile 2jj, {b0, b1} of n-tile 2jj+1.
__device__ __forceinline__ void pv_tile_mma(float (&acc)[32][4], uint32_t p_tile, uint32_t v_tile, Role w) {
  uint32_t a_off[4], v_off[4];
  chunk_offsets(a_off, 16 * w.rg + (w.lane & 15), w.lane >> 4);
  chunk_offsets(v_off, (w.lane & 7) + (((w.lane >> 3) & 1) << 3), w.lane >> 4);
#pragma unroll
  for (int kt = 0; kt < kBlockN / 16; ++kt) {
    uint32_t a[4];
    ldsm_x4(a, p_tile + a_off[kt]);
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {  // dims 256*ch + 16*jj = block 4*ch + jj/4, chunk 2*(jj%4) (+1)
      uint32_t b[4];
      ldsm_x4_trans(b, v_tile + v_off[jj & 3] + kColBlockBytes * (4 * w.ch + (jj >> 2)) + 16 * 128 * kt);
      mma_16816(acc[2 * jj], a, b[0], b[1]);
      mma_16816(acc[2 * jj + 1], a, b[2], b[3]);
    }
  }
}

// ---- wgmma path (sm_90a): the warpgroup's 4 warps share each B operand, read once from smem by the MMA ----
// S[64 x 32] = Q[64 x 576] . K[tokens 32*ch.., 576]^T: 9 column blocks x 4 k16 steps, both K-major.
// A k16 step advances the start address by 32 B inside the swizzle atom (the hardware applies the XOR).
__device__ __forceinline__ void qk_tile_wgmma(float (&s)[4][4], uint32_t q_tile, uint32_t k_tile, Role w) {
  const uint64_t da = wgmma_desc(q_tile, 16, 1024), db = wgmma_desc(k_tile + 32 * 128 * w.ch, 16, 1024);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;  // defined input to the asm
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTvmDimQK / 16; ++kk) {
    const uint64_t step = (kColBlockBytes * (kk >> 2) + 32 * (kk & 3)) >> 4;  // in the 16-byte address units
    wgmma_m64n32k16<0>(s, da + step, db + step, kk > 0);
  }
  wgmma_commit();
  wgmma_wait_all();
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) reg_fence(s[nt][0]), reg_fence(s[nt][1]), reg_fence(s[nt][2]), reg_fence(s[nt][3]);
}

// O[64 x 256] += P[64 x 64 tokens] . V[64 tokens x dims 256*ch..]: P K-major, V MN-major (tokens are rows of
// 128 B per 64-dim block): lbo = 8 KB to the next dim block, sbo = 1 KB to the next 8 tokens.
__device__ __forceinline__ void pv_tile_wgmma(float (&acc)[32][4], uint32_t p_tile, uint32_t v_tile, Role w) {
  const uint64_t da = wgmma_desc(p_tile, 16, 1024);
  const uint64_t db = wgmma_desc(v_tile + 4 * w.ch * kColBlockBytes, kColBlockBytes, 1024);
  wgmma_fence();
#pragma unroll
  for (int kt = 0; kt < kBlockN / 16; ++kt) wgmma_m64n256k16<1>(acc, da + ((32 * kt) >> 4), db + ((16 * 128 * kt) >> 4), 1);
  wgmma_commit();
  wgmma_wait_all();
#pragma unroll
  for (int j = 0; j < 32; ++j) reg_fence(acc[j][0]), reg_fence(acc[j][1]), reg_fence(acc[j][2]), reg_fence(acc[j][3]);
}

// Online softmax for one tile: mask (tail tiles only), row max across the two column halves, rescale O,
// write P (bf16). Ends with the barrier that publishes P to its readers: the warp pair (mma.sync reads its
// own 16 rows) or the CTA after an async-proxy fence (each warpgroup's wgmma reads all 64 rows).
template <bool kWgmma>
__device__ __forceinline__ void softmax_tile(float (&s)[4][4], float (&acc)[32][4], RowState& st,
                                             const uint64_t (&vis)[2], bool masked, float scale_log2,
                                             uint8_t* smem, Role w) {
  float* red_max = reinterpret_cast<float*>(smem + kOffMax);  // [2 halves][64 rows]
  const int g = w.lane >> 2, c = w.lane & 3, rg = w.rg, ch = w.ch;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1, col = 32 * ch + 8 * nt + 2 * c + (e & 1);
      const float x = s[nt][e] * scale_log2;
      s[nt][e] = (!masked || ((vis[h] >> col) & 1)) ? x : -INFINITY;  // select, never multiply by 0
      mx[h] = fmaxf(mx[h], s[nt][e]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    if (c == 0) red_max[ch * kBlockM + 16 * rg + g + 8 * h] = mx[h];
  }
  pair_sync(rg);
  float m_new[2], m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) m_new[h] = fmaxf(st.m[h], fmaxf(mx[h], red_max[(ch ^ 1) * kBlockM + 16 * rg + g + 8 * h]));
  rescale(acc, st, m_new, m_use);
  uint8_t* p_tile = smem + kOffP;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = exp2f(s[nt][2 * h] - m_use[h]), p1 = exp2f(s[nt][2 * h + 1] - m_use[h]);
      st.l[h] += p0 + p1;
      const int row = 16 * rg + g + 8 * h, chunk = 4 * ch + nt;  // column 32*ch + 8*nt + 2c
      *reinterpret_cast<__nv_bfloat162*>(p_tile + tile_off(row, chunk) + 4 * c) = __floats2bfloat162_rn(p0, p1);
    }
  }
  if constexpr (kWgmma) {
    fence_proxy_async_smem();
    __syncthreads();
  } else {
    pair_sync(rg);
  }
}

// Grid (row tiles, splits, batch). Each CTA walks KV tiles [t_begin, t_end) of its split with a
// two-stage cp.async pipeline: tile t+1 loads while tile t is multiplied.
template <bool kSplit, bool kWgmma>
__global__ void __launch_bounds__(kThreads, 1) tree_verify_mla_kernel(const Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // wgmma's swizzle atoms are 1024-byte aligned: round the base up (kSmemBytes includes the slack).
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int b = blockIdx.z, split = blockIdx.y, m0 = blockIdx.x * kBlockM;
  const Role w = role<kWgmma>();
  const int rows = p.nodes * p.heads;
  const auto [past, kv_end, t_begin, t_end] = split_tiles(p, b, split);
  const __nv_bfloat16* kv = p.kv + static_cast<size_t>(b) * p.cache_len * kTvmDimQK;
  const uint32_t s_base = smem_addr(smem);
  if (t_begin < t_end) {
    load_tile<kThreads>(s_base, p.q + static_cast<size_t>(b) * rows * kTvmDimQK, m0, rows, threadIdx.x);  // Q rows >= rows: zeros
    load_tile<kThreads>(s_base + kOffKv, kv, t_begin * kBlockN, kv_end, threadIdx.x);
    cp_async_commit();
  }
  const uint64_t* anc_row[2];
  anc_rows(p, b, m0, w, anc_row);
  float acc[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait_all();
    if constexpr (kWgmma) fence_proxy_async_smem();  // cp.async wrote through the generic proxy
    __syncthreads();  // tile t visible to all; every warp is done with tile t-1, so its stage can refill
    const uint32_t kv_tile = s_base + kOffKv + ((t - t_begin) & 1) * kTileBytes;
    if (t + 1 < t_end) {
      load_tile<kThreads>(s_base + kOffKv + ((t + 1 - t_begin) & 1) * kTileBytes, kv, (t + 1) * kBlockN, kv_end,
                            threadIdx.x);
      cp_async_commit();
    }
    float s[4][4];
    if constexpr (kWgmma) {
      qk_tile_wgmma(s, s_base, kv_tile, w);
    } else {
      qk_tile_mma(s, s_base, kv_tile, w);
    }
    uint64_t vis[2];
    const bool masked = tile_mask(p, t, past, anc_row, vis);
    softmax_tile<kWgmma>(s, acc, st, vis, masked, p.scale_log2, smem, w);
    if constexpr (kWgmma) {
      pv_tile_wgmma(acc, s_base + kOffP, kv_tile, w);
    } else {
      pv_tile_mma(acc, s_base + kOffP, kv_tile, w);
    }
  }
  epilogue<kSplit>(p, acc, st, smem, b, split, m0, w);
}

// Partial row r of each split's block -> its output row over the batch, or -1: a tail unit's M-tile rows past the
// request (the epilogue wrote nothing there). Uniform splits: blocks of B x T x H rows, r is the row itself.
__host__ __device__ __forceinline__ int combine_out_row(const Params& p, int r) {
  const int rows = p.nodes * p.heads;
  if (p.tail_pieces == 0) return r < p.batch * rows ? r : -1;
  if (r >= p.tail_rows) return -1;
  const int row_tiles = row_tiles_of(p.nodes, p.heads), unit = p.tail_start + r / kBlockM;
  const int row = (unit % row_tiles) * kBlockM + r % kBlockM;
  return row < rows ? (unit / row_tiles) * rows + row : -1;
}

// Merges the partials per row: o = sum_s w_s o_s / sum_s w_s, w_s = exp(lse_s - max lse). One warp per row, 16
// floats per lane. Rows with every split empty (padding nodes) get o = 0, lse = -inf.
__global__ void __launch_bounds__(256) tree_verify_mla_combine(const Params p) {
  const int lane = threadIdx.x & 31, r = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int row = combine_out_row(p, r);
  if (row < 0) return;
  const bool tail = p.tail_pieces > 0;
  const int parts = tail ? p.tail_pieces : p.num_splits;
  const size_t stride = tail ? p.tail_rows : static_cast<size_t>(p.batch) * p.nodes * p.heads;
  float m = -INFINITY;
  for (int s = 0; s < parts; ++s) m = fmaxf(m, p.part_lse[s * stride + r]);
  float4 acc[4] = {};
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < parts; ++s) {
      const size_t prow = s * stride + r;
      const float w = expf(p.part_lse[prow] - m);  // 0 for empty splits, whose partial o is 0
      sum += w;
      const float4* src = reinterpret_cast<const float4*>(p.part_o + prow * kTvmDimV);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = src[lane + 32 * i];
        acc[i].x += w * v.x, acc[i].y += w * v.y, acc[i].z += w * v.z, acc[i].w += w * v.w;
      }
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.o_lat + static_cast<size_t>(row) * kTvmDimV);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * (lane + 32 * i)] = __floats2bfloat162_rn(acc[i].x * inv, acc[i].y * inv);
    out[2 * (lane + 32 * i) + 1] = __floats2bfloat162_rn(acc[i].z * inv, acc[i].w * inv);
  }
  if (lane == 0) p.lse[row] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

}  // namespace tvm

using namespace tvm;  // this file's own kernels and constants

int tree_verify_mla_smem_bytes() { return std::max({kSmemBytes, kPpSmemBytes, kSsSmemBytes}); }

namespace {
// The seesaw path's tensor map of the cache: [batch][cache_len][576] bf16 (innermost first below), boxes of one
// request's 64 rows x 64 columns with the 128-byte swizzle, i.e. one smem column block. Three dimensions, not
// batch x cache_len rows, so that a box reaching before row 0 or past row S of its request arrives as zeros instead
// of a neighbour's rows (the tail tile's box, csrc/tree_verify_mla_seesaw_ops.h). The final O's map is the same over
// [batch][T H][512] (ss_store_final): rows past T H are outside it. The encoder is the driver's, reached through the
// runtime, so the extension does not link libcuda.
cudaError_t encode_rows_map(CUtensorMap* map, const __nv_bfloat16* base, int batch, int rows, int cols) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint64_t row_bytes = cols * sizeof(__nv_bfloat16);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {row_bytes, row_bytes * rows};  // bytes, of dims 1 and 2
  const cuuint32_t box[3] = {64, kBlockN, 1}, elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(base), dims, strides,
                            box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t launch_seesaw(const Params& p, dim3 grid, bool split, cudaStream_t stream) {
  SeesawParams sp{p, {}, {}};
  KDB_CUDA_TRY(encode_rows_map(&sp.kv_map, p.kv, p.batch, p.cache_len, kTvmDimQK));
  const bool tail = p.tail_pieces > 0;
  if (tail || !split)  // the uniform split's kernel writes partials only: its launch skips the O map
    KDB_CUDA_TRY(encode_rows_map(&sp.o_map, p.o_lat, p.batch, p.nodes * p.heads, kTvmDimV));
  void (*kernel)(SeesawParams) = tail    ? tree_verify_mla_seesaw_kernel<kOutTail>
                                 : split ? tree_verify_mla_seesaw_kernel<kOutPartial>
                                         : tree_verify_mla_seesaw_kernel<kOutFinal>;
  KDB_CUDA_TRY(allow_dynamic_smem(kernel, kSsSmemBytes));
  kernel<<<grid, kThreads, kSsSmemBytes, stream>>>(sp);
  return cudaSuccess;
}

}  // namespace


cudaError_t tree_verify_mla_launch(const TreeVerifyMlaArgs& a, cudaStream_t stream) {
  if (a.shape.batch == 0) return cudaSuccess;
  if (a.plan.tail_pieces > 0 && a.path != TvmPath::kSeesaw) return cudaErrorInvalidValue;  // only v4 decodes it
  const auto [p, grid, part_rows] = plan_launch(a);
  const bool split = part_rows > 0;
  if (a.path == TvmPath::kSeesaw) {
    KDB_CUDA_TRY(launch_seesaw(p, grid, split, stream));
  } else {
    void (*kernel)(Params) = nullptr;
    switch (a.path) {
      case TvmPath::kPingPong: kernel = split ? tree_verify_mla_pingpong_kernel<true> : tree_verify_mla_pingpong_kernel<false>; break;
      case TvmPath::kWgmma: kernel = split ? tree_verify_mla_kernel<true, true> : tree_verify_mla_kernel<false, true>; break;
      default: kernel = split ? tree_verify_mla_kernel<true, false> : tree_verify_mla_kernel<false, false>; break;
    }
    const int smem = a.path == TvmPath::kPingPong ? kPpSmemBytes : kSmemBytes;
    KDB_CUDA_TRY(allow_dynamic_smem(kernel, smem));
    kernel<<<grid, kThreads, smem, stream>>>(p);
  }
  if (split) {
    const int rows_per_block = 8;  // one warp per row
    tree_verify_mla_combine<<<static_cast<unsigned>((part_rows + rows_per_block - 1) / rows_per_block),
                              32 * rows_per_block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kdb
