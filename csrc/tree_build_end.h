// The block's end of the tree_build vocabulary pass (included by tree_build_vocab.h): the held keys cut to the top k
// (the radix prune of tree_build_select.h, or by rank where few are held) and sorted descending, by CUB's block radix
// sort on 32-bit keys made of the bits in which they differ where more than kRadixMinKeys are kept and those bits fit,
// else by the bitonic sort. The bitonic sort moves every 64-bit key through shared memory at each of its
// log2(p)(log2(p) + 1) / 2 stages (55 at p 1024), and the four blocks of an SM sort at once at the end of a one-wave
// launch (s23 call B: 8 us a wave at k 256, 18 us at k 1024); the radix sort moves 32-bit keys once a 4-bit digit
// (s23 call C: -10 us at B 32 K 1024; a tie at k 128, slower below). plans/0004 "tree_build", Session 23.
#pragma once
#include <cub/block/block_radix_sort.cuh>

#include "common.h"
#include "tree_build_select.h"

namespace kdb {
namespace vocab {

// The bits in which n keys differ, as a 32-bit sort key: the high word's varying span [h0, h0 + hb), then the low
// word's [l0, l0 + lb); every bit outside the spans is the same in all keys, so the order of the packed keys is the
// order of the keys, and common restores the rest. fits: hb + lb <= 32.
struct Packed {
  uint64_t common;
  int h0, hb, l0, lb;
  __device__ Packed(uint64_t vary, uint64_t common_bits) : common(common_bits) {
    const uint32_t vh = uint32_t(vary >> 32), vl = uint32_t(vary);
    h0 = vh ? __ffs(vh) - 1 : 0, hb = vh ? 32 - __clz(vh) - h0 : 0;
    l0 = vl ? __ffs(vl) - 1 : 0, lb = vl ? 32 - __clz(vl) - l0 : 0;
  }
  __device__ bool fits() const { return hb + lb <= 32; }
  __device__ static uint64_t ones(int b) { return (1ull << b) - 1ull; }  // b <= 32
  __device__ uint32_t pack(uint64_t key) const {
    const uint64_t hi = ((key >> 32) >> h0) & ones(hb), lo = (uint32_t(key) >> l0) & ones(lb);
    return uint32_t((hi << lb) | lo);
  }
  __device__ uint64_t unpack(uint32_t s) const {
    const uint64_t hi = (uint64_t(s) >> lb) & ones(hb), lo = uint64_t(s) & ones(lb);
    const uint64_t span = (ones(hb) << (32 + h0)) | (ones(lb) << l0);
    return (common & ~span) | (hi << (32 + h0)) | (lo << l0);
  }
};

// keys[0, kk) sorted descending, thread t holding items [t kItems, (t + 1) kItems) (CUB's blocked arrangement), then
// keys[kk, pad) = 0. Items at or beyond kk are packed as 0: they sort last, and where a real key packs to 0 as well
// it unpacks to the same key whichever of them lands at slot kk - 1. The sort's scratch aliases keys: every key is
// read into registers first.
template <int kItems>
__device__ void radix_sort_items(uint64_t* keys, int kk, int pad, const Packed& pk) {
  using Sort = cub::BlockRadixSort<uint32_t, kThreads, kItems>;
  static_assert(sizeof(typename Sort::TempStorage) <= kCap * sizeof(uint64_t), "scratch in the key array");
  uint32_t s[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = int(threadIdx.x) * kItems + j;
    s[j] = i < kk ? pk.pack(keys[i]) : 0u;
  }
  __syncthreads();
  Sort(*reinterpret_cast<typename Sort::TempStorage*>(keys)).SortDescending(s, 0, max(1, pk.hb + pk.lb));
  __syncthreads();  // the scratch is dead
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = int(threadIdx.x) * kItems + j;
    if (i < kk) keys[i] = pk.unpack(s[j]);
  }
  for (int i = kk + threadIdx.x; i < pad; i += kThreads) keys[i] = 0;
  __syncthreads();
}

// All threads, 1 <= kk <= 4 kThreads: keys[0, kk) sorted descending by the radix sort and keys[kk, pad) zeroed, when
// their differing bits fit 32 (bf16 logits: a few value bits and the ids' 18); returns false, having changed nothing,
// when they do not (fp32 logits, whose value words differ in ~23 bits).
__device__ bool radix_sort_desc(uint64_t* keys, int kk, int pad, TopkSmem& sm) {
  uint64_t vary, common;
  varying_bits(keys, kk, sm, vary, common);
  const Packed pk(vary, common);
  if (!pk.fits()) return false;  // block-uniform
  if (kk <= kThreads) radix_sort_items<1>(keys, kk, pad, pk);
  else if (kk <= 2 * kThreads) radix_sort_items<2>(keys, kk, pad, pk);
  else radix_sort_items<4>(keys, kk, pad, pk);
  return true;
}

constexpr int kRadixMinKeys = 128;  // at most this many kept keys: the bitonic sort (call C: a tie at 128)

// The end's sort of keys[0, kk) (kk <= k, zero-padded to max(p, k), p the power of two >= kk). kRadix false: the
// bitonic sort at every size (s22, the bench's A/B rows).
template <bool kRadix = true>
__device__ void sort_kept(uint64_t* keys, int kk, int k, TopkSmem& sm) {
  int p = 1;
  while (p < kk) p <<= 1;
  if (kRadix && kk > kRadixMinKeys && radix_sort_desc(keys, kk, max(p, k), sm)) return;  // block-uniform
  bitonic_sort_desc(keys, p);
}

// The held candidates cut to exactly min(k, held) and sorted descending; keys[kk, max(p, k)) are 0. kSort false: a
// probe (the bench's no-sort rows) that leaves them unsorted.
template <bool kRadix = true, bool kSort = true>
__device__ int finish_sorted(uint64_t* keys, int k, TopkSmem& sm) {
  __syncthreads();
  if (sm.count > k) prune(keys, k, 0, sm);
  const int kk = sm.count;
  int p = 1;
  while (p < kk) p <<= 1;
  for (int i = kk + threadIdx.x; i < max(p, k); i += kThreads) keys[i] = 0;
  __syncthreads();
  if constexpr (kSort) sort_kept<kRadix>(keys, kk, k, sm);
  return kk;
}

// finish_sorted's result by ranks where n = sm.count <= kThreads (else finish_sorted): thread t ranks key t against
// all n (rank = how many keys are larger; keys are distinct, so ranks are too) and writes it to keys[rank] if rank < k.
// n compares a thread, one pass and two barriers instead of radix passes and a sort (a limit of 2 kThreads keys, two a
// thread, was slower at k 256: plans/0004 Session 20).
__device__ int finish_by_rank(uint64_t* keys, int k, TopkSmem& sm) {
  __syncthreads();
  const int n = sm.count, t = threadIdx.x;
  if (n > kThreads) return finish_sorted(keys, k, sm);  // block-uniform
  const uint64_t a = t < n ? keys[t] : 0;
  int ra = 0;
#pragma unroll 4
  for (int i = 0; i < n; ++i) ra += keys[i] > a ? 1 : 0;  // the same address in every lane: a broadcast
  __syncthreads();  // every key is read before any moves
  if (t < n && ra < k) keys[ra] = a;
  const int kk = min(k, n);
  for (int i = kk + t; i < k; i += kThreads) keys[i] = 0;
  if (t == 0) sm.count = kk;
  __syncthreads();
  return kk;
}

}  // namespace vocab
}  // namespace kdb
