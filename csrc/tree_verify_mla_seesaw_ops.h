// tree_verify_mla v4 (sm_90a), the seesaw path's building blocks: smem map, barrier ids, TMA loads of KV tiles
// block by block (the tail tile's box ending at the request's last key), QK over a range of column blocks, the rope
// fragments, and the final rows' TMA stores.
// The schedule that uses them: csrc/tree_verify_mla_seesaw.h; plans/0004.
#pragma once
#include <cuda.h>  // CUtensorMap (a type only; the launcher encodes it through the runtime's driver entry point)

#include "ptx_tma.h"
#include "tree_verify_mla_tile.h"

namespace kdb {
namespace tvm {

// Smem map: v3's (Q | KV stage 0 | KV stage 1 | P | max | sum) with Q's block 8 reused for P of the odd tile once
// both warpgroups hold Q's rope columns in registers, max[wg][64] = the row max each warpgroup published last, and
// 18 mbarriers (stage x column block) after the sum.
constexpr int kSsOffPOdd = 8 * kColBlockBytes;
constexpr int kSsOffBar = kSmemUsed;
constexpr int kSsSmemBytes = kSmemUsed + 2 * 9 * 8 + 1024;  // 231,568 B
static_assert(kSsSmemBytes <= 232448, "H100/H200 allow 232,448 B of shared memory per block");
constexpr int kSsBarM0 = 5;   // warpgroup 0 -> 1: m of the even tile in max[0] and its P in smem
constexpr int kSsBarM1 = 6;   // 1 -> 0: m of the odd tile in max[1] and its P in smem
constexpr int kSsBarF0 = 7;   // 1 -> 0: warpgroup 1's PV on the even tile's P is done, its smem may be rewritten
constexpr int kSsBarS0 = 8;   // 0 -> 1: S of the next even tile is done, the next odd tile's QK may start

struct SeesawParams {
  Params p;
  CUtensorMap kv_map;  // [batch][cache_len][576] bf16, box 1 x 64 x 64, 128-byte swizzle (the smem tile layout)
  CUtensorMap o_map;   // [batch][T H][512] bf16, the same boxes: the final rows' stores (ss_store_final)
};

struct SsTile {  // one KV tile of the split as a warpgroup sees it
  uint32_t stage;   // smem address of its stage
  uint32_t bars;    // smem address of the stage's 9 mbarriers
  uint32_t parity;  // (local index / 2) & 1: the stage's use count
  int t;            // tile index within the request
  int shift;        // its box starts at cache row 64 t - shift (ss_tile); its columns < shift are masked
};

// Tile t's box is cache rows [64 t, 64 t + 64), except the tail tile of a request that ends inside the cache
// (kv_end < S): its box ends at kv_end instead, so no row of it is an unwritten cache slot (NaN in the tests, and
// P = 0 times NaN would reach O through V). Its first `shift` rows repeat the previous tile's keys (or, before the
// request's row 0, arrive as TMA's zero fill) and are masked. Rows at or past S arrive as zeros: outside the past + T
// <= S promise a visible column there scores 0, as v3's clamped loads give. No tile needs a zero fill, so neither
// warpgroup runs a barrier the other does not (the one that did made racecheck misreport, plans/0004 s8).
__device__ __forceinline__ SsTile ss_tile(uint32_t s_base, int t_begin, int i, int kv_end, int cache_len) {
  const uint32_t st = i & 1;
  const int t = t_begin + i, shift = kv_end < cache_len ? max(0, (t + 1) * kBlockN - kv_end) : 0;
  return {s_base + kOffKv + st * kTileBytes, s_base + kSsOffBar + 8 * 9 * st, static_cast<uint32_t>(i >> 1) & 1, t,
          shift};
}

// Column blocks [j0, j1) of tile k of request b into its stage, by one thread: one TMA box and one mbarrier per block.
__device__ __forceinline__ void ss_load(const SeesawParams& sp, const SsTile& k, int b, int j0, int j1) {
  const int y = k.t * kBlockN - k.shift;  // >= -63; TMA fills rows outside [0, S) with zeros
  for (int j = j0; j < j1; ++j) {
    mbar_expect_tx(k.bars + 8 * j, kColBlockBytes);
    tma_load_3d(k.stage + j * kColBlockBytes, &sp.kv_map, 64 * j, y, b, k.bars + 8 * j);
  }
}

// The masked tile's visibility words as its box holds it: bit r <=> cache row 64 t - shift + r, so the columns of
// tile t move up by shift and the repeated rows below them are invisible (tile_mask's bits past kv_end drop out).
__device__ __forceinline__ void ss_shift_vis(uint64_t (&vis)[2], const SsTile& k) {
  vis[0] <<= k.shift, vis[1] <<= k.shift;  // shift <= 63: the tile holds at least one row below kv_end
}

// S (+)= Q K^T over column blocks [J0, J1) of the tile, one commit group per block, each after its mbarrier (and a
// wgmma fence: the wait is a divergent spin, and a wgmma after it without one is serialized by ptxas); block 8
// (rope) takes A from registers. kFirst: the first blocks of this S (zeroes it, overwrite mode).
template <int J0, int J1, bool kFirst>
__device__ __forceinline__ void ss_qk(float (&s)[8][4], const uint32_t (&rope)[4][4], uint32_t q, const SsTile& k) {
  if constexpr (kFirst) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;  // defined input to the asm
  }
#pragma unroll
  for (int j = J0; j < J1; ++j) {
    mbar_wait(k.bars + 8 * j, k.parity);
    wgmma_fence();
    const uint64_t db = wgmma_desc(k.stage + j * kColBlockBytes, 16, 1024);
    if (j < 8) {
      const uint64_t da = wgmma_desc(q + j * kColBlockBytes, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_m64n64k16_ss(s, da + 2 * kk, db + 2 * kk, !(kFirst && j == J0 && kk == 0));
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_m64n64k16_rs(s, rope[kk], db + 2 * kk, !(kFirst && j == J0 && kk == 0));
    }
    wgmma_commit();
  }
}

// Q's rope columns (block 8) of the warp's 16 rows as wgmma A fragments, 4 k-steps (ldmatrix as the mma.sync path).
__device__ __forceinline__ void ss_load_rope(uint32_t (&rope)[4][4], uint32_t q, Role w) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ldsm_x4(rope[kk], q + 8 * kColBlockBytes + x4_off(16 * w.rg, w.lane, kk));
}

// The final O tile's stmatrix fragments: for columns 256 ch + 16 kk .. + 15 of the warp's 16 rows, fragment q holds
// n-tile ss_o_ntile(kk, q) of the accumulators (its row half q & 1: rows g, g + 8), the four 8 x 8 blocks of x4; lane l
// gives the address of row l % 8 of block l / 8 (checked on the host against the TMA box's swizzle:
// tests/tree_verify_mla_plan_check.cu).
__host__ __device__ __forceinline__ int ss_o_ntile(int kk, int q) { return 2 * kk + (q >> 1); }
__host__ __device__ __forceinline__ uint32_t ss_o_frag_off(int rg, int ch, int lane, int kk) {
  return x4_off(16 * rg, lane, 16 * ch + kk);
}

// Final rows (bf16 O and lse) of M-tile m0 of request b, through shared memory: O into KV stage 0 in the tile layout
// (16 stmatrix per thread, where epilogue_rows issues 64 scattered 4-byte global stores), then 8 TMA stores of its
// 64 x 64 blocks; rows past the request lie outside o_map's extent and are not written. Stage 0 is free here: each
// warpgroup writes the column half (blocks 4 ch .. 4 ch + 3) that only its own, waited, PV of the last even tile read
// (the other warpgroup's QK of that tile finished before the last pair), and no refill is in flight after the last
// pair. real[h]: the row's node is not padding (read before the pairs, so its load is off this path). Same values
// and rounding as epilogue_rows<kOutFinal>.
__device__ __forceinline__ void ss_store_final(const SeesawParams& sp, float (&acc)[32][4], RowState& st, uint8_t* smem,
                                               int b, int m0, Role w, const bool (&real)[2]) {
  const Params& p = sp.p;
  const int g = w.lane >> 2, c = w.lane & 3, rows = p.nodes * p.heads;
  share_row_sums(st, smem, w);
  float inv_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * w.rg + g + 8 * h, row = m0 + r;
    const float l = row_sum_total(st, smem, w, h, r);
    const bool seen = l > 0.f && real[h];
    inv_l[h] = seen ? 1.f / l : 0.f;
    if (w.ch == 0 && c == 0 && row < rows) p.lse[static_cast<size_t>(b) * rows + row] = seen ? st.m[h] * kLn2 + logf(l) : -INFINITY;
  }
  const uint32_t o_tile = smem_addr(smem) + kOffKv;
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    uint32_t frag[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float* a = acc[ss_o_ntile(kk, q)] + 2 * (q & 1);
      const __nv_bfloat162 v = __floats2bfloat162_rn(a[0] * inv_l[q & 1], a[1] * inv_l[q & 1]);
      frag[q] = *reinterpret_cast<const uint32_t*>(&v);
    }
    stsm_x4(o_tile + ss_o_frag_off(w.rg, w.ch, w.lane, kk), frag);
  }
  fence_proxy_async_smem();  // the TMA unit reads what the generic proxy wrote
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 0; j < kTvmDimV / 64; ++j) tma_store_3d(&sp.o_map, o_tile + j * kColBlockBytes, 64 * j, m0, b);
    bulk_commit();
    bulk_wait_read();  // stage 0 must stay until the TMA unit has read it (the CTA exits next)
  }
}

}  // namespace tvm
}  // namespace kdb
