// Device code of the tree_build vocabulary pass (included by tree_build.cu only): one streaming read of the
// logits per (row, split) block computes the log-sum-exp and keeps top-K candidates in shared memory, pruned
// by radix selection on 64-bit (value, ~id) keys; split rows are merged by merge_kernel. plans/0004 "tree_build".
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "common.h"
#include "tree_build.h"

namespace kdb {
namespace vocab {

constexpr int kThreads = 256;
constexpr int kPer = 16;                    // logits (or merge keys) per thread per chunk
constexpr int kChunk = kThreads * kPer;     // 4096 logits per block step
constexpr int kCap = 6144;                  // candidate keys in shared memory (48 KB)
constexpr int kCompactAt = kCap - kChunk;   // prune when more than this (>= 2 * kTreeBuildMaxK) are held
constexpr int kBins = 256;                  // 8-bit radix digits, one bin per thread in the digit search
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kBins == kThreads, "find_digit gives every thread one bin");

// Candidates are 64-bit keys: order key of the fp32 logit in the high word, ~token id in the low word.
// Keys are distinct and "larger key" is exactly the reference order (logit desc, then smaller id). 0 is
// below every real key (the order key of -inf is 0x007fffff) and pads lists.
__device__ __forceinline__ uint64_t make_key(float x, uint32_t id) {
  return (uint64_t(float_order_key(x == 0.f ? 0.f : x)) << 32) | uint64_t(~id);  // -0 and +0: one key
}

struct TopkSmem {
  uint32_t hist[kBins];
  uint64_t red_or[kWarps], red_and[kWarps];
  int warp_tot[kWarps];
  int count;               // candidates held
  int new_count;
  float thr_val;           // logit value of the threshold after the last prune
  int strict;              // 1: the last prune kept exactly k keys, so later logits equal to thr_val lose
  int sel_digit, sel_above, sel_bin;
  float red_m[kWarps], red_s[kWarps];
};

// Bits in which the n >= 1 keys differ, and the value of the bits they share (AND of all keys).
__device__ void varying_bits(const uint64_t* keys, int n, TopkSmem& sm, uint64_t& vary, uint64_t& common) {
  uint64_t o = 0, a = ~0ull;
  for (int i = threadIdx.x; i < n; i += kThreads) o |= keys[i], a &= keys[i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) o |= __shfl_xor_sync(kFullMask, o, off), a &= __shfl_xor_sync(kFullMask, a, off);
  if ((threadIdx.x & 31) == 0) sm.red_or[threadIdx.x >> 5] = o, sm.red_and[threadIdx.x >> 5] = a;
  __syncthreads();
  o = 0, a = ~0ull;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) o |= sm.red_or[w], a &= sm.red_and[w];
  vary = o ^ a, common = a;
}

// All threads: the digit (scanning bins from the top) whose bin holds the krem-th largest matching key.
// Thread t owns bin kBins-1-t, so an inclusive scan in thread order counts keys from the top.
__device__ void find_digit(TopkSmem& sm, int krem) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int c = int(sm.hist[kBins - 1 - t]);
  int incl = warp_inclusive_scan(c, lane);
  if (lane == 31) sm.warp_tot[warp] = incl;
  __syncthreads();
  for (int w = 0; w < warp; ++w) incl += sm.warp_tot[w];
  if (c > 0 && incl >= krem && incl - c < krem) sm.sel_digit = kBins - 1 - t, sm.sel_above = incl - c, sm.sel_bin = c;
  __syncthreads();
}

struct Selection {
  uint64_t t;  // keys >= t are kept
  int kept;    // how many: k, or more when the cut value's ties were kept (tie_slack)
};

