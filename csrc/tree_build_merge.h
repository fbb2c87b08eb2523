// The merge of split rows in the tree_build vocabulary pass (included by tree_build_vocab.h): every split block
// leaves its top-k keys sorted descending and 0-padded, so the row's top-k is a tree of pairwise bitonic merges
// of sorted lists, exact because keys are distinct. __host__ __device__ over a block policy (par::HostBlk runs
// it on one host thread in tests/test_tree_build.py). plans/0004 "tree_build", round 4.
#pragma once
#include <cstdint>

namespace kdb {
namespace vocab {

// One round of the merge tree over the cnt lists of p keys at keys[0, cnt * p): list a (a a multiple of 2 step)
// absorbs list a + step, if it exists. For lists A and B sorted descending, C[i] = max(A[i], B[p - 1 - i]) is
// the top p of A and B as a bitonic sequence (Batcher); the half-cleaners at strides p/2 .. 1 sort it
// descending. The max and the first half-cleaner are fused (a thread owns i and i + p/2), so a round costs
// log2(p) barriers (one when p = 1). Writes only to list a, each element by the thread that read it.
template <class Blk>
__host__ __device__ void merge_round(uint64_t* keys, int p, int cnt, int step) {
  const int pairs = (cnt - step + 2 * step - 1) / (2 * step), half = p > 1 ? p / 2 : 1;
  for (int t = Blk::tid(); t < pairs * half; t += Blk::size()) {
    uint64_t* A = keys + int64_t(t / half) * 2 * step * p;
    const uint64_t* B = A + int64_t(step) * p;
    const int i = t % half;
    if (p == 1) {
      A[0] = A[0] > B[0] ? A[0] : B[0];
      continue;
    }
    const uint64_t x = A[i] > B[p - 1 - i] ? A[i] : B[p - 1 - i];
    const uint64_t y = A[i + half] > B[half - 1 - i] ? A[i + half] : B[half - 1 - i];
    A[i] = x > y ? x : y, A[i + half] = x > y ? y : x;
  }
  Blk::sync();
  for (int h = half / 2; h > 0; h >>= 1) {
    for (int t = Blk::tid(); t < pairs * half; t += Blk::size()) {
      uint64_t* A = keys + int64_t(t / half) * 2 * step * p;
      const int u = t % half, i = 2 * u - (u & (h - 1)), j = i + h;
      const uint64_t a = A[i], b = A[j];
      if (a < b) A[i] = b, A[j] = a;
    }
    Blk::sync();
  }
}

// keys[0, k) = the top k of n lists in[s * k, s * k + k) (each sorted descending, 0-padded), sorted descending;
// keys holds cap >= 2 p keys (p = k rounded up to a power of two). Lists load in groups of cap / p - 1 behind
// the running result in list 0 (one group when n * p <= cap). Returns p; keys[k, p) are 0 or smaller keys.
template <class Blk>
__host__ __device__ int merge_sorted_lists(uint64_t* keys, int cap, const uint64_t* in, int n, int k) {
  int p = 1;
  while (p < k) p <<= 1;
  const int per = cap / p;
  for (int done = 0, held = 0; done < n; held = 1) {
    const int take = n - done < per - held ? n - done : per - held;
    for (int i = Blk::tid(); i < take * p; i += Blk::size()) {
      const int l = i / p, j = i % p;
      keys[int64_t(held + l) * p + j] = j < k ? in[int64_t(done + l) * k + j] : 0;
    }
    Blk::sync();
    for (int step = 1; step < held + take; step <<= 1) merge_round<Blk>(keys, p, held + take, step);
    done += take;
  }
  return p;
}

}  // namespace vocab
}  // namespace kdb
