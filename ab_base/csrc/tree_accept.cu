// tree_accept kernels: the greedy walk (one block per request: parents from the LCRS links by pointer
// jumping in shared memory, the matching child of every node, then one thread walks from the root) and
// the per-node inverse-CDF sampler (one block per probability row). Design: plans/0004-kernels.md.
#include <climits>

#include "common.h"
#include "tree_accept.h"

namespace kdb {
namespace {

constexpr int kWalkThreads = 256;

__global__ void __launch_bounds__(kWalkThreads) greedy_kernel(AcceptGreedyArgs a) {
  extern __shared__ int walk_smem[];
  const int b = blockIdx.x, N = a.nodes, tid = threadIdx.x;
  const int n = min(max(a.n_nodes[b], 1), N);
  const int64_t base = int64_t(b) * N;
  int* owner = walk_smem;          // owner[h] = u when h is u's first child, else -1
  int* match = walk_smem + N;      // smallest child of u whose token is target[u], else INT_MAX
  int* head = walk_smem + 2 * N;   // left sibling; after pointer jumping, the first sibling
  int* head2 = walk_smem + 3 * N;  // double buffer for the jumps
  for (int i = tid; i < N; i += kWalkThreads) owner[i] = -1, match[i] = INT_MAX, head[i] = i;
  __syncthreads();
  for (int u = tid; u < n; u += kWalkThreads) {
    const int f = a.first_child[base + u], s = a.next_sibling[base + u];
    if (f > 0 && f < n) owner[f] = u;  // links outside [1, n) are ignored: padding is unreachable
    if (s > 0 && s < n) head[s] = u;
  }
  __syncthreads();
  for (int span = 1; span < n; span <<= 1) {  // ceil(log2 n) rounds: chains are shorter than n
    for (int c = tid; c < n; c += kWalkThreads) head2[c] = head[head[c]];
    __syncthreads();
    int* t = head;
    head = head2, head2 = t;
  }
  for (int c = 1 + tid; c < n; c += kWalkThreads) {
    const int p = owner[head[c]];
    if (p >= 0 && a.tokens[base + c] == a.target_tokens[base + p]) atomicMin(&match[p], c);
  }
  __syncthreads();
  if (tid != 0) return;
  int32_t* acc = a.accepted + int64_t(b) * a.width;
  int node = 0, len = 1;
  acc[0] = 0;
  while (len < a.width && match[node] != INT_MAX) node = match[node], acc[len++] = node;
  for (int k = len; k < a.width; ++k) acc[k] = -1;
  a.accept_len[b] = len;
  a.bonus[b] = a.target_tokens[base + node];
}

constexpr int kSampleThreads = 256;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kPerLane = 16;
constexpr int kWarpChunk = 32 * kPerLane;  // 512 probabilities; element q*32 + lane of a chunk is lane's

// Warp 0: turn chunk sums into exclusive prefix sums in place (lanes own contiguous runs); returns the total.
__device__ double chunk_prefix(double* chunk, int nch, int lane) {
  const int seg = ceil_div(nch, 32), c0 = min(lane * seg, nch), c1 = min(c0 + seg, nch);
  double t = 0.0;
  for (int c = c0; c < c1; ++c) t += chunk[c];
  const double incl = warp_inclusive_scan(t, lane);
  const double up = __shfl_up_sync(kFullMask, incl, 1);
  double run = lane == 0 ? 0.0 : up;
  for (int c = c0; c < c1; ++c) {
    const double v = chunk[c];
    chunk[c] = run;
    run += v;
  }
  __syncwarp();
  return __shfl_sync(kFullMask, incl, 31);
}

// Warp 0: the smallest j with p[j] > 0 and thr < c[j], scanning from chunk `start`; -1 if none.
__device__ int scan_for_draw(const float* p, int V, const double* prefix, int nch, int start, double thr, int lane) {
  for (int c = start; c < nch; ++c) {
    double off = prefix[c];
    for (int q = 0; q < kPerLane; ++q) {
      const int i = c * kWarpChunk + q * 32 + lane;
      const double x = i < V ? double(p[i]) : 0.0;
      const double ci = off + warp_inclusive_scan(x, lane);
      const unsigned hit = __ballot_sync(kFullMask, x > 0.0 && thr < ci);
      if (hit) return c * kWarpChunk + q * 32 + __ffs(hit) - 1;
      off = __shfl_sync(kFullMask, ci, 31);
    }
  }
  return -1;
}

// Warp 0: the last j with p[j] > 0; -1 if the row has none.
__device__ int last_positive(const float* p, int V, int nch, int lane) {
  for (int c = nch - 1; c >= 0; --c) {
    for (int q = kPerLane - 1; q >= 0; --q) {
      const int i = c * kWarpChunk + q * 32 + lane;
      const unsigned hit = __ballot_sync(kFullMask, i < V && p[i] > 0.f);
      if (hit) return c * kWarpChunk + q * 32 + 31 - __clz(hit);
    }
  }
  return -1;
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(SampleArgs a) {
  extern __shared__ double chunk[];  // [nch]: per-chunk sums, then exclusive prefix sums
  const int64_t row = blockIdx.x;
  const int V = a.vocab, nch = ceil_div(V, kWarpChunk), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* p = a.probs + row * V;
  for (int c = warp; c < nch; c += kSampleWarps) {  // one streaming read: 16 independent loads per lane
    double s = 0.0;
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) {
      const int i = c * kWarpChunk + q * 32 + lane;
      s += i < V ? double(__ldcs(p + i)) : 0.0;
    }
    s = warp_sum(s);
    if (lane == 0) chunk[c] = s;
  }
  __syncthreads();
  if (warp != 0) return;
  const double total = chunk_prefix(chunk, nch, lane);
  const double thr = a.uniforms[row] * total;
  int start = nch;  // first chunk whose inclusive end exceeds thr (the chunk L2 re-read starts there)
  for (int c0 = 0; c0 < nch && start == nch; c0 += 32) {
    const int c = c0 + lane;
    const unsigned hit = __ballot_sync(kFullMask, c < nch && thr < (c + 1 < nch ? chunk[c + 1] : total));
    if (hit) start = c0 + __ffs(hit) - 1;
  }
  int j = scan_for_draw(p, V, chunk, nch, start, thr, lane);
  if (j < 0) j = last_positive(p, V, nch, lane);  // rounding pushed thr past the last boundary
  if (lane == 0) a.sampled[row] = j;
}

}  // namespace

cudaError_t tree_accept_greedy_launch(const AcceptGreedyArgs& a, cudaStream_t stream) {
  if (a.batch == 0) return cudaSuccess;
  if (a.nodes < 1 || a.width < 1) return cudaErrorInvalidValue;
  const size_t smem = sizeof(int) * 4 * size_t(a.nodes);
  KDB_CUDA_TRY(allow_dynamic_smem(greedy_kernel, smem));
  greedy_kernel<<<a.batch, kWalkThreads, smem, stream>>>(a);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

cudaError_t tree_accept_sample_launch(const SampleArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.vocab < 1) return cudaErrorInvalidValue;
  const size_t smem = sizeof(double) * ceil_div(a.vocab, kWarpChunk);
  KDB_CUDA_TRY(allow_dynamic_smem(sample_kernel, smem));
  sample_kernel<<<unsigned(a.rows), kSampleThreads, smem, stream>>>(a);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

}  // namespace kdb
