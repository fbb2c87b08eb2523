// tree_verify_mla device helpers shared by the four MMA paths (mma.sync, wgmma lock-step, ping-pong, seesaw):
// tile geometry and shared-memory map, kernel parameters, the swizzled tile loader, the tree-mask visibility
// word, the softmax pieces and the epilogue. Device code only; included by csrc/tree_verify_mla.cu (plans/0004-kernels.md).
#pragma once
#include "ptx_mma.h"
#include "tree_verify_mla.h"

#include <cmath>

namespace kdb {
namespace tvm {

constexpr int kBlockM = 64;                     // query rows per CTA (4 row groups of 16)
constexpr int kBlockN = 64;                     // KV tokens per tile
constexpr int kThreads = 256;                   // 8 warps = 2 warpgroups; see Roles
constexpr int kChunks = kTvmDimQK * 2 / 16;     // 72 16-byte chunks per bf16 row of Q or KV
constexpr int kColBlockBytes = kBlockM * 128;   // 8,192 B: 64 rows x 64 columns (one 128-byte swizzle block)
constexpr int kTileBytes = (kChunks / 8) * kColBlockBytes;  // 73,728 B: Q tile and each KV stage (9 blocks)
constexpr int kOffKv = kTileBytes;              // smem map: Q | KV stage 0 | KV stage 1 | P | max[2][64] | sum[2][64]
constexpr int kOffP = 3 * kTileBytes;           // P: 64 rows x 64 tokens bf16 = one column block
constexpr int kOffMax = kOffP + kColBlockBytes;
constexpr int kOffSum = kOffMax + 2 * kBlockM * 4;
constexpr int kSmemUsed = kOffSum + 2 * kBlockM * 4;  // 230,400 B
constexpr int kSmemBytes = kSmemUsed + 1024;    // + slack to align the base to the 1024-byte swizzle atom
                                                // (231,424 B; H100/H200 allow 232,448 per block)
constexpr int kMaxSplits = 64;
constexpr int kSplitOverheadTiles = 2;          // cost of one extra split in KV-tile units (Q load, epilogue, combine)
constexpr float kLn2 = 0.693147180559945309f;
static_assert(kBlockM == kBlockN, "Q tile and KV stages share one size");
static_assert(kChunks % 8 == 0, "rows split into whole 64-column blocks");
static_assert(kOffKv % 1024 == 0 && kOffP % 1024 == 0, "wgmma swizzle atoms need 1024-byte aligned tiles");

struct Params {
  const __nv_bfloat16* q;
  const __nv_bfloat16* kv;
  const int32_t* past_lens;
  const uint64_t* anc;
  __nv_bfloat16* o_lat;
  float* lse;
  float* part_o;    // [splits, B*T*H, 512] normalized partial outputs (split mode), or [tail_pieces, tail_rows, 512]
  float* part_lse;  // [splits, B*T*H] (or [tail_pieces, tail_rows]) partial natural-log lse; null without partials
  int batch, nodes, heads, cache_len, words, num_splits;
  float scale_log2;  // scale * log2(e): scores live in log2 units so exp2 needs no extra multiply
  // The seesaw's tail plan (TvmPlan, tail_pieces > 0): units (request, M-tile) [0, tail_start) whole, each later unit
  // in tail_pieces pieces whose partials are [tail_pieces, tail_rows = 64 x tail units] rows (part_o / part_lse).
  int tail_start, tail_pieces, tail_rows;
};

// Units are (request, M-tile of 64 rows of node x head), request-major: unit u is M-tile u % row_tiles of request
// u / row_tiles. The plans (csrc/tree_verify_mla_plan.h), the tail plan's CTA decode and the combine count in them.
__host__ __device__ __forceinline__ int row_tiles_of(int nodes, int heads) { return (nodes * heads + kBlockM - 1) / kBlockM; }

// Phase timestamps (SM clock) of one CTA in the middle of the grid, thread 0 of each warpgroup, per step and event
// (the paths number their own events): compiled in only with -DKDB_TVM_TRACE (reports/h200/racecheck_pingpong.cu
// `trace`, plans/0004), else a no-op. The marks' stores make the next proxy fence wait: ~1-3 % slower.
constexpr int kTraceSteps = 1024, kTraceEvents = 12;
// And a CTA's phases around its pairs (seesaw): entry, Q landed, first QK done, pairs done, epilogue done (s9).
enum TvmPhase { kPhaseEntry, kPhaseQ, kPhaseQk, kPhasePairs, kPhaseDone, kPhases };
#ifdef KDB_TVM_TRACE
__device__ long long g_tvm_trace[2][kTraceSteps][kTraceEvents];
__device__ __forceinline__ void tvm_mark(int i, int ev) {
  if ((threadIdx.x & 127) == 0 && blockIdx.x == gridDim.x / 2 && blockIdx.y == 0 && blockIdx.z == gridDim.z / 2 &&
      i < kTraceSteps)
    g_tvm_trace[threadIdx.x >> 7][i][ev] = clock64();
}
__device__ long long g_tvm_phases[2][kPhases];
__device__ __forceinline__ void tvm_phase(int ev) {
  if ((threadIdx.x & 127) == 0 && blockIdx.x == gridDim.x / 2 && blockIdx.y == 0 && blockIdx.z == gridDim.z / 2)
    g_tvm_phases[threadIdx.x >> 7][ev] = clock64();
}
#else
__device__ __forceinline__ void tvm_mark(int, int) {}
__device__ __forceinline__ void tvm_phase(int) {}
#endif

// Barrier for the two warps that own the same 16 rows (64 threads); ids 1..4, id 0 is __syncthreads.
__device__ __forceinline__ void pair_sync(int row_group) {
  barrier_jitter();
  bar_sync_raw(row_group + 1, 64);
  barrier_jitter();
}

// Roles. Both paths split a tile's work in two column halves ch: tokens [32 ch, 32 ch + 32) for S = Q K^T and
// dims [256 ch, 256 ch + 256) for O += P V, and hand a thread rows 16 rg + lane / 4 (+ 8) in the m16n8
// C-fragment layout, so the softmax and the epilogue are shared. mma.sync: warp = 2 rg + ch. wgmma: warpgroup
// ch = warp / 4, rg = warp % 4 (a warpgroup's accumulator rows are 16 per warp).
struct Role {
  int rg, ch, lane;
};
template <bool kWgmma>
__device__ __forceinline__ Role role() {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  return kWgmma ? Role{warp & 3, warp >> 2, lane} : Role{warp >> 1, warp & 1, lane};
}

// Shared-memory layout of a 64-row tile (Q, each KV stage, P): 64-column blocks of 64 rows x 128 B, block-major;
// 16-byte chunk c of row r sits in block c / 8 at chunk (c % 8) ^ (r % 8). This is wgmma's 128-byte swizzle
// (atoms of 8 rows x 128 B), and for ldmatrix the 8 rows of one phase hit 8 different bank groups.
__host__ __device__ __forceinline__ uint32_t tile_off(int row, int chunk) {
  return (chunk >> 3) * kColBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}
// The row address lane l gives ldmatrix / stmatrix x4 for the 16 x 16 block (rows r16.., k16 step kk) of a tile:
// row l % 16, chunk 2 kk + l / 16, so the four 8 x 8 matrices are the mma / wgmma A fragment's a0..a3.
__host__ __device__ __forceinline__ uint32_t x4_off(int r16, int lane, int kk) {
  return tile_off(r16 + (lane & 15), 2 * kk + (lane >> 4));
}

// Copies rows [row0, row0 + 64) of a row-major [*, 576] bf16 matrix into a tile with kLoaders threads (tid =
// the caller's index among them); rows >= row_end are zero-filled, so NaN in unused cache slots cannot enter the
// PV product. Thread layout per pass: kLoaders / 8 rows x 8 chunks (a warp reads 4 rows x 128 contiguous bytes);
// each pass covers 9 blocks at one base + immediates (row r + kRows k has the same swizzle phase as row r).
template <int kLoaders>
__device__ __forceinline__ void load_tile(uint32_t dst, const __nv_bfloat16* src, int row0, int row_end, int tid) {
  constexpr int kRows = kLoaders / 8;  // rows per pass: 32 (whole CTA) or 16 (one warpgroup)
  static_assert(kLoaders % 64 == 0 && kChunks == 72 && kBlockM % kRows == 0, "passes of whole 8-row atoms");
  const int c8 = tid & 7, r = tid >> 3;
  const uint32_t d = dst + tile_off(r, c8);
#pragma unroll
  for (int k = 0; k < kBlockM / kRows; ++k) {
    const int row = row0 + r + kRows * k;
    const bool valid = row < row_end;
    const __nv_bfloat16* g = src + static_cast<size_t>(valid ? row : 0) * kTvmDimQK + 8 * c8;
#pragma unroll
    for (int j = 0; j < kChunks / 8; ++j) cp_async_16(d + kRows * 128 * k + kColBlockBytes * j, g + 64 * j, valid);
  }
}

// Visibility of the 64 columns of a tile for one node: bit t <=> cache row past_len + j0 + t is visible,
// where j0 = tile_start - past_len > -64 (only tiles reaching the tree call this). Prefix columns
// (j0 + t < 0) are visible; tree column j = j0 + t is visible iff j < T and bit j of the node's anc row.
__device__ __forceinline__ uint64_t tile_visibility(const uint64_t* anc_row, int words, int nodes, int j0) {
  if (anc_row == nullptr) return 0;  // row past the end of the request (partial last M-tile)
  uint64_t prefix = 0, tree;
  if (j0 < 0) {
    prefix = (1ull << -j0) - 1;  // -j0 in [1, 63]
    tree = anc_row[0] << -j0;
  } else {
    const int w = j0 >> 6, sh = j0 & 63;
    const uint64_t lo = w < words ? anc_row[w] : 0, hi = w + 1 < words ? anc_row[w + 1] : 0;
    tree = sh == 0 ? lo : (lo >> sh) | (hi << (64 - sh));
  }
  const int n_tree = nodes - j0;  // tile-local columns t < n_tree are inside [past_len, past_len + T)
  if (n_tree < 64) tree &= n_tree <= 0 ? 0 : (1ull << n_tree) - 1;
  return prefix | tree;
}

// Whether KV tile t reaches the tree rows (or the unused tail) and, if so, its visibility words for the thread's two
// rows; prefix-only tiles need no mask.
__device__ __forceinline__ bool tile_mask(const Params& p, int t, int past, const uint64_t* const (&anc_row)[2],
                                          uint64_t (&vis)[2]) {
  const bool masked = (t + 1) * kBlockN > past;
  vis[0] = vis[1] = 0;
  if (masked) {
#pragma unroll
    for (int h = 0; h < 2; ++h) vis[h] = tile_visibility(anc_row[h], p.words, p.nodes, t * kBlockN - past);
  }
  return masked;
}

// 2^x as one MUFU.EX2 (ex2.approx.ftz). exp2f is the same instruction wrapped in a compare and two multiplies
// for subnormal results (SASS of s6); a P below 2^-126 of its row max becomes 0, which no bf16 P sum can see.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Running softmax state for the two rows a lane owns (h = 0: row g, h = 1: row g + 8 of the warp's 16).
struct RowState {
  float m[2];  // running max of scaled scores, log2 units; -inf until a visible column is seen
  float l[2];  // this lane's partial row sum (its 8 columns per tile), rescaled with m
};

// Moves O and the row sums from the running max st.m to m_new (never smaller); exp2 base 0 while nothing is
// visible (m_new = -inf), so exp2(-inf - 0) = 0 and no -inf - -inf appears. Returns the exponent base.
__device__ __forceinline__ void rescale(float (&acc)[32][4], RowState& st, const float (&m_new)[2],
                                           float (&base)[2]) {
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    base[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];
    alpha[h] = exp2f(st.m[h] - base[h]);  // 0 while st.m is -inf (acc and l are 0 then)
    st.m[h] = m_new[h];
    st.l[h] *= alpha[h];
  }
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // settled max: skip 128 multiplies
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j][0] *= alpha[0], acc[j][1] *= alpha[0], acc[j][2] *= alpha[1], acc[j][3] *= alpha[1];
  }
}

