// The merge of split rows in the tree_build vocabulary pass (included by tree_build_vocab.h): every split block
// leaves its top-k keys sorted descending and 0-padded, so the row's top-k is a tree of pairwise bitonic merges
// of sorted lists, exact because keys are distinct. __host__ __device__ over a block policy (par::HostBlk runs
// it on one host thread in tests/test_tree_build_merge.py). plans/0004 "tree_build", round 4.
#pragma once
#include <cstdint>

#include "common.h"

namespace kdb {
namespace vocab {

// Merge of list A with list B into A (both sorted descending, p keys): C[i] = max(A[i], B[p - 1 - i]) is the top p
// of A and B as a bitonic sequence (Batcher); the half-cleaners at strides p/2 .. 1 sort it descending. The max
// and the first half-cleaner are fused (a lane owns i and i + p/2). The lanes lane0, lane0 + step, ... < p / 2 of
// one warp (or of the block, with Blk::sync between stages) do it; sync is called after every stage.
template <class Sync>
__host__ __device__ void merge_pair(uint64_t* __restrict__ A, const uint64_t* __restrict__ B, int lg, int lane0,
                                    int step, Sync sync) {
  const int p = 1 << lg, half = p > 1 ? p / 2 : 1;
  for (int i = lane0; i < half; i += step) {
    if (p == 1) {
      A[0] = A[0] > B[0] ? A[0] : B[0];
      continue;
    }
    const uint64_t x = A[i] > B[p - 1 - i] ? A[i] : B[p - 1 - i];
    const uint64_t y = A[i + half] > B[half - 1 - i] ? A[i + half] : B[half - 1 - i];
    A[i] = x > y ? x : y, A[i + half] = x > y ? y : x;
  }
  sync();
  for (int h = half / 2; h > 0; h >>= 1) {
    for (int u = lane0; u < half; u += step) {
      const int i = 2 * u - (u & (h - 1)), j = i + h;
      const uint64_t a = A[i], b = A[j];
      if (a < b) A[i] = b, A[j] = a;
    }
    sync();
  }
}

// One round of the merge tree over the cnt lists of p keys at keys[0, cnt * p): list a (a a multiple of 2 step)
// absorbs list a + step, if it exists. Lists of p <= kWarpMergeMax keys are merged by one warp each (no block
// barrier inside the round: log2(p) __syncwarp); longer ones by the whole block (log2(p) barriers).
constexpr int kWarpMergeMax = 256;
template <class Blk>
__host__ __device__ void merge_round(uint64_t* __restrict__ keys, int lg, int cnt, int step) {
  const int pairs = ceil_div(cnt - step, 2 * step);
  const int64_t list = int64_t(1) << lg;
  if (list <= kWarpMergeMax) {
    const int warps = Blk::size() >= 32 ? Blk::size() / 32 : 1, lanes = Blk::size() >= 32 ? 32 : Blk::size();
    for (int q = Blk::tid() / 32; q < pairs; q += warps)
      merge_pair(keys + q * 2 * step * list, keys + (q * 2 * step + step) * list, lg, Blk::tid() % 32, lanes,
                 [] { Blk::sync_warp(); });
    Blk::sync();
    return;
  }
  for (int q = 0; q < pairs; ++q)  // p >= 512: at most cap / p = 12 lists, so few pairs; the block shares each
    merge_pair(keys + q * 2 * step * list, keys + (q * 2 * step + step) * list, lg, Blk::tid(), Blk::size(),
               [] { Blk::sync(); });
}

// keys[0, k) = the top k of n lists in[s * k, s * k + k) (each sorted descending, 0-padded), sorted descending;
// keys holds cap >= 2 p keys (p = k rounded up to a power of two). Lists load in groups of cap / p - 1 behind
// the running result in list 0 (one group when n * p <= cap). Returns p; keys[k, p) are 0 or smaller keys.
template <class Blk>
__host__ __device__ int merge_sorted_lists(uint64_t* __restrict__ keys, int cap, const uint64_t* __restrict__ in,
                                           int n, int k) {
  int lg = 0;
  while ((1 << lg) < k) ++lg;
  const int p = 1 << lg, per = cap / p;
  for (int done = 0, held = 0; done < n; held = 1) {
    const int take = n - done < per - held ? n - done : per - held, m = take << lg;
    copy_batched<8, uint64_t>(m, Blk::tid(), Blk::size(), [&](int i) {
      const int j = i & (p - 1);
      return j < k ? in[int64_t(done + (i >> lg)) * k + j] : uint64_t(0);
    }, [&](int i, uint64_t v) { keys[(int64_t(held) << lg) + i] = v; });
    Blk::sync();
    for (int step = 1; step < held + take; step <<= 1) merge_round<Blk>(keys, lg, held + take, step);
    done += take;
  }
  return p;
}

}  // namespace vocab
}  // namespace kdb
