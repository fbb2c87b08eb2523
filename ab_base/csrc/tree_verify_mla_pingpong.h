// tree_verify_mla v3 (sm_90a): wgmma ping-pong. The two warpgroups own alternate KV tiles of the split: the owner
// of tile i computes S = Q K_i^T for all 64 tokens (m64n64: one B operand per k-step, half v2's QK smem traffic),
// its softmax and P_i, hands P_i (shared memory) and the running max (shared memory) to the other warpgroup and
// multiplies P_i from registers; each warpgroup keeps O for its 256 output dims. While one warpgroup runs its
// softmax the other's wgmmas keep the tensor cores busy. Included by csrc/tree_verify_mla.cu; plans/0004.
#pragma once
#include "ptx_tma.h"  // mbarriers
#include "tree_verify_mla_tile.h"

namespace kdb {
namespace tvm {

// Named barrier ids (0 = __syncthreads, 1..4 = pair_sync in the epilogue). 256-thread ones: the producer
// warpgroup signals (named_signal: bar.sync, see ptx_mma.h), the consumer syncs.
constexpr int kBarReady = 5;   // + tile parity: P_i in smem and m_i in s_max, published by tile i's owner
constexpr int kBarFree = 7;    // + buffer: the non-owner finished its PV on the buffer's tile (buffer may refill)
// One mbarrier per warpgroup (128 arrivals) after the sum: the warpgroup's own cp.async tile landed. Not a 128-thread
// bar.sync: racecheck misreads the ordered 256-thread hand-offs after barriers that one warpgroup runs without the
// other (reports/h200/racecheck_handoff.cu, plans/0004 s7 / s8); mbarrier waits it models.
constexpr int kPpOffBar = kSmemUsed;
constexpr int kPpSmemBytes = kSmemUsed + 2 * 8 + 1024;  // 231,440 B

// Phase marks for tvm_mark (-DKDB_TVM_TRACE, tree_verify_mla_tile.h), per own tile.
enum PpEvent { kEvStart, kEvFree, kEvRefill, kEvReady, kEvRemotePv, kEvLoaded, kEvQk, kEvFreeSignal, kEvQkDone,
               kEvPublished, kEvOwnPv };
__device__ __forceinline__ void pp_mark(int i, PpEvent ev) { tvm_mark(i, ev); }

// S[64 x 64] = Q[64 x 576] . K[64 tokens x 576]^T for one warpgroup; issued and committed, not waited for.
__device__ __forceinline__ void pp_qk_issue(float (&s)[8][4], uint32_t q_tile, uint32_t k_tile) {
  const uint64_t da = wgmma_desc(q_tile, 16, 1024), db = wgmma_desc(k_tile, 16, 1024);
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;  // defined input to the asm
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTvmDimQK / 16; ++kk) {
    const uint64_t step = (kColBlockBytes * (kk >> 2) + 32 * (kk & 3)) >> 4;  // 16-byte address units
    wgmma_m64n64k16_ss(s, da + step, db + step, kk > 0);
  }
  wgmma_commit();
}

// O[64 x 256 dims of half wg] += P[64 x 64] . V[64 tokens x those dims]; P from smem (the other warpgroup's
// tile) or from registers (own tile). V read MN-major from the KV tile: lbo 8 KB, sbo 1 KB (as v2).
__device__ __forceinline__ uint64_t pp_v_desc(uint32_t v_tile, int wg) {
  return wgmma_desc(v_tile + 4 * wg * kColBlockBytes, kColBlockBytes, 1024);
}
__device__ __forceinline__ void pp_pv_issue_smem(float (&acc)[32][4], uint32_t p_tile, uint32_t v_tile, int wg) {
  const uint64_t da = wgmma_desc(p_tile, 16, 1024), db = pp_v_desc(v_tile, wg);
  wgmma_fence();
#pragma unroll
  for (int kt = 0; kt < kBlockN / 16; ++kt) wgmma_m64n256k16<1>(acc, da + ((32 * kt) >> 4), db + ((16 * 128 * kt) >> 4), 1);
  wgmma_commit();
}
__device__ __forceinline__ void pp_pv_issue_regs(float (&acc)[32][4], const uint32_t (&pa)[4][4], uint32_t v_tile, int wg) {
  const uint64_t db = pp_v_desc(v_tile, wg);
  wgmma_fence();
#pragma unroll
  for (int kt = 0; kt < kBlockN / 16; ++kt) wgmma_m64n256k16_rs(acc, pa[kt], db + ((16 * 128 * kt) >> 4), 1);
  wgmma_commit();
}

// After a wait: the asm of the issue only names the registers, so keep reads and writes of them below this point.
__device__ __forceinline__ void pp_fence_regs(float (&acc)[32][4], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) reg_fence(acc[j][0]), reg_fence(acc[j][1]), reg_fence(acc[j][2]), reg_fence(acc[j][3]);
#pragma unroll
  for (int k = 0; k < 4; ++k) reg_fence(pa[k][0]), reg_fence(pa[k][1]), reg_fence(pa[k][2]), reg_fence(pa[k][3]);
}

