// Device code of the tree_build vocabulary pass (included by tree_build.cu only): one streaming read of the
// logits per (row, split) block computes the log-sum-exp and keeps top-K candidates in shared memory, pruned
// by radix selection on 64-bit (value, ~id) keys (the chunk loop and admission: tree_build_stream.h), or, from the
// sampled estimate, admitted above a fixed threshold; the block's end (tree_build_end.h) sorts them; split rows are
// merged by merge_kernel. plans/0004 "tree_build".
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "common.h"
#include "tree_build.h"
#include "tree_build_merge.h"
#include "tree_build_select.h"
#include "tree_build_stream.h"
#include "tree_build_end.h"

namespace kdb {
namespace vocab {

// kFix, blocks of >= kSampleMinChunks vector chunks: an admission threshold from kThreads * kPer = 4096 sampled logits
// (sample_estimate), the m-th largest sample's value word as bisect_estimate finds it, m by the z rule (sample_m).
// Not a bound: the kernel streams the block again from -inf when fewer than k or more than kCap logits were >= it.
constexpr int kSampleMinChunks = 8;

// The z rule: the smallest m with m f - k >= z sqrt(m) f, f = logits per sample (the block's chunks): about m f
// logits are >= the m-th largest sample, with a spread of about sqrt(m) f, so fewer than k are >= it z = 4 spreads
// below the mean (a second stream in about 3e-5 of the blocks).
__device__ __forceinline__ int sample_m(int k, int chunks) {
  constexpr double z = 4.0;
  const double f = chunks, s = (z * f + sqrt(z * z * f * f + 4.0 * f * k)) / (2.0 * f);
  return min(kChunk, max(8, int(ceil(s * s))));
}

// The largest 16-bit p with at least m of the samples' order keys >= p << 16, by 16 steps of a block count (one
// barrier each, the counts double-buffered in sm.hist), returned as the float whose order key is p << 16: at least
// m samples are >= it, and it is at most the m-th largest sample.
__device__ float bisect_estimate(const float (&x)[kPer], int m, TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t h[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) h[j] = float_order_key(x[j]) >> 16;
  uint32_t lo = 0, hi = 0x10000u;  // count(>= lo << 16) >= m (all 4096 at 0), count(>= hi << 16) < m
#pragma unroll 1
  for (int step = 0; step < 16; ++step) {
    const uint32_t mid = (lo + hi) >> 1;
    int c = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) c += h[j] >= mid ? 1 : 0;
    c = __reduce_add_sync(kFullMask, c);
    uint32_t* red = sm.hist + (step & 1) * kWarps;
    if (lane == 0) red[warp] = uint32_t(c);
    __syncthreads();
    uint32_t tot = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) tot += red[w];
    if (tot >= uint32_t(m)) lo = mid;
    else hi = mid;
  }
  return float_from_order_key(lo << 16);
}

// The sample: kThreads * kPer logits in segments of kSampleSegVecs vectors (128 B) spread evenly over the block's
// vector chunks [c0, cv), sample vector v at segment v / kSampleSegVecs, offset v % kSampleSegVecs (thread t loads
// v = t + q * kThreads). Whole DRAM bursts: one 16-byte vector each (s22, kScatterSample: vector v at v * stride) cost
// ~6-10 us more a wave (s23 calls C, D); 512-byte segments were as fast, but on rows rising with the id they put more
// than kCap logits above the estimate (a second stream, 11x slower, s23 call B). Returns -inf for an estimate of -inf
// or NaN. All threads.
constexpr int kSampleSegVecs = 8;
template <typename T, int VW, bool kScatter = false>
__device__ __forceinline__ float sample_estimate(const T* row, int c0, int cv, int k, TopkSmem& sm) {
  constexpr int kSampleVecs = kThreads * (kPer / VW), kSeg = kScatter ? 1 : kSampleSegVecs;
  const int64_t stride = int64_t(cv - c0) * (kChunk / VW) / (kSampleVecs / kSeg);  // >= kSeg: >= 8 chunks a block
  Raw<T, VW> r;
#pragma unroll
  for (int q = 0; q < kPer / VW; ++q) {
    const unsigned v = q * kThreads + threadIdx.x;
    r.v[q] = __ldg(reinterpret_cast<const uint4*>(row) + int64_t(c0) * (kChunk / VW) + (v / kSeg) * stride + v % kSeg);
  }
  float x[kPer];
  r.to_float(x);
  const float est = bisect_estimate(x, sample_m(k, cv - c0), sm);
  __syncthreads();  // sm.hist is scratch: the stream's prunes use it
  return isnan(est) ? -INFINITY : est;
}

