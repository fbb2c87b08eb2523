// tree_verify_mla v4 (sm_90a), the seesaw path's building blocks: smem map, barrier ids, TMA loads of KV tiles
// block by block, the tail-tile zero fill, QK over a range of column blocks, the rope fragments.
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
constexpr int kSsBarWg = 9;   // + wg, 128 threads: the warpgroup's zero fill of a tail tile is done

struct SeesawParams {
  Params p;
  CUtensorMap kv_map;  // [batch * cache_len rows, 576] bf16, box 64 x 64, 128-byte swizzle (the smem tile layout)
};

struct SsTile {  // one KV tile of the split as a warpgroup sees it
  uint32_t stage;   // smem address of its stage
  uint32_t bars;    // smem address of the stage's 9 mbarriers
  uint32_t parity;  // (local index / 2) & 1: the stage's use count
  int t;            // tile index within the request
};
__device__ __forceinline__ SsTile ss_tile(uint32_t s_base, int t_begin, int i) {
  const uint32_t st = i & 1;
  return {s_base + kOffKv + st * kTileBytes, s_base + kSsOffBar + 8 * 9 * st, static_cast<uint32_t>(i >> 1) & 1,
          t_begin + i};
}

// Column blocks [j0, j1) of tile t into its stage, by one thread: one TMA box and one mbarrier per block.
__device__ __forceinline__ void ss_load(const SeesawParams& sp, const SsTile& k, int b, int j0, int j1) {
  const int y = b * sp.p.cache_len + k.t * kBlockN;
  for (int j = j0; j < j1; ++j) {
    mbar_expect_tx(k.bars + 8 * j, kColBlockBytes);
    tma_load_2d(k.stage + j * kColBlockBytes, &sp.kv_map, 64 * j, y, k.bars + 8 * j);
  }
}

// A tile that ends past the request's keys (rows [kv_end - 64 t, 64)): those rows of all 9 blocks to zero, once
// every block landed; cache rows there hold anything (NaN in the tests) and P = 0 times NaN would reach O through
// the V blocks (0..7). The rope block (8) matters only outside the past + T <= S promise, where a visible column
// past kv_end then scores 0, as v3's clamped loads give. Other tiles: nothing. Called by the owner before its QK.
__device__ __forceinline__ void ss_zero_tail(const SsTile& k, int kv_end, uint8_t* smem, uint32_t s_base, int wg) {
  const int valid = kv_end - k.t * kBlockN;
  if (valid >= kBlockN) return;
  for (int j = 0; j < 9; ++j) mbar_wait(k.bars + 8 * j, k.parity);
  const int per_block = (kBlockN - valid) * 8;  // 16-byte chunks per block
  uint8_t* stage = smem + (k.stage - s_base);
  for (int c = threadIdx.x & 127; c < 9 * per_block; c += 128) {
    const int blk = c / per_block, r = c % per_block;
    *reinterpret_cast<uint4*>(stage + blk * kColBlockBytes + (valid + r / 8) * 128 + 16 * (r % 8)) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_smem();
  named_sync(kSsBarWg + wg, 128);
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

}  // namespace tvm
}  // namespace kdb