// Block-wide radix select on the n distinct keys, 1 <= k <= n: t with exactly k keys >= t, 8-bit digits from
// the highest bit in which the keys differ (bits every key shares are skipped: bf16 logits leave 16 value bits
// and the id's top bits constant). With tie_slack > 0 it stops once the value word is decided and at most
// tie_slack keys beyond k share the cut value: all of them are kept (no passes over the id bits).
__device__ Selection radix_select_ge(const uint64_t* keys, int n, int k, int tie_slack, TopkSmem& sm) {
  uint64_t vary, common;
  varying_bits(keys, n, sm, vary, common);
  uint64_t prefix = 0, mask = 0;
  int krem = k;
  while (vary & ~mask) {
    const int hi = 63 - __clzll(vary & ~mask);          // highest undecided varying bit
    const int shift = max(hi - 7, hi >= 32 ? 32 : 0);   // digits never straddle the value / id words
    const uint64_t dmask = (2ull << (hi - shift)) - 1ull;
    sm.hist[threadIdx.x] = 0;
    __syncthreads();
    // Lanes with equal bins add once (__match_any_sync): logits crowd a few bins, same-address atomics serialize.
    for (int base = 0; base < n; base += kThreads) {
      const int i = base + int(threadIdx.x);
      const uint64_t key = i < n ? keys[i] : 0;
      const int bin = i < n && (key & mask) == prefix ? int((key >> shift) & dmask) : -1;
      const unsigned peers = __match_any_sync(kFullMask, bin);
      if (bin >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sm.hist[bin], unsigned(__popc(peers)));
    }
    __syncthreads();
    find_digit(sm, krem);
    prefix |= uint64_t(sm.sel_digit) << shift;
    mask |= dmask << shift;
    krem -= sm.sel_above;
    const int bin = sm.sel_bin;
    __syncthreads();  // sel_* are rewritten by the next pass
    // Shared bits take their common value in t, undecided varying bits 0: keys >= t are exactly the kept ones.
    if (bin == krem) return {prefix | (common & ~vary & ~mask), k};  // the whole bin is taken
    // Tie stop only on the pass that decided the value word: only then is `bin` every key at the cut value.
    // After an id-bit pass `bin` counts one id digit, and keeping the whole value group under that count
    // truncated an arbitrary (warp-order) subset of it (the H200 tie failures of 2026-12-01).
    if (tie_slack > 0 && shift >= 32 && ((vary & ~mask) >> 32) == 0 && bin - krem <= tie_slack)
      return {(prefix | (common & ~vary & ~mask)) & 0xffffffff00000000ull, k - krem + bin};
  }
  return {prefix | (common & ~vary), k};  // unreachable: with every bit decided one key matches, bin == krem
}

// Keep the sel.kept keys >= sel.t of the sm.count candidates (moved to keys[0, kept)).
// In-place compaction in rounds: a round reads its slice into registers, syncs, then writes survivors
// below (survivors so far <= end of this round), so nothing unread is overwritten.
__device__ Selection prune(uint64_t* keys, int k, int tie_slack, TopkSmem& sm) {
  const int n = sm.count;
  const Selection sel = radix_select_ge(keys, n, k, tie_slack, sm);
  if (threadIdx.x == 0) sm.new_count = 0;
  __syncthreads();
  for (int base = 0; base < n; base += 4 * kThreads) {
    uint64_t v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = base + q * kThreads + threadIdx.x;
      v[q] = i < n ? keys[i] : 0;
    }
    __syncthreads();
    unsigned keep = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) keep |= (base + q * kThreads + int(threadIdx.x) < n && v[q] >= sel.t ? 1u : 0u) << q;
    int slot = warp_append_base(__popc(keep), &sm.new_count);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if ((keep >> q) & 1u) keys[slot++] = v[q];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float tv = float_from_order_key(uint32_t(sel.t >> 32));
    sm.count = sel.kept, sm.thr_val = isnan(tv) ? -INFINITY : tv, sm.strict = sel.kept == k;
  }
  __syncthreads();
  return sel;
}

// Logit loads: VW elements per 16-byte vector (1 = scalar, guarded). Element j of a thread's chunk is
// logit (j / VW) * (kThreads * VW) + tid * VW + j % VW of the chunk: every load is coalesced.
template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <int VW>
__device__ __forceinline__ int chunk_index(int c, int j) {
  return c * kChunk + (j / VW) * (kThreads * VW) + int(threadIdx.x) * VW + j % VW;
}

template <typename T, int VW>
struct Raw {
  uint4 v[kPer / VW];
  __device__ __forceinline__ void load(const T* row, int c) {
#pragma unroll
    for (int q = 0; q < kPer / VW; ++q) v[q] = __ldcs(reinterpret_cast<const uint4*>(row + chunk_index<VW>(c, q * VW)));
  }
  __device__ __forceinline__ void to_float(float (&x)[kPer]) const {
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[j] = to_f32(reinterpret_cast<const T*>(&v[j / VW])[j % VW]);
  }
};

// Scalar loads of chunk c; logits at or beyond V read as -inf and are flagged invalid.
template <typename T>
__device__ __forceinline__ void load_scalar(const T* row, int c, int V, float (&x)[kPer], unsigned& valid) {
  valid = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = chunk_index<1>(c, j);
    x[j] = i < V ? to_f32(row[i]) : -INFINITY;
    valid |= (i < V ? 1u : 0u) << j;
  }
}

