// The kv_compact kernel template (device code, include from .cu files only): one CTA per (request, chunk of
// layers), a thread per (layer, column vector) chain, the moved rows found once per warp by a ballot.
// Shared by the launcher (kv_compact.cu) and the variant bench (reports/h200/kv_compact_bench.cu).
// Design and the in-place proof: plans/0004-kernels.md "## kv_compact".
#pragma once
#include <algorithm>

#include "common.h"
#include "kv_compact.h"

namespace kdb {

// Launch shape of one compaction. A CTA owns request b and layers [l0, l0 + layers_per_cta): every column
// vector of those rows, so no two CTAs touch the same memory.
struct KvCompactGeometry {
  int vecs;            // Vec-sized vectors per row
  int threads;         // blockDim.x, a multiple of 32 (warp-wide ballots), <= kKvCompactMaxThreads
  int layers_per_cta;  // chains per CTA = layers_per_cta * vecs
  int64_t ctas;        // batch * ceil(layers / layers_per_cta)
};

constexpr int kKvCompactMaxThreads = 512;

// ~256 threads per CTA: whole rows side by side (D 576 bf16 = 72 uint4 -> 4 rows = 288 threads), each
// thread then takes `chains_per_thread` layers. Rows wider than 512 vectors take several column passes.
inline KvCompactGeometry kv_compact_geometry(const KvCompactArgs& a, int vec_bytes, int chains_per_thread) {
  KvCompactGeometry g;
  g.vecs = int(int64_t(a.dim) * a.element_bytes / vec_bytes);
  const int lanes = g.vecs <= kKvCompactMaxThreads ? (256 + g.vecs / 2) / g.vecs : 0;
  const int wanted = lanes > 0 ? lanes * g.vecs : 256;
  g.threads = int(std::min<int64_t>(kKvCompactMaxThreads, ceil_div(wanted, 32) * 32));
  g.layers_per_cta = std::max(1, std::min(a.layers, g.threads * chains_per_thread / g.vecs));
  g.ctas = int64_t(a.batch) * ceil_div(a.layers, g.layers_per_cta);
  return g;
}

// Copies the next kGroup moved rows of `mask` (bit j = slot base + j moves; warp-uniform) for each of the
// thread's kCpt chains: every load of the group before any store. `src` is lane j's accepted[base + j].
// kStream: evict-first loads and stores (ld/st.global.cs); the default caching otherwise.
template <bool kStream, typename Vec>
__device__ __forceinline__ Vec load_vec(const Vec* p) {
  if constexpr (kStream) return __ldcs(p);
  else return *p;
}
template <bool kStream, typename Vec>
__device__ __forceinline__ void store_vec(Vec* p, Vec v) {
  if constexpr (kStream) __stcs(p, v);
  else *p = v;
}

template <typename Vec, int kCpt, int kGroup, bool kStream>
__device__ __forceinline__ void copy_group(Vec* const (&rows)[kCpt], const bool (&live)[kCpt], uint32_t& mask,
                                           int src, int base, int past, int vecs) {
  int from[kGroup], to[kGroup];
  bool on[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    on[j] = mask != 0;
    const int bit = on[j] ? __ffs(int(mask)) - 1 : 0;
    from[j] = past + __shfl_sync(kFullMask, src, bit);
    to[j] = past + base + bit;
    mask &= mask - 1;
  }
  Vec v[kGroup][kCpt];
#pragma unroll
  for (int j = 0; j < kGroup; ++j)
#pragma unroll
    for (int i = 0; i < kCpt; ++i)
      if (on[j] && live[i]) v[j][i] = load_vec<kStream>(rows[i] + int64_t(from[j]) * vecs);
#pragma unroll
  for (int j = 0; j < kGroup; ++j)
#pragma unroll
    for (int i = 0; i < kCpt; ++i)
      if (on[j] && live[i]) store_vec<kStream>(rows[i] + int64_t(to[j]) * vecs, v[j][i]);
}

// grid = min(ctas, 2^31 - 1) CTAs of g.threads threads (a grid-stride loop covers the rest).
template <typename Vec, int kCpt, int kGroup, bool kStream>
__global__ void __launch_bounds__(kKvCompactMaxThreads) kv_compact_kernel(KvCompactArgs a, KvCompactGeometry g) {
  const int lane = threadIdx.x & 31;
  for (int64_t id = blockIdx.x; id < g.ctas; id += gridDim.x) {
    const int b = int(id % a.batch), l0 = int(id / a.batch) * g.layers_per_cta;
    const int chains = min(g.layers_per_cta, a.layers - l0) * g.vecs;
    const int past = __ldg(a.past_lens + b), len = min(__ldg(a.accept_len + b), a.width);
    const int32_t* acc = a.accepted + int64_t(b) * a.width;
    for (int c0 = 0; c0 < chains; c0 += g.threads * kCpt) {  // one pass unless a row has > 512 vectors
      Vec* rows[kCpt];  // chain i: row r of (layer l0 + c / vecs, request b), column c % vecs, at rows[i][r * vecs]
      bool live[kCpt];
#pragma unroll
      for (int i = 0; i < kCpt; ++i) {
        const int c = c0 + i * g.threads + int(threadIdx.x), l = c / g.vecs;
        live[i] = c < chains;
        rows[i] = reinterpret_cast<Vec*>(a.cache) + ((int64_t(l0 + l) * a.batch + b) * a.seq) * g.vecs + (c - l * g.vecs);
      }
      // slots 0..31 are loaded before len is known (one dependent round trip fewer at the CTA's start)
      int src = kv_slot_source(acc, a.width, lane);
      for (int base = 0; base < len; base += 32) {  // 32 accepted slots per ballot, ascending
        const int k = base + lane;
        if (base > 0) src = kv_slot_source(acc, a.width, k);
        const bool moves = kv_slot_moves(k, len, src, past, a.seq);  // rows outside the cache are not touched
        uint32_t mask = __ballot_sync(kFullMask, moves);
        while (mask) copy_group<Vec, kCpt, kGroup, kStream>(rows, live, mask, src, base, past, g.vecs);
      }
    }
  }
}

// max_grid > 0 caps the grid (a persistent launch: the CTAs then stride over the (request, chunk) ids).
template <typename Vec, int kCpt, int kGroup, bool kStream = false>
cudaError_t kv_compact_launch_as(const KvCompactArgs& a, cudaStream_t stream, int64_t max_grid = 0) {
  const KvCompactGeometry g = kv_compact_geometry(a, int(sizeof(Vec)), kCpt);
  const unsigned grid = unsigned(std::min<int64_t>(g.ctas, max_grid > 0 ? max_grid : INT32_MAX));
  kv_compact_kernel<Vec, kCpt, kGroup, kStream><<<grid, g.threads, 0, stream>>>(a, g);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

}  // namespace kdb
