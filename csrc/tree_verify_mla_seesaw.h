// tree_verify_mla v4 (sm_90a): the seesaw schedule with TMA loads. The CTA takes the split's KV tiles in pairs
// (tile i in stage 0, i + 1 in stage 1). Warpgroup 0 owns O's dims 0..255 and computes S of the even tile,
// warpgroup 1 owns dims 256..511 and S of the odd tile. The even tile's softmax runs while the odd tile's QK is on
// the tensor cores, the odd one's while the even tile's first PV is. Each 64-column block of a stage is one TMA box
// with its own mbarrier, so a QK waits block by block, and each half of a stage is refilled by the last warpgroup
// that reads it, right after its wgmma wait. Q's rope block lives in registers; its smem holds the odd tile's P.
// Included by csrc/tree_verify_mla.cu; the schedule, its hazards and figures: plans/0004 ("Design v4").
#pragma once
#include "tree_verify_mla_pingpong.h"  // pp_pv_issue_regs / _smem, pp_fence_regs / _s
#include "tree_verify_mla_seesaw_ops.h"

namespace kdb {
namespace tvm {

// Phase marks for tvm_mark (-DKDB_TVM_TRACE), per pair; warpgroup 0 and 1 number their own steps (the names in
// reports/h200/racecheck_pingpong.cu, whose trace prints them in this order, not in time order).
enum SsEvent { kSsStart, kSsA, kSsB, kSsC, kSsD, kSsE, kSsF, kSsG, kSsH, kSsI, kSsEnd };

struct SsCtx {  // what both warpgroups' pair steps read
  const SeesawParams& sp;
  uint8_t* smem;
  uint32_t s_base;
  int b, past, kv_end, t_begin, n;
  Role w;
  int row[2];                  // the thread's two rows within the M-tile
  const uint64_t* anc_row[2];  // their anc words (null past the request)
  __device__ __forceinline__ SsTile tile(int i) const { return ss_tile(s_base, t_begin, i, kv_end, sp.p.cache_len); }
};

// S of tile i into s, in column-block order [J0, 9) then [0, J0); waited.
template <int J0>
__device__ __forceinline__ void ss_first_qk(const SsCtx& x, float (&s)[8][4], const uint32_t (&rope)[4][4], int i) {
  const SsTile k = x.tile(i);
  ss_qk<J0, 9, true>(s, rope, x.s_base, k);
  if constexpr (J0 > 0) ss_qk<0, J0, false>(s, rope, x.s_base, k);
  wgmma_wait<0>();
  pp_fence_s(s);
}

// Warpgroup 0's end of a pair: S of tile i + 2 (stage 0), refilling stage 1's columns 0..255 with tile i + 3 as
// soon as the pending O_L += P_{i+1} V_{i+1} is done (the fourth QK group is in flight by then).
__device__ __forceinline__ void ss_pair_wg0_next(const SsCtx& x, int i, float (&s)[8][4], float (&acc)[32][4],
                                                 uint32_t (&pa)[4][4], const uint32_t (&rope)[4][4]) {
  if (i + 2 < x.n) {
    const SsTile k2 = x.tile(i + 2);
    ss_qk<0, 4, true>(s, rope, x.s_base, k2);
    tvm_mark(i, kSsG);  // QK blocks 0..3 issued
    wgmma_wait<4>();  // O_L += P_{i+1} V_{i+1} done: stage 1's columns 0..255 are free
    if (i + 3 < x.n && (threadIdx.x & 127) == 0) ss_load(x.sp, x.tile(i + 3), x.b, 0, 4);
    tvm_mark(i, kSsH);  // remote PV done, refill issued
    ss_qk<4, 9, false>(s, rope, x.s_base, k2);
    tvm_mark(i, kSsI);  // QK blocks 4..8 issued
  }
  wgmma_wait<0>();
  pp_fence_regs(acc, pa);
  pp_fence_s(s);
  if (i + 2 < x.n) {
    named_sync(kSsBarF0, 2 * 128);  // warpgroup 1 read P_i: the next pair's P may overwrite it
    named_arrive(kSsBarS0, 2 * 128);  // the odd tile's QK now runs under this tile's softmax
  }
  tvm_mark(i, kSsEnd);
}

// Warpgroup 0, pair (i, i + 1), S of tile i in s: softmax at m0 = max(m, row max), m0 and P_i (smem) to warpgroup
// 1, O_L += P_i V_i (P from registers); refill stage 0's columns 0..255 with tile i + 2; at the odd tile's max m1:
// O_L to m1, O_L += P_{i+1} V_{i+1} (P from smem); S of tile i + 2, refilling stage 1's columns 0..255 with tile
// i + 3 once that PV is done. O_L's half of V is read last by this warpgroup, hence its refills.
__device__ __forceinline__ void ss_pair_wg0(const SsCtx& x, int i, float (&s)[8][4], float (&acc)[32][4],
                                            uint32_t (&pa)[4][4], const uint32_t (&rope)[4][4], RowState& st) {
  const SsTile k0 = x.tile(i), k1 = x.tile(i + 1);
  const bool has1 = i + 1 < x.n, loader = (threadIdx.x & 127) == 0;
  const int c = x.w.lane & 3;
  float* s_max = reinterpret_cast<float*>(x.smem + kOffMax);  // [wg][64]
  uint64_t vis[2];
  tvm_mark(i, kSsStart);
  const bool masked = tile_mask(x.sp.p, k0.t, x.past, x.anc_row, vis);
  ss_shift_vis(vis, k0);
  float mx[2], m_new[2], base[2];
  softmax_scores(s, vis, masked, x.sp.p.scale_log2, c, mx);
  for (int h = 0; h < 2; ++h) m_new[h] = fmaxf(st.m[h], mx[h]);
  rescale(acc, st, m_new, base);
  tvm_mark(i, kSsF);  // row max known, O_L rescaled (before the exponentials and P's stores)
  softmax_exp(s, pa, st.l, base, x.sp.p.scale_log2, x.smem + kOffP, x.row, c);
  if (c == 0) s_max[x.row[0]] = st.m[0], s_max[x.row[1]] = st.m[1];
  fence_proxy_async_smem();  // P_i is read by warpgroup 1's wgmma
  named_arrive(kSsBarM0, 2 * 128);
  tvm_mark(i, kSsA);  // softmax done, m0 and P_i published
  pp_pv_issue_regs(acc, pa, k0.stage, 0);
  tvm_mark(i, kSsB);  // own PV issued
  wgmma_wait<0>();
  pp_fence_regs(acc, pa);
  if (i + 2 < x.n && loader) ss_load(x.sp, x.tile(i + 2), x.b, 0, 4);
  tvm_mark(i, kSsC);  // own PV done, refill issued
  named_sync(kSsBarM1, 2 * 128);  // m1 in max[1], P_{i+1} in smem
  tvm_mark(i, kSsD);
  const float m1[2] = {s_max[kBlockM + x.row[0]], s_max[kBlockM + x.row[1]]};
  rescale(acc, st, m1, base);
  if (has1) pp_pv_issue_smem(acc, x.s_base + kSsOffPOdd, k1.stage, 0);
  tvm_mark(i, kSsE);  // remote PV issued
  ss_pair_wg0_next(x, i, s, acc, pa, rope);
}

// Warpgroup 1, pair (i, i + 1), S of tile i + 1 in s (when it exists): O_R to m0, O_R += P_i V_i (P from smem);
// softmax at m1 = max(m0, row max), m1 and P_{i+1} (smem) to warpgroup 0 (M1); once that PV is done, refill stage 0's
// columns 256..575 with tile i + 2 and free P_i's smem (F0), O_R to m1, O_R += P_{i+1} V_{i+1} (registers); refill
// stage 1's columns 256..575 with tile i + 3 once that is done; after S0, S of tile i + 3 (its own refill first).
__device__ __forceinline__ void ss_pair_wg1(const SsCtx& x, int i, float (&s)[8][4], float (&acc)[32][4],
                                            uint32_t (&pa)[4][4], const uint32_t (&rope)[4][4], RowState& st) {
  const SsTile k0 = x.tile(i), k1 = x.tile(i + 1);
  const bool has1 = i + 1 < x.n, loader = (threadIdx.x & 127) == 0;
  const int c = x.w.lane & 3;
  float* s_max = reinterpret_cast<float*>(x.smem + kOffMax);
  tvm_mark(i, kSsStart);
  named_sync(kSsBarM0, 2 * 128);  // m0 in max[0], P_i in smem
  tvm_mark(i, kSsA);
  float m_new[2] = {s_max[x.row[0]], s_max[x.row[1]]}, base[2], mx[2] = {-INFINITY, -INFINITY};
  rescale(acc, st, m_new, base);
  pp_pv_issue_smem(acc, x.s_base + kOffP, k0.stage, 1);
  tvm_mark(i, kSsB);  // remote PV issued
  float lsum[2] = {0.f, 0.f};
  if (has1) {
    uint64_t vis[2];
    const bool masked = tile_mask(x.sp.p, k1.t, x.past, x.anc_row, vis);
    ss_shift_vis(vis, k1);
    softmax_scores(s, vis, masked, x.sp.p.scale_log2, c, mx);
  }
  tvm_mark(i, kSsG);  // the odd tile's row max known (before its exponentials and P's stores)
  for (int h = 0; h < 2; ++h) m_new[h] = fmaxf(m_new[h], mx[h]), base[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];
  if (has1) softmax_exp(s, pa, lsum, base, x.sp.p.scale_log2, x.smem + kSsOffPOdd, x.row, c);
  if (c == 0) s_max[kBlockM + x.row[0]] = m_new[0], s_max[kBlockM + x.row[1]] = m_new[1];
  fence_proxy_async_smem();  // P_{i+1} is read by warpgroup 0's wgmma
  named_arrive(kSsBarM1, 2 * 128);  // before the wait below: warpgroup 0 needs m1 and P_{i+1}, not O_R
  tvm_mark(i, kSsC);  // softmax done
  wgmma_wait<0>();  // O_R += P_i V_i done: stage 0's columns 256..575 are free, and so is P_i's smem
  pp_fence_regs(acc, pa);
  if (i + 2 < x.n && loader) ss_load(x.sp, x.tile(i + 2), x.b, 4, 9);
  if (i + 2 < x.n) named_arrive(kSsBarF0, 2 * 128);
  rescale(acc, st, m_new, base);
  st.l[0] += lsum[0], st.l[1] += lsum[1];
  tvm_mark(i, kSsD);  // P_i's PV done, refill issued, O_R at m1
  if (has1) {
    pp_pv_issue_regs(acc, pa, k1.stage, 1);
    wgmma_wait<0>();  // O_R += P_{i+1} V_{i+1} done: stage 1's columns 256..575 are free
    pp_fence_regs(acc, pa);
    if (i + 3 < x.n && loader) ss_load(x.sp, x.tile(i + 3), x.b, 4, 9);
  }
  tvm_mark(i, kSsE);  // own PV done, refill issued
  if (i + 2 < x.n) named_sync(kSsBarS0, 2 * 128);  // S of tile i + 2 done: QK of i + 3 overlaps its softmax
  tvm_mark(i, kSsF);
  if (i + 3 < x.n) ss_first_qk<4>(x, s, rope, i + 3);
  tvm_mark(i, kSsEnd);  // S of tile i + 3 done
}

// The unit (request b, M-tile m0) and KV split a CTA runs, and where its rows go (epilogue_rows). Grid (row tiles,
// splits, batch) for kOutFinal / kOutPartial; one dimension for the tail plan: CTAs [0, tail_start) run units
// [0, tail_start) whole, the rest run the later units' pieces, the pieces of a unit side by side.
struct SsUnit {
  int b, m0, split, splits;
  int64_t part_base;
};
__host__ __device__ __forceinline__ SsUnit ss_tail_unit(const Params& p, int c) {  // c: the CTA's index
  const int row_tiles = row_tiles_of(p.nodes, p.heads), k = c - p.tail_start;
  const bool whole = k < 0;
  const int unit = whole ? c : p.tail_start + k / p.tail_pieces, piece = whole ? 0 : k % p.tail_pieces;
  const int64_t base = whole ? -1 : static_cast<int64_t>(piece) * p.tail_rows + (unit - p.tail_start) * kBlockM;
  return {unit / row_tiles, (unit % row_tiles) * kBlockM, piece, whole ? 1 : p.tail_pieces, base};
}
template <int kOut>
__device__ __forceinline__ SsUnit ss_unit(const Params& p) {
  if constexpr (kOut != kOutTail) {
    const int b = blockIdx.z, split = blockIdx.y, m0 = blockIdx.x * kBlockM;
    return {b, m0, split, p.num_splits, split_part_base(p, b, split, m0)};
  } else {
    return ss_tail_unit(p, blockIdx.x);
  }
}

// 256 threads, one CTA per SM; kOut: TvmOut (the grid as ss_unit reads it).
template <int kOut>
__global__ void __launch_bounds__(kThreads, 1) tree_verify_mla_seesaw_kernel(const __grid_constant__ SeesawParams sp) {
  const Params& p = sp.p;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // 1024-byte swizzle atoms
  tvm_phase(kPhaseEntry);
  const SsUnit u = ss_unit<kOut>(p);
  const int b = u.b, m0 = u.m0;
  const Role w = role<true>();
  const auto [past, kv_end, t_begin, t_end] = split_tiles(p, b, u.split, u.splits);
  const int n = t_end - t_begin, rows = p.nodes * p.heads;
  const uint32_t s_base = smem_addr(smem);
  if (threadIdx.x == 0) {
    for (int j = 0; j < 18; ++j) mbar_init(s_base + kSsOffBar + 8 * j, 1);
    fence_mbar_init();
    for (int i = 0; i < min(n, 2); ++i) ss_load(sp, ss_tile(s_base, t_begin, i, kv_end, p.cache_len), b, 0, 9);
  }
  if (n > 0) {
    load_tile<kThreads>(s_base, p.q + static_cast<size_t>(b) * rows * kTvmDimQK, m0, rows, threadIdx.x);
    cp_async_commit();
    cp_async_wait_all();
  }
  __syncthreads();  // Q landed, mbarriers initialised
  tvm_phase(kPhaseQ);
  uint32_t rope[4][4];
  ss_load_rope(rope, s_base, w);
  fence_proxy_async_smem();  // Q was written by cp.async (generic proxy); wgmma reads it
  __syncthreads();           // every warp holds its rope fragments: Q's block 8 becomes P of the odd tile
  SsCtx x{sp, smem, s_base, b, past, kv_end, t_begin, n, w,
          {16 * w.rg + (w.lane >> 2), 16 * w.rg + (w.lane >> 2) + 8}, {nullptr, nullptr}};
  anc_rows(p, b, m0, w, x.anc_row);
  const bool real[2] = {x.anc_row[0] != nullptr && node_is_real(x.anc_row[0], p.words),
                        x.anc_row[1] != nullptr && node_is_real(x.anc_row[1], p.words)};  // for ss_store_final
  float acc[32][4], s[8][4];
  uint32_t pa[4][4] = {};
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
  if (w.ch < n) ss_first_qk<0>(x, s, rope, w.ch);  // S of tile 0 (warpgroup 0) and of tile 1 (warpgroup 1)
  tvm_phase(kPhaseQk);
  for (int i = 0; i < n; i += 2) {
    if (w.ch == 0) ss_pair_wg0(x, i, s, acc, pa, rope, st);
    else ss_pair_wg1(x, i, s, acc, pa, rope, st);
  }
  wgmma_wait<0>();
  pp_fence_regs(acc, pa);
  tvm_phase(kPhasePairs);
  if (kOut == kOutPartial || (kOut == kOutTail && u.part_base >= 0)) epilogue_rows<kOut>(p, acc, st, smem, b, m0, w, u.part_base);
  else ss_store_final(sp, acc, st, smem, b, m0, w, real);
  tvm_phase(kPhaseDone);
}

}  // namespace tvm
}  // namespace kdb
