// The fixed-threshold stream with deferred admission (kFixDefer, included by tree_build_vocab.h): while streaming,
// a warp whose lanes hold a logit >= thr in a vector chunk writes one record (the chunk, the warp, the mask of those
// lanes) instead of running the divergent set-bit store loop; after the stream every thread of the block re-reads
// marked lanes' 16 logits (32 B of bf16 a lane, from L2 or DRAM) and stores their keys >= thr. The keys held are the
// same as FixedStream's (every valid logit >= thr), so the block's end and outputs are unchanged. plans/0004
// "tree_build", Session 23.
#pragma once
#include <cuda_bf16.h>

#include "common.h"
#include "tree_build_select.h"
#include "tree_build_stream.h"

namespace kdb {
namespace vocab {

// Records fill the key array from its top down: record i (x = vector chunk * kWarps + warp, y = lane mask) at
// top[-1 - i], top = keys + kCap, so the stream needs no pointer beyond keys. After it, off [nrec] (the exclusive
// prefix of the records' popcounts) lies below them, and keys [0, cap) stay free for the keys. A warp writes at most
// one record a vector chunk, so nrec <= rmax = kWarps * the block's vector chunks, and cap = kCap - 12 rmax / 8 also
// holds while the stream runs (a scalar tail chunk stores its keys then).
__device__ __forceinline__ uint2* defer_top(uint64_t* keys) { return reinterpret_cast<uint2*>(keys + kCap); }
__device__ __forceinline__ int defer_cap(int rmax) { return kCap - ceil_div(12 * rmax, 8); }
constexpr int kDeferMaxRecs = 1024;  // 12 KB of records: blocks of more than 128 vector chunks stream exactly

struct DeferRecs {
  uint2* top;  // record i at top[-1 - i]
  uint32_t* off;     // [nrec]
  int nrec;
  __device__ uint2 rec(int i) const { return top[-1 - i]; }
};

// The stream: log-sum-exp as FixedStream; a vector chunk costs one vote a warp, and lane 0 of a warp with a
// candidate lane appends the record. A scalar (tail) chunk stores its keys at once, below cap.
struct DeferStream {
  uint64_t* keys;
  TopkSmem& sm;
  float thr;
  int cap;
  LseState st;
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned valid, int c) {
    const float mc = st.add(x);
    if constexpr (VW == 1) {
      if (!(mc >= thr)) return;
      const unsigned pass = pass_mask(x, valid, thr);
      const int n = __popc(pass), slot = atomicAdd(&sm.count, n);
      if (slot + n <= cap) store_set_bits<VW>(keys, slot, pass, x, c);
    } else {
      const unsigned lanes = __ballot_sync(kFullMask, mc >= thr);
      if (lanes != 0 && (threadIdx.x & 31) == 0)
        defer_top(keys)[-1 - atomicAdd(&sm.nrec, 1)] = make_uint2(uint32_t(c) * kWarps + (threadIdx.x >> 5), lanes);
    }
  }
};

// Position of the n-th (0-based) set bit of m, n < popc(m): five halving steps.
__device__ __forceinline__ int nth_set_bit(unsigned m, int n) {
  int pos = 0;
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) {
    const int c = __popc(m & ((1u << w) - 1u));
    const bool up = n >= c;
    n -= up ? c : 0, m = up ? m >> w : m, pos += up ? w : 0;
  }
  return pos;
}

// All threads: off[] from the records' popcounts (thread t scans a contiguous slice of records); returns the
// number of marked lanes. Two barriers.
__device__ int defer_offsets(const DeferRecs& d, TopkSmem& sm) {
  const int nrec = d.nrec;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int per = ceil_div(nrec, kThreads), beg = min(nrec, t * per), end = min(nrec, beg + per);
  int s = 0;
  for (int i = beg; i < end; ++i) s += __popc(d.rec(i).y);
  const int incl = warp_inclusive_scan(s, lane);
  if (lane == 31) sm.warp_tot[warp] = incl;
  __syncthreads();
  int run = incl - s, total = 0;
  for (int w = 0; w < kWarps; ++w) run += w < warp ? sm.warp_tot[w] : 0, total += sm.warp_tot[w];
  for (int i = beg; i < end; ++i) d.off[i] = uint32_t(run), run += __popc(d.rec(i).y);
  __syncthreads();
  return total;
}

// Marked lane j (0 <= j < total) as (vector chunk, thread of the stream): the record by binary search over off.
__device__ __forceinline__ int2 marked_lane(const DeferRecs& d, int j) {
  int lo = 0, hi = d.nrec;  // off[lo] <= j < off[hi] (off[nrec] = total)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (int(d.off[mid]) <= j) lo = mid;
    else hi = mid;
  }
  const uint2 r = d.rec(lo);
  return make_int2(int(r.x / kWarps), int(r.x % kWarps) * 32 + nth_set_bit(r.y, j - int(d.off[lo])));
}

// After the stream, all threads: keys >= thr of every marked lane into keys [count, cap), kU lanes a thread in flight
// (kU 2: no spills; kU 4 spills ~70 B, the bench's defer4 rows).
template <typename T, int VW, int kU>
__device__ void readmit(uint64_t* keys, TopkSmem& sm, const T* row, float thr, int cap) {
  __syncthreads();  // every record is written
  DeferRecs d{defer_top(keys), nullptr, sm.nrec};
  d.off = reinterpret_cast<uint32_t*>(d.top - d.nrec) - d.nrec;
  const int total = defer_offsets(d, sm);
  for (int j0 = 0; j0 < total; j0 += kU * kThreads) {
    Raw<T, VW> raw[kU];
    int2 at[kU];  // (vector chunk, stream thread), x -1: none
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = j0 + u * kThreads + int(threadIdx.x);
      at[u] = j < total ? marked_lane(d, j) : make_int2(-1, 0);
      if (at[u].x >= 0) raw[u].load(row, at[u].x, at[u].y);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (at[u].x < 0) continue;
      float x[kPer];
      raw[u].to_float(x);
      const unsigned pass = pass_mask(x, (1u << kPer) - 1u, thr);
      const int n = __popc(pass), slot = atomicAdd(&sm.count, n);
      if (slot + n <= cap) store_set_bits<VW>(keys, slot, pass, x, at[u].x, at[u].y);
    }
  }
}

}  // namespace vocab
}  // namespace kdb
