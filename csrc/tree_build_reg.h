// The tree_build vocabulary pass for split bf16 rows (few rows: batch 1 and 8 at V 163840), in one launch.
// Each (row, split) block holds its <= 8192 logits in registers as 16-bit order keys and finds its top-k by a
// bisection over the key bits (then over the ids of the cut value's ties), with one block reduction per bit
// instead of an admission stream and radix prunes in shared memory; it writes its kept keys unsorted with its
// (m, s) partials. The last block of a row to arrive (an arrival counter) merges the row: the same bisection
// over the splits' keys, then a sort of the k kept. Included by tree_build.cu only; plans/0004 "Round 5".
#pragma once
#include <cuda_bf16.h>

#include <climits>

#include "tree_build_vocab.h"

namespace kdb {
namespace vocab {
namespace reg {

constexpr int kMaxChunks = 2;                 // chunks per split: 32 logits per thread
constexpr int kVecs = kMaxChunks * kPer / 8;  // 16-byte vectors (8 bf16) per thread
constexpr int kWords = kVecs * 4;             // 32-bit words per thread, two order keys each
constexpr int kMaxK = 256;
constexpr int kIdBits = 18;                   // V <= 2^18: ids fit the merge's id bisection
constexpr int kLocalIdBits = 13;              // a split's local ids: < kMaxChunks * kChunk = 8192
static_assert(kMaxChunks * kChunk == 1 << kLocalIdBits, "local ids");

struct RegSmem {
  int red[2][kWarps];  // block_sum's warp partials, by call parity (one barrier per call)
  uint32_t red_or[kWarps], red_and[kWarps];
  int slot;            // emission counter
  int last;            // this block arrived last: it merges the row
};

// Block-wide sum of c (all threads; every sum in [0, 2^31)). Alternating halves of rs.red let consecutive calls
// share one barrier each: a call's writes land after every thread has passed the previous call's barrier, which
// it reaches only after reading the half before.
__device__ __forceinline__ int block_sum(int c, RegSmem& rs, int& parity) {
  c = int(__reduce_add_sync(kFullMask, unsigned(c)));
  if ((threadIdx.x & 31) == 0) rs.red[parity][threadIdx.x >> 5] = c;
  __syncthreads();
  int t = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += rs.red[parity][w];
  parity ^= 1;
  return t;
}

// An element is kept iff v > tv or (v == tv and id <= xi); `kept` of them in the block.
struct Cut {
  uint32_t tv;
  int xi, kept;
  __device__ __forceinline__ bool keep(uint32_t v, int id) const { return v > tv || (v == tv && id <= xi); }
};

// The block's top-k elements (16-bit order key v desc, then id asc; v 0 = no element): a bisection over the bits
// in which the keys differ finds the k-th largest v (stopping early when exactly k are >= a prefix), then, when
// the cut value has more ties than places, a bisection over the id bits finds the r-th smallest tied id.
// E::each(f) calls f(v, id) for this thread's elements. All threads; block-uniform result.
template <class E>
__device__ Cut select_top(const E& el, int k, int idbits, RegSmem& rs, int& parity) {
  uint32_t o = 0, an = 0xffffu;
  int n = 0;
  el.each([&](uint32_t v, int) { o |= v, an &= v != 0 ? v : 0xffffu, n += v != 0; });
  o = __reduce_or_sync(kFullMask, o), an = __reduce_and_sync(kFullMask, an);
  if ((threadIdx.x & 31) == 0) rs.red_or[threadIdx.x >> 5] = o, rs.red_and[threadIdx.x >> 5] = an;
  n = block_sum(n, rs, parity);  // its barrier publishes red_or / red_and too
  if (n <= k) return {0, INT_MAX, n};
  o = 0, an = 0xffffu;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) o |= rs.red_or[w], an &= rs.red_and[w];
  const uint32_t vary = o ^ an;
  uint32_t tv = an & ~vary;  // every element's v is >= it; shared bits already at their value
  for (int bit = 15; bit >= 0; --bit) {
    if (!((vary >> bit) & 1u)) continue;
    const uint32_t cand = tv | (1u << bit);
    int c = 0;
    el.each([&](uint32_t v, int) { c += v >= cand; });
    c = block_sum(c, rs, parity);
    if (c >= k) tv = cand;
    if (c == k) return {cand, INT_MAX, k};  // exactly k at or above cand: ties at cand all kept
  }
  int gt_eq = 0;  // count(v > tv) | count(v == tv) << 16 (each <= 8192)
  el.each([&](uint32_t v, int) { gt_eq += v > tv ? 1 : (v == tv ? 1 << 16 : 0); });
  gt_eq = block_sum(gt_eq, rs, parity);
  const int gt = gt_eq & 0xffff, eq = gt_eq >> 16, r = k - gt;  // 1 <= r <= eq
  if (r >= eq) return {tv, INT_MAX, gt + eq};
  int xi = 0;  // the r-th smallest tied id: the largest xi with fewer than r tied ids below it
  for (int bit = idbits - 1; bit >= 0; --bit) {
    const int cand = xi | (1 << bit);
    int c = 0;
    el.each([&](uint32_t v, int id) { c += v == tv && id < cand; });
    if (block_sum(c, rs, parity) < r) xi = cand;
  }
  return {tv, xi, k};
}

// This thread's logits of a split: order keys of bf16 values (the high 16 bits of float_order_key), two per word
// in element order, 0 for logits beyond V. Element 2i + h of word i is local id (i / 4) * 2048 + tid * 8 +
// (i % 4) * 2 + h, i.e. chunk_index<8> of the split's chunks.
struct SplitElems {
  uint32_t w[kWords];
  __device__ static int local_id(int e) { return (e / 8) * (kThreads * 8) + int(threadIdx.x) * 8 + e % 8; }
  __device__ uint32_t v(int e) const { return (e & 1) ? w[e / 2] >> 16 : w[e / 2] & 0xffffu; }
  template <class F>
  __device__ __forceinline__ void each(F f) const {
#pragma unroll
    for (int e = 0; e < 2 * kWords; ++e) f(v(e), local_id(e));
  }
};

// The order key of one bf16 (-0 as +0, so the two zeros are one key), and the 64-bit candidate key
// (make_key's) of an order key and a token id.
__device__ __forceinline__ uint32_t bf16_order(uint32_t h) {
  h = h == 0x8000u ? 0u : h;
  return h ^ ((h & 0x8000u) ? 0xffffu : 0x8000u);
}
__device__ __forceinline__ uint64_t key_of(uint32_t v, uint32_t id) {
  return (uint64_t((v << 16) | ((v & 0x8000u) ? 0u : 0xffffu)) << 32) | uint64_t(~id);
}

// Loads chunks [c0, c0 + nch) of the row (all vector loads in flight at once) into el, folding each chunk into
// st as topk_kernel does (the same logits per thread and order: the same (m, s) partials).
__device__ __forceinline__ void load_split(const __nv_bfloat16* row, int V, int c0, int nch, SplitElems& el,
                                           LseState& st) {
  uint4 raw[kVecs];
  bool in[kVecs];
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    const int i = c0 * kChunk + q * (kThreads * 8) + int(threadIdx.x) * 8;  // first logit of vector q
    in[q] = q < 2 * nch && i < V;  // V % 8 == 0: a vector is wholly in or out
    raw[q] = in[q] ? __ldcs(reinterpret_cast<const uint4*>(row + i)) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {  // a chunk's raw words die into its order keys
    const uint32_t* wd = reinterpret_cast<const uint32_t*>(&raw[2 * c]);  // its 8 words (2 vectors)
    if (c < nch) {
      float x[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        x[j] = in[2 * c + j / 8] ? __uint_as_float((j & 1) ? wd[j / 2] & 0xffff0000u : wd[j / 2] << 16) : -INFINITY;
      st.add(x);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      el.w[8 * c + i] = in[2 * c + i / 4] ? bf16_order(wd[i] & 0xffffu) | (bf16_order(wd[i] >> 16) << 16) : 0u;
  }
}

// The merge's elements: the splits' keys in shared memory (0 = padding).
struct MergeElems {
  const uint64_t* keys;
  int n;
  template <class F>
  __device__ __forceinline__ void each(F f) const {
    for (int i = int(threadIdx.x); i < n; i += kThreads) {
      const uint64_t key = keys[i];
      f(uint32_t(key >> 48), int(~uint32_t(key) & ((1u << kIdBits) - 1u)));
    }
  }
};

// Last block of row r: the splits' kept keys (splits * k, 0-padded) cut to the row's top k, sorted, written with
// the lse merged from the splits' (m, s) in a fixed order. keys has splits * k + pow2(k) slots.
__device__ __noinline__ void merge_row(const TopkArgs& a, int64_t r, uint64_t* keys, TopkSmem& sm, RegSmem& rs, int& parity) {
  const int k = a.k, n = a.splits * k;
  const auto* src = reinterpret_cast<const unsigned long long*>(a.part_keys) + r * n;
  for (int i = int(threadIdx.x); i < n; i += kThreads) keys[i] = __ldcg(src + i);  // L2: written by other blocks
  LseState st;
  const float2* ms = reinterpret_cast<const float2*>(a.part_ms) + r * a.splits;
  for (int i = int(threadIdx.x); i < a.splits; i += kThreads) {
    const float2 p = __ldcg(ms + i);
    lse_merge(st.m, st.s, p.x, p.y);
  }
  if (threadIdx.x == 0) rs.slot = 0;
  __syncthreads();
  const Cut cut = select_top(MergeElems{keys, n}, k, kIdBits, rs, parity);
  uint64_t* sel = keys + n;
  int p = 1;
  while (p < k) p <<= 1;
  for (int i = int(threadIdx.x); i < n; i += kThreads) {
    const uint64_t key = keys[i];
    if (cut.keep(uint32_t(key >> 48), int(~uint32_t(key) & ((1u << kIdBits) - 1u))) && key != 0)
      sel[atomicAdd(&rs.slot, 1)] = key;
  }
  for (int i = cut.kept + int(threadIdx.x); i < p; i += kThreads) sel[i] = 0;
  __syncthreads();
  bitonic_sort_desc(sel, p);
  const float2 tot = block_ms(st, sm);
  write_row(sel, tot.x, tot.y, a, r);
}

// Block (row r, split s) takes chunks [s * cps, s * cps + cps) of row r (cps <= kMaxChunks), writes its kept keys
// (min(k, its logits), unsorted, 0-padded to k) and (m, s); the row's last block to arrive merges the row.
__global__ void __launch_bounds__(kThreads, 3) topk_reg_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char reg_smem_raw[];
  __shared__ TopkSmem sm;
  __shared__ RegSmem rs;
  pdl_launch_dependents();  // the builder may launch now; it waits (pdl_wait) for this grid to complete
  const int64_t r = blockIdx.x / a.splits;
  const int split = int(blockIdx.x % a.splits), V = a.vocab, k = a.k;
  const int c0 = split * a.chunks_per_split, nch = min(a.chunks_per_split, ceil_div(V, kChunk) - c0);
  SplitElems el;
  LseState st;
  load_split(static_cast<const __nv_bfloat16*>(a.logits) + r * V, V, c0, nch, el, st);
  if (threadIdx.x == 0) rs.slot = 0;
  int parity = 0;
  const Cut cut = select_top(el, k, kLocalIdBits, rs, parity);  // its first barrier orders rs.slot's reset
  uint64_t* out = a.part_keys + int64_t(blockIdx.x) * k;
  unsigned keep = 0;
#pragma unroll
  for (int e = 0; e < 2 * kWords; ++e) keep |= (el.v(e) != 0 && cut.keep(el.v(e), SplitElems::local_id(e)) ? 1u : 0u) << e;
  const uint32_t id0 = uint32_t(c0) * kChunk;
  append_masked<2 * kWords>(out, &rs.slot, keep, [&](int e) { return key_of(el.v(e), id0 + SplitElems::local_id(e)); });
  for (int j = cut.kept + int(threadIdx.x); j < k; j += kThreads) out[j] = 0;
  const float2 ms = block_ms(st, sm);
  if (threadIdx.x == 0) reinterpret_cast<float2*>(a.part_ms)[blockIdx.x] = ms;
  __threadfence();  // this thread's keys and partials are visible device-wide before the arrival below
  __syncthreads();
  if (threadIdx.x == 0) rs.last = atomicAdd(a.arrivals + r, 1) == a.splits - 1;
  __syncthreads();
  if (!rs.last) return;
  __threadfence();
  merge_row(a, r, reinterpret_cast<uint64_t*>(reg_smem_raw), sm, rs, parity);
}

}  // namespace reg
}  // namespace vocab
}  // namespace kdb
