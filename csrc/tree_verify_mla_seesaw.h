// tree_verify_mla v4 (sm_90a): the seesaw schedule with TMA loads. The CTA takes the split's KV tiles in pairs
// (tile i in stage 0, i + 1 in stage 1). Warpgroup 0 owns O's dims 0..255 and computes S of the even tile,
// warpgroup 1 owns dims 256..511 and S of the odd tile. The even tile's softmax runs while the odd tile's QK is on
// the tensor cores, the odd one's while the even tile's first PV is. Each 64-column block of a stage is one TMA box
// with its own mbarrier, so a QK waits block by block, and each half of a stage is refilled by the last warpgroup
// that reads it, right after its wgmma wait. Q's rope block lives in registers; its smem holds the odd tile's P.
// A CTA of the one-dimensional work list runs items c, c + gridDim.x, ... (persistent when the grid is smaller than the
// list): an item's last pair loads the next item's Q and first two tiles as its own buffers free up.
// Included by csrc/tree_verify_mla.cu; the schedule, its hazards and figures: plans/0004 ("Design v4", "Session 9").
#pragma once
#include "tree_verify_mla_pingpong.h"  // pp_pv_issue_regs / _smem, pp_fence_regs / _s
#include "tree_verify_mla_seesaw_ops.h"

namespace kdb {
namespace tvm {

// Phase marks for tvm_mark (-DKDB_TVM_TRACE), per pair; warpgroup 0 and 1 number their own steps (the names in
// reports/h200/racecheck_pingpong.cu, whose trace prints them in this order, not in time order).
enum SsEvent { kSsStart, kSsA, kSsB, kSsC, kSsD, kSsE, kSsF, kSsG, kSsH, kSsI, kSsEnd };

// The unit (request b, M-tile m0) and KV split a work item runs, and where its rows go (epilogue_rows). Grid (row
// tiles, splits, batch) for kOutFinal / kOutPartial; for kOutTail item v of the one-dimensional list: items
// [0, tail_start) are units [0, tail_start) whole, the rest the later units' pieces, the pieces of a unit side by side.
struct SsUnit {
  int b, m0, split, splits;
  int64_t part_base;
};
__host__ __device__ __forceinline__ SsUnit ss_tail_unit(const Params& p, int c) {  // c: the item's index
  const int row_tiles = row_tiles_of(p.nodes, p.heads), k = c - p.tail_start;
  const bool whole = k < 0;
  const int unit = whole ? c : p.tail_start + k / p.tail_pieces, piece = whole ? 0 : k % p.tail_pieces;
  const int64_t base = whole ? -1 : static_cast<int64_t>(piece) * p.tail_rows + (unit - p.tail_start) * kBlockM;
  return {unit / row_tiles, (unit % row_tiles) * kBlockM, piece, whole ? 1 : p.tail_pieces, base};
}

struct SsItem {  // a work item and its KV tiles [t_begin, t_begin + n) of cache rows [0, kv_end)
  SsUnit u;
  int past, kv_end, t_begin, n;
};
template <int kOut>
__device__ __forceinline__ SsItem ss_item(const Params& p, int v, int past) {  // past: request u.b's, >= 0
  SsUnit u;
  if constexpr (kOut != kOutTail) {
    u = {static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.x) * kBlockM, static_cast<int>(blockIdx.y),
         p.num_splits, split_part_base(p, blockIdx.z, blockIdx.y, blockIdx.x * kBlockM)};
  } else {
    u = ss_tail_unit(p, v);
  }
  const SplitTiles r = split_range(p, past, u.split, u.splits);
  return {u, r.past, r.kv_end, r.t_begin, r.t_end - r.t_begin};
}
template <int kOut>
__device__ __forceinline__ int ss_item_past(const Params& p, int v) {  // the past length of item v's request
  return max(p.past_lens[kOut == kOutTail ? ss_tail_unit(p, v).b : static_cast<int>(blockIdx.z)], 0);
}

struct SsCtx {  // what both warpgroups' pair steps read
  const SeesawParams& sp;
  uint8_t* smem;
  uint32_t s_base;
  int b, past, kv_end, t_begin, n;
  Role w;
  int row[2];                  // the thread's two rows within the M-tile
  const uint64_t* anc_row[2];  // their anc words (null past the request)
  SsSlots sl;                  // the item's place in the CTA's stage uses
  int next, next_past;         // the CTA's next item (-1: none; kOutTail only) and its request's past length
  __device__ __forceinline__ SsTile tile(int i) const { return ss_tile(s_base, t_begin, i, kv_end, sp.p.cache_len, sl); }
};

// The loader thread of the calling warpgroup refills column blocks [j0, j1) of slot i's stage: the item's tile i, or,
// past the item's slots, the next item's tile i - slots (its slots start at stage 0 with its own use counts, which
// the loads do not need); nothing for the empty slot of an odd-length item or past the next item's tiles.
__device__ __forceinline__ void ss_refill(const SsCtx& x, int i, int j0, int j1) {
  if ((threadIdx.x & 127) != 0) return;
  if (i < x.n) return ss_load(x.sp, x.tile(i), x.b, j0, j1);
  const int k = i - x.n - (x.n & 1);
  if (k < 0 || x.next < 0) return;
  const SsItem nx = ss_item<kOutTail>(x.sp.p, x.next, x.next_past);
  if (k < nx.n) ss_load(x.sp, ss_tile(x.s_base, nx.t_begin, k, nx.kv_end, x.sp.p.cache_len, {0, 0}), nx.u.b, j0, j1);
}

// Thread 0 loads Q's column blocks [j0, j1) of the next item, once the item's last readers of them are done: blocks
// 0..7 complete on the first Q mbarrier, block 8 (rope; P of the odd tile until the item's last PV) on the second.
__device__ __forceinline__ void ss_refill_q(const SsCtx& x, int j0, int j1) {
  if (threadIdx.x != 0 || x.next < 0) return;
  const SsItem nx = ss_item<kOutTail>(x.sp.p, x.next, x.next_past);
  if (nx.n > 0) ss_load_q(x.sp, x.s_base, nx.u.b, nx.u.m0, j0, j1, x.s_base + kSsOffBarQ + (j0 == 8 ? 8 : 0));
}

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
    ss_refill(x, i + 3, 0, 4);
    tvm_mark(i, kSsH);  // remote PV done, refill issued
    ss_qk<4, 9, false>(s, rope, x.s_base, k2);
    tvm_mark(i, kSsI);  // QK blocks 4..8 issued
  }
  wgmma_wait<0>();
  pp_fence_regs(acc, pa);
  pp_fence_s(s);
  if (i + 2 >= x.n) {  // the item's last pair: its last PV read stage 1's columns 0..255 and P of the odd tile (Q's
    ss_refill(x, i + 3, 0, 4);  // block 8), so the next item's tile 1 and Q's rope block may load there
    fence_proxy_async_smem();   // P of the odd tile was written through the generic proxy
    ss_refill_q(x, 8, 9);
  }
  if (i + 2 < x.n || x.next >= 0) named_sync(kSsBarF0, 2 * 128);  // warpgroup 1 read P_i: the next P may overwrite it
  if (i + 2 < x.n) named_arrive(kSsBarS0, 2 * 128);  // the odd tile's QK now runs under this tile's softmax
  tvm_mark(i, kSsEnd);
}