// Per-thread streaming state: running max m and sum s of exp(x - m) over this thread's logits.
// add() returns the chunk's max, which also decides whether any of the thread's logits can be admitted.
struct LseState {
  float m = -INFINITY, s = 0.f;
  __device__ __forceinline__ float add(const float (&x)[kPer]) {
    float mc = x[0];
#pragma unroll
    for (int j = 1; j < kPer; ++j) mc = fmaxf(mc, x[j]);
    if (mc > m) s *= fast_exp2((m - mc) * kLog2e), m = mc;  // m = -inf: s is 0 and stays 0
    if (m == -INFINITY) return mc;
    const float neg_m_log2e = -m * kLog2e;   // one FFMA + one MUFU per logit
    float e[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = fast_exp2(fmaf(x[j], kLog2e, neg_m_log2e));
    s += pairwise_sum<kPer>(e);
    return mc;
  }
};

__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  s = s * fast_exp2((m - mm) * kLog2e) + s2 * fast_exp2((m2 - mm) * kLog2e);
  m = mm;
}

// Append this thread's logits x >= thr (the admission bound derived from the last prune) to the shared
// candidate list. The common case costs one compare of the chunk max and one vote; a warp that admits takes
// one shared atomic.
template <int VW>
__device__ __forceinline__ void admit(uint64_t* keys, TopkSmem& sm, const float (&x)[kPer], float chunk_max,
                                      unsigned valid, int c, float thr) {
  if (!__any_sync(kFullMask, chunk_max >= thr)) return;
  unsigned pass = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) pass |= (x[j] >= thr ? 1u : 0u) << j;
  pass &= valid;
  int slot = warp_append_base(__popc(pass), &sm.count);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if ((pass >> j) & 1u) keys[slot++] = make_key(x[j], uint32_t(chunk_index<VW>(c, j)));
  }
}

__device__ void bitonic_sort_desc(uint64_t* keys, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < p / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const uint64_t a = keys[i], b = keys[j];
        if ((a < b) == ((i & size) == 0)) keys[i] = b, keys[j] = a;
      }
      __syncthreads();
    }
  }
}

// Block-wide (m, s) from the per-thread states, merged in a fixed order (every block of a row alike).
__device__ float2 block_ms(LseState st, TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float m = st.m, s = st.s;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_merge(m, s, __shfl_xor_sync(kFullMask, m, o), __shfl_xor_sync(kFullMask, s, o));
  if (lane == 0) sm.red_m[warp] = m, sm.red_s[warp] = s;
  __syncthreads();
  m = sm.red_m[0], s = sm.red_s[0];
  for (int w = 1; w < kWarps; ++w) lse_merge(m, s, sm.red_m[w], sm.red_s[w]);
  return make_float2(m, s);
}

// The held candidates cut to exactly min(k, held) and sorted descending; keys[kk, max(p, k)) are 0.
__device__ int finish_sorted(uint64_t* keys, int k, TopkSmem& sm) {
  __syncthreads();
  if (sm.count > k) prune(keys, k, 0, sm);
  const int kk = sm.count;
  int p = 1;
  while (p < kk) p <<= 1;
  for (int i = kk + threadIdx.x; i < max(p, k); i += kThreads) keys[i] = 0;
  __syncthreads();
  bitonic_sort_desc(keys, p);
  return kk;
}

__device__ void write_top(const uint64_t* keys, int k, float lse, float* top_lp, int64_t* top_tok) {
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const uint64_t key = keys[j];
    top_lp[j] = float_from_order_key(uint32_t(key >> 32)) - lse;
    top_tok[j] = int64_t(~uint32_t(key));
  }
}