__device__ __forceinline__ void pp_fence_s(float (&s)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) reg_fence(s[j][0]), reg_fence(s[j][1]), reg_fence(s[j][2]), reg_fence(s[j][3]);
}

// The other warpgroup's tile j: wait for its P_j and m_j, move O to m_j, issue O += P_j V_j (smem P).
__device__ __forceinline__ void pp_take_remote(float (&acc)[32][4], uint32_t (&pa)[4][4], RowState& st,
                                               const uint8_t* smem, uint32_t s_base, int j, int wg, const int (&row)[2]) {
  named_sync(kBarReady + (j & 1), 2 * 128);
  pp_mark(j + 1, kEvReady);
  const float* s_max = reinterpret_cast<const float*>(smem + kOffMax);
  const float m_new[2] = {s_max[row[0]], s_max[row[1]]};
  wgmma_wait<0>();  // own PV of the previous tile: acc final before the rescale
  pp_fence_regs(acc, pa);
  float base[2];
  rescale(acc, st, m_new, base);
  pp_pv_issue_smem(acc, s_base + kOffP, s_base + kOffKv + (j & 1) * kTileBytes, wg);
}

// Own tile: mask (tail tiles), row max in log2 units, new running max, P = exp2(s * scale - base) into registers (A
// fragments of the PV wgmma) and into smem for the other warpgroup, m into s_max; then publish them.
__device__ __forceinline__ void pp_softmax_publish(float (&s)[8][4], float (&acc)[32][4], uint32_t (&pa)[4][4],
                                                   RowState& st, const uint64_t (&vis)[2], bool masked,
                                                   float scale_log2, uint8_t* smem, int i, Role w, const int (&row)[2]) {
  const int c = w.lane & 3;
  float mx[2], m_new[2], base[2];
  softmax_scores(s, vis, masked, scale_log2, c, mx);
  for (int h = 0; h < 2; ++h) m_new[h] = fmaxf(st.m[h], mx[h]);
  rescale(acc, st, m_new, base);
  softmax_exp(s, pa, st.l, base, scale_log2, smem + kOffP, row, c);
  __syncwarp();  // every lane of the quad read s_max (pp_take_remote) before lane c = 0 overwrites it
  float* s_max = reinterpret_cast<float*>(smem + kOffMax);
  if (c == 0) s_max[row[0]] = st.m[0], s_max[row[1]] = st.m[1];
  fence_proxy_async_smem();  // P is read by the other warpgroup's wgmma (async proxy)
  named_signal(kBarReady + (i & 1), 2 * 128);
}