// Masks S (tiles reaching the tree only: select, never multiply by 0; prefix tiles skip the 32 bit tests) and
// returns the quad's row maxima in log2 units. S stays in raw units: softmax_exp scales it inside its exponent's
// FMA. scale_log2 > 0 (the glue checks it) and rounding is monotone, so the scaled max is exactly max(s) * scale.
__device__ __forceinline__ void softmax_scores(float (&s)[8][4], const uint64_t (&vis)[2], bool masked,
                                               float scale_log2, int c, float (&mx)[2]) {
  if (masked) {
    const uint64_t w[2] = {vis[0] >> (2 * c), vis[1] >> (2 * c)};  // bit 8 j + b <=> column 8 j + 2 c + b
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = ((w[e >> 1] >> (8 * j + (e & 1))) & 1) ? s[j][e] : -INFINITY;
    }
  }
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    mx[h] *= scale_log2;  // -inf stays -inf
  }
}

// P = exp2(S * scale_log2 - base) (one FFMA and one MUFU.EX2 per score): in place over S (fp32; the seesaw's
// ptxas serializes its wgmmas when S stays live instead, C7515), as bf16 A fragments of the PV wgmma (k16 step
// j / 2: a0 a1 | a2 a3) and into the 64 x 64 P tile in smem for the other warpgroup; adds the row sums to l.
__device__ __forceinline__ void softmax_exp(float (&s)[8][4], uint32_t (&pa)[4][4], float (&l)[2],
                                            const float (&base)[2], float scale_log2, uint8_t* p_tile,
                                            const int (&row)[2], int c) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = exp2_ftz(fmaf(s[j][2 * h], scale_log2, -base[h]));
      const float p1 = exp2_ftz(fmaf(s[j][2 * h + 1], scale_log2, -base[h]));
      s[j][2 * h] = p0, s[j][2 * h + 1] = p1;
      l[h] += p0 + p1;
      const __nv_bfloat162 pk = __floats2bfloat162_rn(p0, p1);
      pa[j >> 1][2 * (j & 1) + h] = *reinterpret_cast<const uint32_t*>(&pk);
    }
  }
  // P's smem copy: the A fragments are stmatrix's x4 layout, so 4 stores per thread instead of 16 32-bit ones (same
  // bytes; s7 call B: -1.4 % on two of three shapes, the same output bits). row[0] = 16 rg + lane / 4 and c = lane % 4
  // give back the warp's row group and the lane (passing Role instead changes the SASS: left for a GPU session).
  const uint32_t p_addr = smem_addr(p_tile);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) stsm_x4(p_addr + x4_off(row[0] & ~15, 4 * (row[0] & 7) + c, kk), pa[kk]);
}