// Block (row r, split s) streams chunks [s * cps, (s + 1) * cps) of row r. Unsplit (splits == 1): writes the
// row's outputs. Split: writes its top-min(k, held) keys, sorted and 0-padded to k, and its (m, s) partials.
template <typename T, int VW>
__global__ void __launch_bounds__(kThreads, 4) topk_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char topk_smem_raw[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(topk_smem_raw);  // [kCap]
  __shared__ TopkSmem sm;
  const int64_t r = blockIdx.x / a.splits;
  const int split = int(blockIdx.x % a.splits);
  const int V = a.vocab, k = a.k;
  const T* row = static_cast<const T*>(a.logits) + r * V;
  if (threadIdx.x == 0) sm.count = 0, sm.thr_val = -INFINITY, sm.strict = 0;
  __syncthreads();

  LseState st;
  float thr = -INFINITY;  // admit x >= thr: thr_val, or the next float above it after an exact prune
  const int nfull = VW > 1 ? V / kChunk : 0;  // vector chunks; the rest goes through scalar loads
  const int c0 = split * a.chunks_per_split, c1 = min(c0 + a.chunks_per_split, ceil_div(V, kChunk));
  // bf16 chunks are 32 B per thread: prefetch one ahead to keep ~64 B per thread in flight (fp32 has it
  // without, and the extra registers would spill).
  constexpr bool kPrefetch = sizeof(T) == 2;
  Raw<T, VW> cur, nxt;
  if (kPrefetch && c0 < nfull) cur.load(row, c0);
  for (int c = c0; c < c1; ++c) {
    float x[kPer];
    unsigned valid = (1u << kPer) - 1u;
    if (c < nfull) {
      if constexpr (kPrefetch) {
        if (c + 1 < min(nfull, c1)) nxt.load(row, c + 1);  // next chunk in flight while this one is processed
        cur.to_float(x);
        cur = nxt;
      } else {
        cur.load(row, c);
        cur.to_float(x);
      }
      admit<VW>(keys, sm, x, st.add(x), valid, c, thr);
    } else {
      load_scalar(row, c, V, x, valid);
      admit<1>(keys, sm, x, st.add(x), valid, c, thr);
    }
    __syncthreads();
    const int held = sm.count;
    __syncthreads();  // every thread has read `held` before the next chunk appends
    if (held > kCompactAt) {
      prune(keys, k, k / 2, sm);
      // Exact prune: the k kept keys beat every later logit equal to thr_val (later ids are larger).
      thr = sm.strict ? nextafterf(sm.thr_val, INFINITY) : sm.thr_val;
    }
  }
  const int kk = finish_sorted(keys, k, sm);
  const float2 ms = block_ms(st, sm);
  if (a.splits == 1) {
    const float lse = ms.x + logf(ms.y);
    write_top(keys, k, lse, a.top_lp + r * k, a.top_tok + r * k);
    if (a.lse != nullptr && threadIdx.x == 0) a.lse[r] = lse;
    return;
  }
  (void)kk;
  uint64_t* out = a.part_keys + int64_t(blockIdx.x) * k;
  for (int j = threadIdx.x; j < k; j += kThreads) out[j] = keys[j];
  if (threadIdx.x == 0) reinterpret_cast<float2*>(a.part_ms)[blockIdx.x] = ms;
}

// One block per row: the splits' sorted key lists (splits * k keys, 0-padded) streamed through the same
// admission and exact prunes (keys are distinct and carry global ids, so this is exact), then the row's
// outputs; the lse merges the splits' (m, s) in split order.
__global__ void __launch_bounds__(kThreads) merge_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char merge_smem_raw[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(merge_smem_raw);  // [kCap]
  __shared__ TopkSmem sm;
  const int64_t r = blockIdx.x;
  const int k = a.k, n = a.splits * k;
  const uint64_t* in = a.part_keys + r * n;
  if (threadIdx.x == 0) sm.count = 0;
  __syncthreads();
  uint64_t thr = 1;  // admit keys >= thr; 0 is padding
  for (int base = 0; base < n; base += kChunk) {
    uint64_t v[kPer];
    unsigned pass = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = base + j * kThreads + int(threadIdx.x);
      v[j] = i < n ? in[i] : 0;
      pass |= (v[j] >= thr ? 1u : 0u) << j;
    }
    int slot = warp_append_base(__popc(pass), &sm.count);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if ((pass >> j) & 1u) keys[slot++] = v[j];
    }
    __syncthreads();
    const int held = sm.count;
    __syncthreads();
    if (held > kCompactAt) {
      const uint64_t t = prune(keys, k, 0, sm).t;  // keys below t lose to the k kept
      thr = t > thr ? t : thr;
    }
  }
  finish_sorted(keys, k, sm);
  const float2* ms = reinterpret_cast<const float2*>(a.part_ms) + r * a.splits;
  float m = ms[0].x, s = ms[0].y;
  for (int i = 1; i < a.splits; ++i) lse_merge(m, s, ms[i].x, ms[i].y);
  const float lse = m + logf(s);
  write_top(keys, k, lse, a.top_lp + r * k, a.top_tok + r * k);
  if (a.lse != nullptr && threadIdx.x == 0) a.lse[r] = lse;
}

}  // namespace vocab
}  // namespace kdb
