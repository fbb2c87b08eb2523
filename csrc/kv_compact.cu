// kv_compact kernel: one thread per (layer, request, column vector). Each thread copies its vector of
// every accepted row in ascending k, loads of a group of rows before their stores: with accepted[k] >= k
// no load ever reads a row that an earlier store wrote. Design: plans/0004-kernels.md "## kv_compact".
#include "common.h"
#include "kv_compact.h"

namespace kdb {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 8;  // rows loaded before they are stored: 8 independent loads in flight

template <typename Vec>
__global__ void __launch_bounds__(kThreads) compact_kernel(KvCompactArgs a, int vecs_per_row) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t total = int64_t(a.layers) * a.batch * vecs_per_row;
  if (t >= total) return;
  const int col = int(t % vecs_per_row);
  const int64_t lb = t / vecs_per_row;  // layer * B + b
  const int b = int(lb % a.batch);
  const int past = __ldg(a.past_lens + b), len = min(__ldg(a.accept_len + b), a.width);
  const int32_t* acc = a.accepted + int64_t(b) * a.width;
  Vec* rows = reinterpret_cast<Vec*>(a.cache) + lb * a.seq * vecs_per_row + col;  // row r at rows[r * vecs]
  for (int k0 = 0; k0 < len; k0 += kGroup) {
    Vec v[kGroup];
    bool move[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int k = k0 + j, src = k < len ? __ldg(acc + k) : k;
      move[j] = src != k && src >= 0 && past + src < a.seq && past + k < a.seq;
      if (move[j]) v[j] = rows[int64_t(past + src) * vecs_per_row];
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      if (move[j]) rows[int64_t(past + k0 + j) * vecs_per_row] = v[j];
  }
}

template <typename Vec>
cudaError_t launch(const KvCompactArgs& a, cudaStream_t stream) {
  const int vecs = int(int64_t(a.dim) * a.element_bytes / sizeof(Vec));
  const int64_t total = int64_t(a.layers) * a.batch * vecs;
  compact_kernel<Vec><<<unsigned(ceil_div<int64_t>(total, kThreads)), kThreads, 0, stream>>>(a, vecs);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

}  // namespace

cudaError_t kv_compact_launch(const KvCompactArgs& a, cudaStream_t stream) {
  if (int64_t(a.layers) * a.batch * a.dim == 0 || a.width == 0) return cudaSuccess;
  // The widest vector that divides every row and the base alignment.
  const int64_t row_bytes = int64_t(a.dim) * a.element_bytes;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(a.cache);
  if (row_bytes % 16 == 0 && addr % 16 == 0) return launch<uint4>(a, stream);
  if (row_bytes % 8 == 0 && addr % 8 == 0) return launch<uint2>(a, stream);
  if (row_bytes % 4 == 0 && addr % 4 == 0) return launch<uint32_t>(a, stream);
  return launch<uint16_t>(a, stream);
}

}  // namespace kdb