// The KV tiles split `split` of `splits` of request b attends: cache rows [0, kv_end) (later rows never load), tiles
// [t_begin, t_end) of them (an empty range for an empty split).
struct SplitTiles {
  int past, kv_end, t_begin, t_end;
};
__device__ __forceinline__ SplitTiles split_tiles(const Params& p, int b, int split, int splits) {
  const int past = max(p.past_lens[b], 0);
  const int kv_end = min(past + p.nodes, p.cache_len);
  const int n_tiles = (kv_end + kBlockN - 1) / kBlockN;
  return {past, kv_end, static_cast<int>(static_cast<int64_t>(n_tiles) * split / splits),
          static_cast<int>(static_cast<int64_t>(n_tiles) * (split + 1) / splits)};
}
__device__ __forceinline__ SplitTiles split_tiles(const Params& p, int b, int split) {
  return split_tiles(p, b, split, p.num_splits);
}

// The anc words of a thread's two accumulator rows (16 rg + lane / 4, + 8) of M-tile m0; null past the request.
__device__ __forceinline__ void anc_rows(const Params& p, int b, int m0, Role w, const uint64_t* (&anc_row)[2]) {
  const int rows = p.nodes * p.heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + 16 * w.rg + (w.lane >> 2) + 8 * h;
    anc_row[h] = row < rows ? p.anc + (static_cast<size_t>(b) * p.nodes + row / p.heads) * p.words : nullptr;
  }
}

