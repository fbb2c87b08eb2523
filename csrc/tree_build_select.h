// Candidate selection of the tree_build vocabulary pass (included by tree_build_vocab.h): 64-bit (value, ~id)
// keys in shared memory, block-wide radix selection, the in-place prune, the bitonic sort and the final top-k
// write. One block of kThreads threads; plans/0004 "tree_build".
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
// Capacity: a loop prune keeps at most k + k/2 keys (the tie slack) and fires at <= kCompactAt held, a chunk adds
// at most kChunk; the sampled estimate uses kChunk slots as scratch.
static_assert(kCompactAt >= kTreeBuildMaxK + kTreeBuildMaxK / 2 && kCap >= kChunk, "key capacity");

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
  float red_t[kWarps];     // first_bound: each warp's bound
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
    append_masked<4>(keys, &sm.new_count, keep, [&](int q) { return v[q]; });
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float tv = float_from_order_key(uint32_t(sel.t >> 32));
    sm.count = sel.kept, sm.thr_val = isnan(tv) ? -INFINITY : tv, sm.strict = sel.kept == k;
  }
  __syncthreads();
  return sel;
}

// Bitonic sort, descending, of keys[0, p), p a power of two. Warp w of the first sort_warps(p) owns the stage's
// compare pairs [w pw, (w + 1) pw), pw = p / 2 / warps: for stride <= pw they lie in the warp's own 2 pw keys, so
// such a stage is followed by __syncwarp, and a block barrier ends only the stages that cross warps, the stage
// before each of them and the last (p 1024: 10 of 55 stages; p <= 64: one warp, only the last). bitonic_stage is one thread's share of a
// stage (tests/test_tree_build_merge.py runs it for all threads on the host).
__host__ __device__ inline int sort_warps(int p) { return p < 64 ? 1 : (p / 64 < kWarps ? p / 64 : kWarps); }

__host__ __device__ inline void bitonic_stage(uint64_t* keys, int p, int size, int stride, int tid) {
  const int warps = sort_warps(p), pw = p / 2 / warps > 0 ? p / 2 / warps : 1, w = tid >> 5;
  if (w >= warps) return;
  for (int t = w * pw + (tid & 31); t < (w + 1) * pw; t += 32) {
    const int i = 2 * t - (t & (stride - 1)), j = i + stride;
    const uint64_t a = keys[i], b = keys[j];
    if ((a < b) == ((i & size) == 0)) keys[i] = b, keys[j] = a;
  }
}

__device__ void bitonic_sort_desc(uint64_t* keys, int p) {
  const int pw = max(1, p / 2 / sort_warps(p));
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      bitonic_stage(keys, p, size, stride, int(threadIdx.x));
      const int next = stride > 1 ? stride >> 1 : size;  // the next stage's stride (size 2 size starts at size)
      if (stride > pw || next > pw || (size == p && stride == 1)) __syncthreads();
      else __syncwarp();
    }
  }
}

// The block policy on the device (kThreads threads) of par:: (the builder) and of merge_sorted_lists (the merge):
// barriers, shared-memory scans, the bitonic sort; par::HostBlk is its one-thread host twin.
struct DevBlk {
  __device__ static int tid() { return int(threadIdx.x); }
  __device__ static int size() { return kThreads; }
  __device__ static void sync() { __syncthreads(); }
  __device__ static void sync_warp() { __syncwarp(); }
  __device__ static void mark() {}  // a profiling point (the builder bench logs a clock here)
  __device__ static void atomic_add(int* p, int v) { atomicAdd(p, v); }
  // x[i] = base + sum of gen(j < i) for i in [0, n), each gen(i) called by the thread that owns i (a contiguous
  // chunk per thread), so gen may read what the block published before the call with no barrier in between;
  // returns the total (without base) to all threads. Two barriers.
  template <class Gen>
  __device__ static int exclusive_scan(int* x, int n, int* scratch, int base, Gen gen) {
    const int per = ceil_div(n, kThreads), beg = min(n, tid() * per), end = min(n, beg + per);
    int s = 0;
    for (int i = beg; i < end; ++i) {
      const int v = gen(i);
      x[i] = v, s += v;
    }
    const int lane = tid() & 31, warp = tid() >> 5;
    const int incl = warp_inclusive_scan(s, lane);
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kThreads / 32; ++w) before += w < warp ? scratch[w] : 0, total += scratch[w];
    int run = base + before + incl - s;
    for (int i = beg; i < end; ++i) {
      const int v = x[i];
      x[i] = run, run += v;
    }
    __syncthreads();
    return total;
  }
  __device__ static void sort_desc(uint64_t* k, int p) { bitonic_sort_desc(k, p); }
};
__device__ void write_top(const uint64_t* keys, int k, float lse, float* top_lp, int64_t* top_tok) {
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const uint64_t key = keys[j];
    top_lp[j] = float_from_order_key(uint32_t(key >> 32)) - lse;
    top_tok[j] = int64_t(~uint32_t(key));
  }
}

}  // namespace vocab
}  // namespace kdb