// The block's chunks streamed again from -inf (after an estimate above the k-th): outlined, so the rare second
// stream does not cost the first one registers (inlined twice, the chunk buffers went to local memory).
template <typename T, int VW, int kAdmit, int kMarkMin>
__device__ __noinline__ LseState stream_exact(uint64_t* keys, TopkSmem& sm, int k, const T* row, int V, int c0,
                                              int cv, int c1) {
  if (threadIdx.x == 0) sm.count = 0;
  __syncthreads();
  Stream<kAdmit, kMarkMin> s{keys, sm, k};
  stream_chunks<T, VW>(s, row, V, c0, cv, c1);
  return s.st;
}

// kFix: the block streams once with the sampled estimate as a fixed admission threshold: no prunes, so no barrier
// in the stream (warps run apart), and a lane stores its few keys >= thr by its set bits (the z rule holds about
// k + 4 spreads of keys: ~one a holding lane). A lane whose keys would pass kCap stores none; the count still grows,
// so after the stream count > kCap (too low an estimate) or count < k (too high) means the block streams again.
template <bool kTree = false>
struct FixedStream {
  uint64_t* keys;
  TopkSmem& sm;
  float thr;
  LseState st;
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned valid, int c) {
    if (!(st.add(x) >= thr)) return;
    unsigned pass = pass_mask(x, valid, thr);
    const int n = __popc(pass);
    const int slot = atomicAdd(&sm.count, n);
    if (slot + n <= kCap) store_set_bits<VW, kTree>(keys, slot, pass, x, c);
  }
};

// The stream's log-sum-exp alone (kFixNoAdmit: the bench's bound on a stream with no barrier and no admission).
struct LseOnlyStream {
  LseState st;
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned, int) { st.add(x); }
};

// kOpt bits, the bench's A/B switches (0 is the shipped kernel): kScatterSample, s22's sample of scattered vectors;
// kBitonicSort, s22's end (the bitonic sort at every size); kPickTree, the fixed stream's stores by pick's select tree
// (not yet timed); probes (wrong outputs): kFixNoEnd returns after the fixed stream, before the block's end,
// kFixNoAdmit streams the log-sum-exp alone, kNoSort leaves the end's keys unsorted.
enum Opt : int { kFixNoEnd = 1, kFixNoAdmit = 2, kNoSort = 4, kScatterSample = 8, kBitonicSort = 16, kPickTree = 32 };

// The block's stream with the fixed threshold est (-inf: none), then the exact stream where it did not hold at least
// k and at most kCap keys >= est. Returns the log-sum-exp state of the stream whose keys are held.
template <typename T, int VW, int kAdmit, int kMarkMin, int kOpt = 0>
__device__ __forceinline__ LseState fixed_stream(uint64_t* keys, TopkSmem& sm, int k, float est, const T* row, int V,
                                                 int c0, int cv, int c1) {
  LseState st;
  if (est > -INFINITY) {  // block-uniform
    if constexpr ((kOpt & kFixNoAdmit) != 0) {
      LseOnlyStream s;
      stream_chunks<T, VW>(s, row, V, c0, cv, c1);
      return s.st;
    } else {
      FixedStream<(kOpt & kPickTree) != 0> s{keys, sm, est};
      stream_chunks<T, VW>(s, row, V, c0, cv, c1);
      st = s.st;
    }
  }
  __syncthreads();
  const bool redo = !(est > -INFINITY) || sm.count < k || sm.count > kCap;
  __syncthreads();  // every thread has read the count before the exact stream zeroes it
  if (redo) st = stream_exact<T, VW, kAdmit, kMarkMin>(keys, sm, k, row, V, c0, cv, c1);
  return st;
}

// The block's end: its top min(k, held) sorted (by rank where kBitsRank holds few), then the row's outputs
// (unsplit) or its sorted keys, 0-padded to k, and (m, s) partials (split).
template <int kAdmit, int kOpt = 0>
__device__ __forceinline__ void finish_block(uint64_t* keys, LseState st, const TopkArgs& a, int64_t r, TopkSmem& sm) {
  const int k = a.k;
  if constexpr (kAdmit == kBitsRank) {
    finish_by_rank(keys, k, sm);
  } else {
    finish_sorted<(kOpt & kBitonicSort) == 0, (kOpt & kNoSort) == 0>(keys, k, sm);
  }
  const float2 ms = block_ms(st, sm);
  if (a.splits == 1) return write_row(keys, ms.x, ms.y, a, r);
  uint64_t* out = a.part_keys + int64_t(blockIdx.x) * k;
  for (int j = threadIdx.x; j < k; j += kThreads) out[j] = keys[j];
  if (threadIdx.x == 0) reinterpret_cast<float2*>(a.part_ms)[blockIdx.x] = ms;
}

