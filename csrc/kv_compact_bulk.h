// kv_compact's bulk path (sm_90a, device code; include from .cu files only): one warp per (request, chunk of layers)
// moves whole rows with the copy engine's bulk copies (cp.async.bulk) through shared memory: every moved row of a
// batch loaded on one mbarrier, then stored, instead of a thread per 16-byte column vector. Same skip rules and
// in-place order as kv_compact_kernel.h (every load of a row set lands before any of its stores; ballot groups go
// in ascending slots). Shared by the launcher (kv_compact.cu) and reports/h200/kv_compact_bench.cu.
// Design, the in-place proof and the figures: plans/0004-kernels.md "## kv_compact".
#pragma once
#include <algorithm>

#include "common.h"
#include "kv_compact.h"
#include "ptx_tma.h"

namespace kdb {

constexpr int kKvBulkSmemBytes = 45 * 1024;  // a batch of rows; 4 CTAs per SM, no opt-in (<= 48 KB with the statics)

// Launch shape: a CTA (one warp) owns request b and layers [l0, l0 + layers_per_cta), every byte of those rows.
struct KvBulkGeometry {
  int64_t row_bytes;
  int rows_per_batch;  // rows one shared-memory batch holds
  int layers_per_cta;
  int64_t ctas;        // batch * ceil(layers / layers_per_cta)
};

// Two layers per CTA: the fastest of 1 / 2 / 4 / 16 and of "one wave of 4 CTAs per SM" (8 layers at B 64) at B 8, 64
// and 128 in the s16 bench (plans/0004 "## kv_compact"); layers_per_cta > 0 forces another count (the bench's rows).
constexpr int kKvBulkLayersPerCta = 2;
inline KvBulkGeometry kv_bulk_geometry(const KvCompactArgs& a, int layers_per_cta = 0) {
  KvBulkGeometry g;
  g.row_bytes = int64_t(a.dim) * a.element_bytes;
  g.rows_per_batch = int(kKvBulkSmemBytes / std::max<int64_t>(g.row_bytes, 1));
  const int lpc = layers_per_cta > 0 ? layers_per_cta : kKvBulkLayersPerCta;
  g.layers_per_cta = std::clamp(lpc, 1, std::max(a.layers, 1));
  g.ctas = int64_t(a.batch) * ceil_div(a.layers, g.layers_per_cta);
  return g;
}

// The bulk path applies to rows a batch holds whose bytes and base are 16-byte aligned.
inline bool kv_bulk_fits(const KvCompactArgs& a) {
  const int64_t row_bytes = int64_t(a.dim) * a.element_bytes;
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.cache) % 16 == 0 && row_bytes <= kKvBulkSmemBytes;
}

struct KvBulkCta {  // what one CTA moves
  const KvCompactArgs& a;
  const KvBulkGeometry& g;
  int b, l0, layers, past;
  __device__ __forceinline__ uint8_t* row(int l, int r) const {  // row r of (layer l0 + l, request b)
    return static_cast<uint8_t*>(a.cache) + ((int64_t(l0 + l) * a.batch + b) * a.seq + past + r) * g.row_bytes;
  }
};

// Moves the n rows listed in from / to (moved slots of one ballot) of every layer of the CTA, in batches of
// g.rows_per_batch (layer-major items): lane 0 announces the batch's bytes, the lanes issue its loads, all wait on
// the mbarrier, then each lane stores what it loaded and waits until its stores have read shared memory.
__device__ __forceinline__ void kv_bulk_rows(const KvBulkCta& c, const int* from, const int* to, int n, uint8_t* buf,
                                             uint32_t bar, uint32_t& parity) {
  const int lane = threadIdx.x & 31, items = c.layers * n;
  const uint32_t bytes = uint32_t(c.g.row_bytes), base = smem_addr(buf);
  for (int i0 = 0; i0 < items; i0 += c.g.rows_per_batch) {
    const int cnt = min(c.g.rows_per_batch, items - i0);
    if (lane == 0) mbar_expect_tx(bar, uint32_t(cnt) * bytes);
    __syncwarp();
    for (int i = lane; i < cnt; i += 32)
      bulk_load(base + uint32_t(i) * bytes, c.row((i0 + i) / n, from[(i0 + i) % n]), bytes, bar);
    mbar_wait(bar, parity);
    parity ^= 1u;
    for (int i = lane; i < cnt; i += 32)
      bulk_store(c.row((i0 + i) / n, to[(i0 + i) % n]), base + uint32_t(i) * bytes, bytes);
    bulk_commit();
    bulk_wait_read();
    __syncwarp();  // the next batch's loads overwrite this one's rows
  }
}

// grid = g.ctas CTAs of 32 threads, g.rows_per_batch * row_bytes of dynamic shared memory.
__global__ void __launch_bounds__(32) kv_compact_bulk_kernel(KvCompactArgs a, KvBulkGeometry g) {
  extern __shared__ __align__(128) uint8_t kvb_smem[];
  __shared__ __align__(8) uint64_t bar_word;
  __shared__ int from[32], to[32];
  const int lane = threadIdx.x & 31;
  const int b = int(blockIdx.x % a.batch), l0 = int(blockIdx.x / a.batch) * g.layers_per_cta;
  const int past = __ldg(a.past_lens + b), len = min(__ldg(a.accept_len + b), a.width);
  const int32_t* acc = a.accepted + int64_t(b) * a.width;
  const uint32_t bar = smem_addr(&bar_word);
  if (lane == 0) mbar_init(bar, 1), fence_mbar_init();
  __syncwarp();
  const KvBulkCta c{a, g, b, l0, min(g.layers_per_cta, a.layers - l0), past};
  uint32_t parity = 0;
  for (int base = 0; base < len; base += 32) {  // 32 accepted slots per ballot, ascending
    const int k = base + lane;
    const int src = k < a.width ? __ldg(acc + k) : k;
    const bool moves = kv_slot_moves(k, len, src, past, a.seq);  // rows outside the cache are not touched
    const uint32_t mask = __ballot_sync(kFullMask, moves);
    if (moves) {
      const int r = __popc(mask & ((1u << lane) - 1u));  // rank among the moved slots
      from[r] = src, to[r] = k;
    }
    __syncwarp();
    if (mask) kv_bulk_rows(c, from, to, __popc(mask), kvb_smem, bar, parity);
    __syncwarp();  // from / to are rewritten by the next ballot
  }
}

// Needs kv_bulk_fits(a) and an sm_90a build.
inline cudaError_t kv_compact_bulk_launch(const KvCompactArgs& a, cudaStream_t stream, int layers_per_cta = 0) {
  const KvBulkGeometry g = kv_bulk_geometry(a, layers_per_cta);
  if (g.ctas > INT32_MAX) return cudaErrorInvalidConfiguration;
  const size_t smem = size_t(g.rows_per_batch) * size_t(g.row_bytes);
  kv_compact_bulk_kernel<<<unsigned(g.ctas), 32, smem, stream>>>(a, g);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

}  // namespace kdb