// Grid (row tiles, splits, batch), 256 threads, one CTA per SM. Warpgroup wg owns local tiles i = wg, wg + 2, ...
// in KV buffer wg; tiles 0 and 1 load in the prologue, later ones by their owner once the other warpgroup frees
// the buffer. Per own tile: [free + load] [remote tile i-1: O += P_{i-1} V] [QK_i] [softmax, publish] [O += P_i V].
template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) tree_verify_mla_pingpong_kernel(const Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // 1024-byte swizzle atoms
  const int b = blockIdx.z, split = blockIdx.y, m0 = blockIdx.x * kBlockM;
  const Role w = role<true>();
  const int wg = w.ch, rows = p.nodes * p.heads;
  const auto [past, kv_end, t_begin, t_end] = split_tiles(p, b, split);
  const int n = t_end - t_begin;
  const __nv_bfloat16* kv = p.kv + static_cast<size_t>(b) * p.cache_len * kTvmDimQK;
  const uint32_t s_base = smem_addr(smem), own_buf = s_base + kOffKv + wg * kTileBytes;
  const uint32_t loaded = s_base + kPpOffBar + 8 * wg;
  if (threadIdx.x == 0) {
    mbar_init(s_base + kPpOffBar, 128), mbar_init(s_base + kPpOffBar + 8, 128);
    fence_mbar_init();
  }
  if (n > 0) {
    load_tile<kThreads>(s_base, p.q + static_cast<size_t>(b) * rows * kTvmDimQK, m0, rows, threadIdx.x);
    for (int i = 0; i < min(n, 2); ++i)
      load_tile<kThreads>(s_base + kOffKv + i * kTileBytes, kv, (t_begin + i) * kBlockN, kv_end, threadIdx.x);
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async_smem();
  }
  __syncthreads();
  const int row[2] = {16 * w.rg + (w.lane >> 2), 16 * w.rg + (w.lane >> 2) + 8};  // rows within the M-tile
  const uint64_t* anc_row[2];
  anc_rows(p, b, m0, w, anc_row);
  float acc[32][4];
  uint32_t pa[4][4] = {};
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
  for (int i = wg; i < n; i += 2) {
    const int t = t_begin + i;
    pp_mark(i, kEvStart);
    if (i >= 2) {  // refill own buffer with tile i once both warpgroups are done with tile i - 2
      named_sync(kBarFree + wg, 2 * 128);
      pp_mark(i, kEvFree);
      wgmma_wait<0>();
      pp_fence_regs(acc, pa);
      load_tile<128>(own_buf, kv, t * kBlockN, kv_end, threadIdx.x & 127);
      cp_async_commit();
      pp_mark(i, kEvRefill);
    }
    if (i >= 1) pp_take_remote(acc, pa, st, smem, s_base, i - 1, wg, row);
    pp_mark(i, kEvRemotePv);
    if (i >= 2) {
      cp_async_wait_all();
      fence_proxy_async_smem();  // cp.async wrote through the generic proxy
      mbar_arrive(loaded);
      mbar_wait(loaded, ((i >> 1) - 1) & 1);  // the warpgroup's refills of tiles 2, 4, ... or 3, 5, ...: phases 0, 1, ...
      pp_mark(i, kEvLoaded);
    }
    float s[8][4];
    pp_qk_issue(s, s_base, own_buf);
    pp_mark(i, kEvQk);
    if (i >= 1) {
      wgmma_wait<1>();  // the remote PV (issued first) is done: its buffer may refill
      if (i + 1 < n) named_signal(kBarFree + (wg ^ 1), 2 * 128);
      pp_mark(i, kEvFreeSignal);
    }
    wgmma_wait<0>();
    pp_mark(i, kEvQkDone);
    pp_fence_regs(acc, pa);
    pp_fence_s(s);
    uint64_t vis[2];
    const bool masked = tile_mask(p, t, past, anc_row, vis);
    pp_softmax_publish(s, acc, pa, st, vis, masked, p.scale_log2, smem, i, w, row);
    pp_mark(i, kEvPublished);
    pp_pv_issue_regs(acc, pa, own_buf, wg);
    pp_mark(i, kEvOwnPv);
  }
  if (n >= 1 && ((n - 1) & 1) != wg) pp_take_remote(acc, pa, st, smem, s_base, n - 1, wg, row);
  wgmma_wait<0>();
  pp_fence_regs(acc, pa);
  epilogue<kSplit>(p, acc, st, smem, b, split, m0, w);
}

}  // namespace tvm
}  // namespace kdb