// Warpgroup 0, pair (i, i + 1), S of tile i in s: softmax at m0 = max(m, row max), m0 and P_i (smem) to warpgroup
// 1, O_L += P_i V_i (P from registers); refill stage 0's columns 0..255 with tile i + 2; at the odd tile's max m1:
// O_L to m1, O_L += P_{i+1} V_{i+1} (P from smem); S of tile i + 2, refilling stage 1's columns 0..255 with tile
// i + 3 once that PV is done. O_L's half of V is read last by this warpgroup, hence its refills.
__device__ __forceinline__ void ss_pair_wg0(const SsCtx& x, int i, float (&s)[8][4], float (&acc)[32][4],
                                            uint32_t (&pa)[4][4], const uint32_t (&rope)[4][4], RowState& st) {
  const SsTile k0 = x.tile(i), k1 = x.tile(i + 1);
  const bool has1 = i + 1 < x.n;
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
  ss_refill(x, i + 2, 0, 4);
  tvm_mark(i, kSsC);  // own PV done, refill issued
  named_sync(kSsBarM1, 2 * 128);  // m1 in max[1], P_{i+1} in smem
  if (i + 2 >= x.n) ss_refill_q(x, 0, 8);  // every QK of the item is done (warpgroup 1's before its M1 arrive)
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
  const bool has1 = i + 1 < x.n;
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
  ss_refill(x, i + 2, 4, 9);
  if (i + 2 < x.n || x.next >= 0) named_arrive(kSsBarF0, 2 * 128);
  rescale(acc, st, m_new, base);
  st.l[0] += lsum[0], st.l[1] += lsum[1];
  tvm_mark(i, kSsD);  // P_i's PV done, refill issued, O_R at m1
  if (has1) {
    pp_pv_issue_regs(acc, pa, k1.stage, 1);
    wgmma_wait<0>();  // O_R += P_{i+1} V_{i+1} done: stage 1's columns 256..575 are free
    pp_fence_regs(acc, pa);
  }
  ss_refill(x, i + 3, 4, 9);  // without an odd tile (the item's last pair) the stage was free already
  tvm_mark(i, kSsE);  // own PV done, refill issued
  if (i + 2 < x.n) named_sync(kSsBarS0, 2 * 128);  // S of tile i + 2 done: QK of i + 3 overlaps its softmax
  tvm_mark(i, kSsF);
  if (i + 3 < x.n) ss_first_qk<4>(x, s, rope, i + 3);
  tvm_mark(i, kSsEnd);  // S of tile i + 3 done
}

