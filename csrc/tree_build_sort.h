// The block's final sort of the tree_build vocabulary pass by CUB's block radix sort (kRadixSort, included by
// tree_build_vocab.h) on 32-bit keys made of the bits in which the kept keys differ. The bitonic sort moves every
// 64-bit key through shared memory at each of its log2(p)(log2(p) + 1) / 2 stages (55 at p 1024) and the four
// blocks of an SM sort at once at the end of a one-wave launch (s23 call B: 8 us a wave at k 256, 18 us at k 1024);
// the radix sort moves 32-bit keys once a 4-bit digit. plans/0004 "tree_build", Session 23.
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

// keys[0, kk) sorted descending, thread t holding items [t kItems, (t + 1) kItems) (CUB's blocked arrangement;
// items at or beyond kk are packed as 0 and, the sort being stable, stay behind every real key), then
// keys[kk, pad) = 0. The sort's scratch aliases keys: every key is read into registers first.
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

// The end's sort of keys[0, kk) (kk <= k, zero-padded to max(p, k), p the power of two >= kk): the radix sort where
// the keys fit it, else the bitonic sort.
__device__ void sort_kept(uint64_t* keys, int kk, int k, TopkSmem& sm) {
  int p = 1;
  while (p < kk) p <<= 1;
  if (kk > 1 && !radix_sort_desc(keys, kk, max(p, k), sm)) bitonic_sort_desc(keys, p);
}

}  // namespace vocab
}  // namespace kdb
