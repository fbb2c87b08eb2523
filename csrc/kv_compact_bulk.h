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

constexpr int kKvBulkSmemBytes = 45 * 1024;  // most dynamic smem a CTA takes (<= 48 KB with the statics: no opt-in)

// Launch shape: a CTA (one warp) owns request b and layers [l0, l0 + layers_per_cta), every byte of those rows, and
// moves them in batches of rows_per_batch rows through `stages` shared buffers (2: the loads of batch i + 1 run under
// the stores of batch i). Shared memory per CTA = stages * rows_per_batch * row_bytes <= kKvBulkSmemBytes.
struct KvBulkGeometry {
  int64_t row_bytes;
  int rows_per_batch;
  int stages;          // 1 or 2
  int layers_per_cta;
  bool late_index;     // the bench's A/B only: slots 0..31 loaded after accept_len (as until s17), not with it
  int64_t ctas;        // batch * ceil(layers / layers_per_cta)
  size_t smem_bytes() const { return size_t(stages) * size_t(rows_per_batch) * size_t(row_bytes); }
};

// What the launcher takes (s18): one layer per CTA and 16-row batches (every moved row of a depth-15 tree's path in
// one batch), the fastest shape of s17's sweep (plans/0004 "## kv_compact"); the bench's rows force others (> 0 each).
constexpr int kKvBulkLayersPerCta = 1, kKvBulkRows = 16, kKvBulkStages = 1;
struct KvBulkShape { int layers_per_cta = 0, rows_per_batch = 0, stages = 0; bool late_index = false; };
inline KvBulkGeometry kv_bulk_geometry(const KvCompactArgs& a, KvBulkShape want = {}) {
  KvBulkGeometry g;
  g.row_bytes = std::max<int64_t>(int64_t(a.dim) * a.element_bytes, 1);
  const int most_rows = int(std::max<int64_t>(kKvBulkSmemBytes / g.row_bytes, 1));  // kv_bulk_fits: >= 1
  g.rows_per_batch = std::clamp(want.rows_per_batch > 0 ? want.rows_per_batch : kKvBulkRows, 1, most_rows);
  g.stages = std::clamp(want.stages > 0 ? want.stages : kKvBulkStages, 1, std::min(2, most_rows / g.rows_per_batch));
  const int lpc = want.layers_per_cta > 0 ? want.layers_per_cta : kKvBulkLayersPerCta;
  g.layers_per_cta = std::clamp(lpc, 1, std::max(a.layers, 1));
  g.late_index = want.late_index;
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

// The n rows listed in from / to (the moved slots of one ballot) of every layer of the CTA, as items in layer-major
// order, cut into batches of g.rows_per_batch. Item i of a batch sits in slot i of its buffer and lane i % 32 loads
// and stores it, so a lane's bulk_wait_read covers every store out of the slots it reloads.
struct KvBulkItems {
  const KvBulkCta& c;
  const int *from, *to;
  int n, items;
  uint8_t* buf;        // g.stages buffers of g.rows_per_batch rows
  uint32_t bar0, bar1;  // the buffers' mbarriers (not an array: a dynamic index would put it on the stack)
  __device__ __forceinline__ uint32_t bar(int j) const { return j % c.g.stages ? bar1 : bar0; }
  __device__ __forceinline__ int count(int j) const { return min(c.g.rows_per_batch, items - j * c.g.rows_per_batch); }
  __device__ __forceinline__ uint32_t buffer(int j) const {  // batch j's buffer: j % stages; item i at + i * row bytes
    return smem_addr(buf) + uint32_t(j % c.g.stages) * uint32_t(c.g.rows_per_batch) * uint32_t(c.g.row_bytes);
  }
  // Batch j's loads: lane 0 announces its bytes, then every lane issues its rows.
  __device__ __forceinline__ void load(int j) const {
    const int lane = threadIdx.x & 31, i0 = j * c.g.rows_per_batch, cnt = count(j);
    const uint32_t bytes = uint32_t(c.g.row_bytes), base = buffer(j);
    if (lane == 0) mbar_expect_tx(bar(j), uint32_t(cnt) * bytes);
    __syncwarp();
    for (int i = lane; i < cnt; i += 32)
      bulk_load(base + uint32_t(i) * bytes, c.row((i0 + i) / n, from[(i0 + i) % n]), bytes, bar(j));
  }
  __device__ __forceinline__ void store(int j) const {
    const int lane = threadIdx.x & 31, i0 = j * c.g.rows_per_batch, cnt = count(j);
    const uint32_t bytes = uint32_t(c.g.row_bytes), base = buffer(j);
    for (int i = lane; i < cnt; i += 32)
      bulk_store(c.row((i0 + i) / n, to[(i0 + i) % n]), base + uint32_t(i) * bytes, bytes);
    bulk_commit();
  }
};

// Every batch's loads land before any of its stores issue, and the waits go in batch order, so a store never
// overwrites a row an earlier item still has to read. A later item's load may run ahead of earlier stores: its
// source accepted[k] >= k lies above every earlier destination k' < k (plans/0004 "## kv_compact", Session 17).
// With 2 stages the loads of batch j + 1 go out once the stores of batch j - 1 (same buffer) have read it; parity:
// one bit per buffer.
__device__ __forceinline__ void kv_bulk_rows(const KvBulkItems& it, uint32_t& parity) {
  const int batches = ceil_div(it.items, it.c.g.rows_per_batch), stages = it.c.g.stages;
  it.load(0);
  for (int j = 0; j < batches; ++j) {
    if (stages == 2 && j + 1 < batches) bulk_wait_read(), __syncwarp(), it.load(j + 1);
    const int s = j % stages;
    mbar_wait(it.bar(j), (parity >> s) & 1u);
    parity ^= 1u << s;
    it.store(j);
    if (stages == 1 && j + 1 < batches) bulk_wait_read(), __syncwarp(), it.load(j + 1);
  }
  bulk_wait_read();
  __syncwarp();  // the next ballot's loads overwrite these slots
}

// grid = g.ctas CTAs of 32 threads, g.smem_bytes() of dynamic shared memory.
__global__ void __launch_bounds__(32) kv_compact_bulk_kernel(KvCompactArgs a, KvBulkGeometry g) {
  extern __shared__ __align__(128) uint8_t kvb_smem[];
  __shared__ __align__(8) uint64_t bar_words[2];
  __shared__ int from[32], to[32];
  const int lane = threadIdx.x & 31;
  const int b = int(blockIdx.x % a.batch), l0 = int(blockIdx.x / a.batch) * g.layers_per_cta;
  const uint32_t bar0 = smem_addr(&bar_words[0]), bar1 = smem_addr(&bar_words[1]);
  if (lane == 0) mbar_init(bar0, 1), mbar_init(bar1, 1), fence_mbar_init();
  __syncwarp();
  pdl_wait();  // a programmatic dependent: no global read before the previous kernel (which wrote the indices) is done
  pdl_launch_dependents();
  const int32_t* acc = a.accepted + int64_t(b) * a.width;
  // slots 0..31 load with past and accept_len: one dependent round trip fewer before the first bulk load
  int src = g.late_index ? lane : kv_slot_source(acc, a.width, lane);
  const int past = __ldg(a.past_lens + b), len = min(__ldg(a.accept_len + b), a.width);
  const KvBulkCta c{a, g, b, l0, min(g.layers_per_cta, a.layers - l0), past};
  uint32_t parity = 0;
  for (int base = 0; base < len; base += 32) {  // 32 accepted slots per ballot, ascending
    const int k = base + lane;
    if (base > 0 || g.late_index) src = kv_slot_source(acc, a.width, k);
    const bool moves = kv_slot_moves(k, len, src, past, a.seq);  // rows outside the cache are not touched
    const uint32_t mask = __ballot_sync(kFullMask, moves);
    if (moves) {
      const int r = __popc(mask & ((1u << lane) - 1u));  // rank among the moved slots
      from[r] = src, to[r] = k;
    }
    __syncwarp();
    const int n = __popc(mask);
    if (n) kv_bulk_rows(KvBulkItems{c, from, to, n, c.layers * n, kvb_smem, bar0, bar1}, parity);
    __syncwarp();  // from / to are rewritten by the next ballot
  }
}

// Needs kv_bulk_fits(a) and an sm_90a build. A programmatic dependent of the stream's previous kernel (launch_pdl;
// KDB_PDL=0 launches it in plain stream order): its launch and barrier set-up overlap that kernel's tail.
inline cudaError_t kv_compact_bulk_launch(const KvCompactArgs& a, cudaStream_t stream, KvBulkShape want = {}) {
  const KvBulkGeometry g = kv_bulk_geometry(a, want);
  if (g.ctas > INT32_MAX) return cudaErrorInvalidConfiguration;
  return launch_pdl(kv_compact_bulk_kernel, dim3(unsigned(g.ctas)), dim3(32), g.smem_bytes(), stream, a, g);
}

}  // namespace kdb