// The start of an item nothing prefetched (the CTA's first, or one after an empty item), by thread 0: Q and tiles 0, 1.
__device__ __forceinline__ void ss_start(const SeesawParams& sp, uint32_t s_base, const SsItem& it, SsSlots sl) {
  ss_load_q(sp, s_base, it.u.b, it.u.m0, 0, 8, s_base + kSsOffBarQ);
  ss_load_q(sp, s_base, it.u.b, it.u.m0, 8, 9, s_base + kSsOffBarQ + 8);
  for (int i = 0; i < min(it.n, 2); ++i) ss_load(sp, ss_tile(s_base, it.t_begin, i, it.kv_end, sp.p.cache_len, sl), it.u.b, 0, 9);
}

// One work item: wait for its Q (phase qpar of the Q mbarriers), take the rope block into registers, run the pairs,
// write the rows. Q's block 8 becomes P of the odd tile only after warpgroup 1's M0 wait, i.e. after both warpgroups
// read their rope fragments (warpgroup 0 before its first QK, which precedes its first M0 arrive).
template <int kOut>
__device__ __forceinline__ void ss_run_item(const SsCtx& x, uint32_t qpar, int64_t part_base, int m0, int k) {
  const Params& p = x.sp.p;
  float acc[32][4], s[8][4];
  uint32_t pa[4][4] = {}, rope[4][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
  if (x.n > 0) {
    mbar_wait(x.s_base + kSsOffBarQ, qpar);
    mbar_wait(x.s_base + kSsOffBarQ + 8, qpar);
    tvm_mark_item(k, kItemQ);
    ss_load_rope(rope, x.s_base, x.w);
    if (x.w.ch < x.n) ss_first_qk<0>(x, s, rope, x.w.ch);  // S of tile 0 (warpgroup 0) and of tile 1 (warpgroup 1)
    tvm_mark_item(k, kItemQk);
    for (int i = 0; i < x.n; i += 2) {
      if (x.w.ch == 0) ss_pair_wg0(x, i, s, acc, pa, rope, st);
      else ss_pair_wg1(x, i, s, acc, pa, rope, st);
    }
  }
  wgmma_wait<0>();
  pp_fence_regs(acc, pa);
  tvm_mark_item(k, kItemPairs);
  epilogue_rows<kOut>(p, acc, st, x.smem, x.b, m0, x.w, part_base);
  tvm_mark_item(k, kItemDone);
}

// 256 threads, one CTA per SM; kOut: TvmOut (kOutTail: the one-dimensional work list, items blockIdx.x + k gridDim.x).
template <int kOut>
__global__ void __launch_bounds__(kThreads, 1) tree_verify_mla_seesaw_kernel(const __grid_constant__ SeesawParams sp) {
  const Params& p = sp.p;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // 1024-byte swizzle atoms
  const Role w = role<true>();
  const uint32_t s_base = smem_addr(smem);
  const bool list = kOut == kOutTail;
  const int v0 = list ? blockIdx.x : 0, stride = list ? gridDim.x : 1, end = list ? p.items : 1;
  tvm_mark_item(0, kItemEntry);
  if (threadIdx.x == 0) {
    for (int j = 0; j < 20; ++j) mbar_init(s_base + kSsOffBar + 8 * j, 1);  // 18 KV blocks, 2 for Q
    fence_mbar_init();
  }
  __syncthreads();  // mbarriers initialised
  SsSlots sl{0, 0};
  uint32_t qpar = 0;
  int past = ss_item_past<kOut>(p, v0), prev_n = 0;
  for (int v = v0, k = 0; v < end; v += stride, ++k) {
    tvm_mark_item(k, kItemTop);
    const SsItem it = ss_item<kOut>(p, v, past);
    const int next = v + stride < end ? v + stride : -1;
    const int next_past = next >= 0 ? ss_item_past<kOut>(p, next) : 0;
    if (prev_n == 0 && it.n > 0) {
      if (v != v0) __syncthreads();  // after an empty item: every read of the item before it is done
      if (threadIdx.x == 0) ss_start(sp, s_base, it, sl);
    }
    SsCtx x{sp, smem, s_base, it.u.b, it.past, it.kv_end, it.t_begin, it.n, w,
            {16 * w.rg + (w.lane >> 2), 16 * w.rg + (w.lane >> 2) + 8}, {nullptr, nullptr}, sl, next, next_past};
    anc_rows(p, it.u.b, it.u.m0, w, x.anc_row);
    ss_run_item<kOut>(x, qpar, it.u.part_base, it.u.m0, k);
    qpar ^= it.n > 0;
    sl = sl.after(it.n);
    prev_n = it.n, past = next_past;
  }
}

}  // namespace tvm
}  // namespace kdb
