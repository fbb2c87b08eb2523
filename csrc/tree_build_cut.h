// The block's final cut of the tree_build vocabulary pass by value words (kCutEnd, included by tree_build_vocab.h):
// the value word of the k-th largest held key by 4-bit digits counted in registers (no match-any, no shared atomics),
// then one compaction that keeps the keys above it and lists its ties, which are ranked among themselves (at most
// kThreads of them); radix_select_ge instead walks the id bits of the ties in 8-bit passes. plans/0004 "tree_build",
// Session 23.
#pragma once
#include "common.h"
#include "tree_build_select.h"

namespace kdb {
namespace vocab {

struct Digit {
  int d;      // the digit value holding the krem-th largest matching key
  int above;  // matching keys in higher digits
  int in;     // matching keys with digit d
};

// One digit [shift, shift + 4) of the value words (dmask: its width) over the keys whose decided bits (mask) equal
// prefix. A thread counts its keys in two 64-bit words of 8-bit counters (digits 0-7 and 8-15; <= 24 keys a thread,
// n <= kCap), a warp sums them as 16-bit pairs with __reduce_add_sync (<= 768 a pair), and warp 0 scans the 16 bins
// from the top. All threads; two barriers.
__device__ Digit value_digit(const uint64_t* keys, int n, uint32_t prefix, uint32_t mask, int shift, uint32_t dmask,
                             int krem, TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t lo = 0, hi = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t w = uint32_t(keys[i] >> 32), d = (w >> shift) & dmask;
    const uint64_t inc = (w & mask) == prefix ? 1ull << (8 * (d & 7u)) : 0ull;
    lo += d < 8 ? inc : 0ull, hi += d < 8 ? 0ull : inc;
  }
  const uint32_t part[4] = {uint32_t(lo), uint32_t(lo >> 32), uint32_t(hi), uint32_t(hi >> 32)};
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // pair j = digits 2j (low half) and 2j + 1 (high half)
    const uint32_t s = __reduce_add_sync(kFullMask, __byte_perm(part[j >> 1], 0u, (j & 1) ? 0x4342u : 0x4140u));
    if (lane == 0) sm.hist[warp * 8 + j] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int b = 15 - lane;  // lane l < 16 holds digit 15 - l: an inclusive scan counts from the top
    int c = 0;
    if (lane < 16) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) c += int((sm.hist[w * 8 + (b >> 1)] >> ((b & 1) * 16)) & 0xffffu);
    }
    const int incl = warp_inclusive_scan(c, lane);
    const unsigned hit = __ballot_sync(kFullMask, lane < 16 && incl >= krem);
    if (lane == __ffs(hit) - 1) sm.sel_digit = b, sm.sel_above = incl - c, sm.sel_bin = c;
  }
  __syncthreads();
  return {sm.sel_digit, sm.sel_above, sm.sel_bin};
}

struct ValueCut {
  uint32_t v;  // the value word of the k-th largest key
  int above;   // keys with a larger value word (< k)
  int ties;    // keys with value word v (above + ties >= k)
};

// All threads, 1 <= k < n keys: the cut by value words, digits from the highest bit in which the words differ.
__device__ ValueCut value_cut(const uint64_t* keys, int n, int k, TopkSmem& sm) {
  uint64_t vary64, common64;
  varying_bits(keys, n, sm, vary64, common64);
  const uint32_t vary = uint32_t(vary64 >> 32), common = uint32_t(common64 >> 32);
  uint32_t prefix = 0, mask = 0;
  int krem = k, in = n;
  while (vary & ~mask) {
    const int top = 31 - __clz(vary & ~mask), shift = max(top - 3, 0);
    const uint32_t dmask = (2u << (top - shift)) - 1u;
    const Digit g = value_digit(keys, n, prefix, mask, shift, dmask, krem, sm);
    prefix |= uint32_t(g.d) << shift, mask |= dmask << shift;
    krem -= g.above, in = g.in;
  }
  return {prefix | (common & ~vary), k - krem, in};
}

// keys[0, k) = the top k of keys[0, n) (unsorted), given their cut c: one in-place compaction (as prune's) keeps the
// keys above c.v and, when only some of its ties are kept, lists the ties at keys[n, n + c.ties); tie t (< kThreads)
// then takes slot c.above + its rank among the ties if that rank is below k - c.above.
__device__ void cut_compact(uint64_t* keys, int n, int k, const ValueCut& c, TopkSmem& sm) {
  const bool all_ties = c.above + c.ties == k;  // block-uniform
  uint64_t* ties = keys + n;
  if (threadIdx.x == 0) sm.new_count = 0, sm.tie_count = 0;
  __syncthreads();
  for (int base = 0; base < n; base += 4 * kThreads) {
    uint64_t v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = base + q * kThreads + threadIdx.x;
      v[q] = i < n ? keys[i] : 0;
    }
    __syncthreads();
    unsigned keep = 0, tie = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t w = uint32_t(v[q] >> 32);
      const bool in = base + q * kThreads + int(threadIdx.x) < n;
      keep |= (in && (w > c.v || (all_ties && w == c.v)) ? 1u : 0u) << q;
      tie |= (in && !all_ties && w == c.v ? 1u : 0u) << q;
    }
    append_masked<4>(keys, &sm.new_count, keep, [&](int q) { return v[q]; });
    if (!all_ties) append_masked<4>(ties, &sm.tie_count, tie, [&](int q) { return v[q]; });
  }
  __syncthreads();
  if (!all_ties) {
    const int t = threadIdx.x, need = k - c.above;
    const uint64_t a = t < c.ties ? ties[t] : 0;
    int rank = 0;
    for (int i = 0; i < c.ties; ++i) rank += ties[i] > a ? 1 : 0;  // the same address in every lane: a broadcast
    if (t < c.ties && rank < need) keys[c.above + rank] = a;  // below k <= n: never in the list
  }
  if (threadIdx.x == 0) sm.count = k;
  __syncthreads();
}

// finish_sorted's result (the held keys cut to exactly min(k, held), sorted descending, keys[kk, max(p, k)) zero) by
// the value cut. Ties beyond kThreads, or a list that would pass kCap, take finish_sorted's radix prune. kSort false:
// a probe (the bench's no-sort row) that leaves the kept keys unsorted.
template <bool kSort = true>
__device__ int finish_cut(uint64_t* keys, int k, TopkSmem& sm) {
  __syncthreads();
  const int n = sm.count;
  if (n > k) {  // block-uniform
    const ValueCut c = value_cut(keys, n, k, sm);
    if (c.above + c.ties > k && (c.ties > kThreads || n + c.ties > kCap)) prune(keys, k, 0, sm);
    else cut_compact(keys, n, k, c, sm);
  }
  const int kk = sm.count;
  int p = 1;
  while (p < kk) p <<= 1;
  for (int i = kk + threadIdx.x; i < max(p, k); i += kThreads) keys[i] = 0;
  __syncthreads();
  if constexpr (kSort) bitonic_sort_desc(keys, p);
  return kk;
}

}  // namespace vocab
}  // namespace kdb