// True unless all anc words of the node are zero (a padding node sees nothing, prefix included).
__device__ __forceinline__ bool node_is_real(const uint64_t* anc_row, int words) {
  uint64_t any = 0;
  for (int w = 0; w < words; ++w) any |= anc_row[w];
  return any != 0;
}

// Where a CTA's rows go: bf16 O and the final lse (kOutFinal), fp32 partials for the combine kernel (kOutPartial),
// or, in the seesaw's tail plan, partials when part_base >= 0 and final rows otherwise (kOutTail).
enum TvmOut { kOutFinal = 0, kOutPartial = 1, kOutTail = 2 };

// The row sums over the lane quad, published for the other column half (red_sum[ch][row]) and synced with the warp
// that owns the same rows there; the caller adds red_sum[ch ^ 1][row].
__device__ __forceinline__ void share_row_sums(RowState& st, uint8_t* smem, Role w) {
  float* red_sum = reinterpret_cast<float*>(smem + kOffSum);
  const int g = w.lane >> 2, c = w.lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
    if (c == 0) red_sum[w.ch * kBlockM + 16 * w.rg + g + 8 * h] = st.l[h];
  }
  pair_sync(w.rg);
}
// After share_row_sums: row r's sum over both column halves.
__device__ __forceinline__ float row_sum_total(const RowState& st, const uint8_t* smem, Role w, int h, int r) {
  return st.l[h] + reinterpret_cast<const float*>(smem + kOffSum)[(w.ch ^ 1) * kBlockM + r];
}