// The bench's probes (kFixNoEnd, kLaneNoFinal) stop before the block's end; this store keeps the log-sum-exp (and so
// the stream) live and never happens (s >= 0).
__device__ __forceinline__ void probe_sink(const LseState& st, const TopkArgs& a, int64_t r) {
  if (st.s < 0.f && a.lse != nullptr) a.lse[r] = st.m;
}

// Block (row r, split s) streams chunks [s * cps, (s + 1) * cps) of row r. Unsplit (splits == 1): writes the
// row's outputs. Split: writes its top-min(k, held) keys, sorted and 0-padded to k, and its (m, s) partials.
// kFix: the fixed-threshold stream from the sampled estimate (on blocks of >= kSampleMinChunks vector chunks; others
// stream exactly at once); else the stream with a running threshold and prunes. kOpt: the bench's switches (Opt).
template <typename T, int VW, int kAdmit, int kMarkMin, bool kFix, int kOpt = 0>
__global__ void __launch_bounds__(kThreads, 4) topk_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char topk_smem_raw[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(topk_smem_raw);  // [kCap]
  __shared__ TopkSmem sm;
  const int64_t r = blockIdx.x / a.splits;
  const int split = int(blockIdx.x % a.splits);
  const int V = a.vocab, k = a.k;
  const T* row = static_cast<const T*>(a.logits) + r * V;
  pdl_launch_dependents();  // the merge or the builder (programmatic dependents) may launch now and wait
  if (threadIdx.x == 0) sm.count = 0, sm.thr_val = -INFINITY, sm.strict = 0;
  __syncthreads();

  const int nfull = VW > 1 ? V / kChunk : 0;  // vector chunks; the rest goes through scalar loads
  const int c0 = split * a.chunks_per_split, c1 = min(c0 + a.chunks_per_split, ceil_div(V, kChunk));
  const int cv = max(c0, min(c1, nfull));     // vector chunks [c0, cv), scalar chunks [cv, c1)
  if constexpr (kFix) {
    float est = -INFINITY;
    if (VW > 1 && cv - c0 >= kSampleMinChunks)
      est = sample_estimate<T, VW, (kOpt & kScatterSample) != 0>(row, c0, cv, k, sm);
    const LseState st = fixed_stream<T, VW, kAdmit, kMarkMin, kOpt>(keys, sm, k, est, row, V, c0, cv, c1);
    if constexpr ((kOpt & kFixNoEnd) != 0) return probe_sink(st, a, r);
    return finish_block<kAdmit, kOpt>(keys, st, a, r, sm);
  }
  Stream<kAdmit, kMarkMin> s{keys, sm, k};
  stream_chunks<T, VW>(s, row, V, c0, cv, c1);
  if constexpr (kAdmit == kLaneNoFinal) return probe_sink(s.st, a, r);
  finish_block<kAdmit, kOpt>(keys, s.st, a, r, sm);
}

// One block per row: the splits' sorted key lists (splits * k keys, 0-padded) merged by a tree of bitonic merges
// (exact: keys are distinct and carry global ids), then the row's outputs; the lse merges the splits' (m, s) in a
// fixed order. Launched as a programmatic dependent of topk_kernel: everything it reads comes after pdl_wait.
__global__ void __launch_bounds__(kThreads) merge_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char merge_smem_raw[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(merge_smem_raw);  // [kCap]
  __shared__ TopkSmem sm;
  pdl_launch_dependents();  // the builder may start its prologue
  pdl_wait();
  const int64_t r = blockIdx.x;
  // The (m, s) partials: thread t folds splits t, t + kThreads, ..., block_ms merges the threads in a fixed order
  // (a serial loop over the splits waited on one load per split: ~7 us at 20 splits under ncu, s5 call A).
  const float2* ms = reinterpret_cast<const float2*>(a.part_ms) + r * a.splits;
  LseState st;
  for (int i = threadIdx.x; i < a.splits; i += kThreads) lse_merge(st.m, st.s, ms[i].x, ms[i].y);
  merge_sorted_lists<DevBlk>(keys, kCap, a.part_keys + r * a.splits * a.k, a.splits, a.k);
  const float2 tot = block_ms(st, sm);
  write_row(keys, tot.x, tot.y, a, r);
}

}  // namespace vocab
}  // namespace kdb