// Finishes the row sums across the lane quad and the warp pair, then writes O and lse of M-tile m0 of request b from
// registers; partial row of M-tile row r = part_base + r. (The seesaw's final rows leave through ss_store_final.)
template <int kOut>
__device__ __forceinline__ void epilogue_rows(const Params& p, float (&acc)[32][4], RowState& st, uint8_t* smem,
                                              int b, int m0, Role w, int64_t part_base) {
  const int g = w.lane >> 2, c = w.lane & 3, rows = p.nodes * p.heads, rg = w.rg, ch = w.ch;
  const bool partial = kOut == kOutPartial || (kOut == kOutTail && part_base >= 0);
  share_row_sums(st, smem, w);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * rg + g + 8 * h, row = m0 + r;  // row within the request: node * H + head
    if (row >= rows) continue;
    const float l = row_sum_total(st, smem, w, h, r);
    const int node = row / p.heads;
    const bool seen = l > 0.f && node_is_real(p.anc + (static_cast<size_t>(b) * p.nodes + node) * p.words, p.words);
    const float inv_l = seen ? 1.f / l : 0.f;
    const float lse = seen ? st.m[h] * kLn2 + logf(l) : -INFINITY;
    if (partial) {
      const size_t prow = static_cast<size_t>(part_base + r);
      float* out = p.part_o + prow * kTvmDimV + 256 * ch + 2 * c;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(out + 8 * j) = make_float2(acc[j][2 * h] * inv_l, acc[j][2 * h + 1] * inv_l);
      if (ch == 0 && c == 0) p.part_lse[prow] = lse;
    } else {
      const size_t grow = static_cast<size_t>(b) * rows + row;  // global row over the batch
      __nv_bfloat16* out = p.o_lat + grow * kTvmDimV + 256 * ch + 2 * c;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) =
            __floats2bfloat162_rn(acc[j][2 * h] * inv_l, acc[j][2 * h + 1] * inv_l);
      if (ch == 0 && c == 0) p.lse[grow] = lse;
    }
  }
}

// The uniform split's rows: partials of split s at [s, B x T x H] (the combine's layout), or final rows.
__device__ __forceinline__ int64_t split_part_base(const Params& p, int b, int split, int m0) {
  const int64_t rows = static_cast<int64_t>(p.nodes) * p.heads;
  return split * p.batch * rows + b * rows + m0;
}
template <bool kSplit>
__device__ __forceinline__ void epilogue(const Params& p, float (&acc)[32][4], RowState& st, uint8_t* smem,
                                         int b, int split, int m0, Role w) {
  epilogue_rows<kSplit ? kOutPartial : kOutFinal>(p, acc, st, smem, b, m0, w, split_part_base(p, b, split, m0));
}

}  // namespace tvm
}  // namespace kdb
