// Device code of the tree_build vocabulary pass (included by tree_build.cu only): one streaming read of the
// logits per (row, split) block computes the log-sum-exp and keeps top-K candidates in shared memory, pruned
// by radix selection on 64-bit (value, ~id) keys; split rows are merged by merge_kernel. plans/0004 "tree_build".
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "common.h"
#include "tree_build.h"
#include "tree_build_merge.h"
#include "tree_build_select.h"

namespace kdb {
namespace vocab {

// Logit loads: VW elements per 16-byte vector (1 = scalar, guarded). Element j of a thread's chunk is
// logit (j / VW) * (kThreads * VW) + tid * VW + j % VW of the chunk: every load is coalesced.
template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <int VW>
__device__ __forceinline__ int chunk_index(int c, int j) {
  return c * kChunk + (j / VW) * (kThreads * VW) + int(threadIdx.x) * VW + j % VW;
}

template <typename T, int VW>
struct Raw {
  uint4 v[kPer / VW];
  __device__ __forceinline__ void load(const T* row, int c) {
#pragma unroll
    for (int q = 0; q < kPer / VW; ++q) v[q] = __ldcs(reinterpret_cast<const uint4*>(row + chunk_index<VW>(c, q * VW)));
  }
  __device__ __forceinline__ void to_float(float (&x)[kPer]) const {
    if constexpr (sizeof(T) == 2) {  // a bf16 is the high half of its fp32: one shift or one AND per logit
      const uint32_t* w = reinterpret_cast<const uint32_t*>(v);
#pragma unroll
      for (int i = 0; i < kPer / 2; ++i) x[2 * i] = __uint_as_float(w[i] << 16), x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) x[j] = to_f32(reinterpret_cast<const T*>(&v[j / VW])[j % VW]);
    }
  }
};

// Scalar loads of chunk c; logits at or beyond V read as -inf and are flagged invalid.
template <typename T>
__device__ __forceinline__ void load_scalar(const T* row, int c, int V, float (&x)[kPer], unsigned& valid) {
  valid = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = chunk_index<1>(c, j);
    x[j] = i < V ? to_f32(row[i]) : -INFINITY;
    valid |= (i < V ? 1u : 0u) << j;
  }
}

// Per-thread streaming state: running max m and sum s of exp(x - m) over this thread's logits.
// add() returns the chunk's max, which also decides whether any of the thread's logits can be admitted.
struct LseState {
  float m = -INFINITY, s = 0.f;
  __device__ __forceinline__ float add(const float (&x)[kPer]) {
    float mc = x[0];
#pragma unroll
    for (int j = 1; j < kPer; ++j) mc = fmaxf(mc, x[j]);
    if (mc > m) s *= fast_exp2((m - mc) * kLog2e), m = mc;  // m = -inf: s is 0 and stays 0
    if (m == -INFINITY) return mc;
    const float neg_m_log2e = -m * kLog2e;   // one FFMA + one MUFU per logit
    float e[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = fast_exp2(fmaf(x[j], kLog2e, neg_m_log2e));
    s += pairwise_sum<kPer>(e);
    return mc;
  }
};

__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  s = s * fast_exp2((m - mm) * kLog2e) + s2 * fast_exp2((m2 - mm) * kLog2e);
  m = mm;
}

// Admission of this thread's logits x >= thr (valid ones) into the shared candidate list; returns how many it
// appended. A warp none of whose lanes holds a candidate (chunk max < thr) skips with one vote. Admissions are
// sparse (a few lanes of a warp), so each admitted key costs a warp-wide block of instructions; the variants
// differ in how many (reports/h200/tree_build_vocab_bench.cu times them; the launcher ships kAdmitShipped):
//   kMask:  a lane bit mask, one warp scan and one shared atomic per warp, then one guarded store per slot j
//           (round 2; 1.1-1.2x slower than kLane at B 32, call D of 2026-12-01 s4);
//   kLane:  lanes holding a candidate only (divergent), one shared atomic per lane for its count (the compiler
//           aggregates the warp's), then the stores (shipped above k 64);
//   kProbe: admits nothing (wrong outputs): the bench's bound on the streaming and log-sum-exp alone;
//   kLaneNoFinal: kLane, then the block returns before its final prune, sort and writes (wrong outputs): the bench's
//           measure of that tail (s19);
//   kLaneBits: kLane storing by a loop over the set bits of its pass mask, x[j] picked by selects (s20);
//   kBitsRank: kLaneBits, then the block's final cut and sort by rank where it holds <= kThreads keys (s20; shipped
//           for k <= 64, where lanes admit about one key and blocks end holding few).
// (A per-key atomic, a per-slot ballot, a predicated or trash-slot store per j and kLaneBits for one key only were
// slower; the figures are in plans/0004 "tree_build".)
enum Admit : int { kMask = 0, kLane = 1, kProbe = 2, kLaneNoFinal = 3, kLaneBits = 4, kBitsRank = 5 };

// x[j] for a runtime j by a chain of selects (an indexed register array would go to local memory; a select tree
// needs kPer / 2 temporaries and spilled at the 64-register cap).
__device__ __forceinline__ float pick(const float (&x)[kPer], int j) {
  float v = x[0];
#pragma unroll
  for (int i = 1; i < kPer; ++i) v = j == i ? x[i] : v;
  return v;
}

// Bit j set: x[j] is valid and >= thr.
__device__ __forceinline__ unsigned pass_mask(const float (&x)[kPer], unsigned valid, float thr) {
  unsigned pass = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) pass |= (x[j] >= thr ? 1u : 0u) << j;
  return pass & valid;
}

template <int kAdmit, int VW>
__device__ __forceinline__ int admit(uint64_t* keys, TopkSmem& sm, const float (&x)[kPer], float chunk_max,
                                     unsigned valid, int c, float thr) {
  if (kAdmit == kProbe || !__any_sync(kFullMask, chunk_max >= thr)) return 0;
  int n = 0;
  if constexpr (kAdmit == kMask) {
    const unsigned pass = pass_mask(x, valid, thr);
    append_masked<kPer>(keys, &sm.count, pass, [&](int j) { return make_key(x[j], uint32_t(chunk_index<VW>(c, j))); });
    n = __popc(pass);
  } else if (chunk_max >= thr) {  // kLane: only the lanes holding a candidate
    if constexpr (kAdmit == kLaneBits || kAdmit == kBitsRank) {
      unsigned pass = pass_mask(x, valid, thr);
      n = __popc(pass);
      int slot = atomicAdd(&sm.count, n);
      for (; pass != 0; pass &= pass - 1) {
        const int j = __ffs(pass) - 1;
        keys[slot++] = make_key(pick(x, j), uint32_t(chunk_index<VW>(c, j)));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) n += (((valid >> j) & 1u) && x[j] >= thr) ? 1 : 0;
      int slot = atomicAdd(&sm.count, n);
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (((valid >> j) & 1u) && x[j] >= thr) keys[slot++] = make_key(x[j], uint32_t(chunk_index<VW>(c, j)));
      }
    }
  }
  return n;
}

// All threads, k <= kThreads: a bound t with at least k of the chunk's logits >= t, so every top-k logit of the
// block is >= t. Each warp takes the kw-th largest of its lanes' chunk maxima (kw lanes hold a logit >= it;
// kWarps * kw >= k), t is the smallest of those. It replaces admitting the whole first chunk (4096 keys and a
// prune of them) with fewer: on N(0, 3) logits ~36 at k 16, ~112 at k 64, ~250 at k 128, ~1250 at k 256.
__device__ float first_bound(float chunk_max, int k, TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = ceil_div(k, kWarps);
  const float v = isnan(chunk_max) ? -INFINITY : chunk_max;
  int rank = 0;  // lanes before this one in (value desc, lane asc): ranks are 0..31, each once
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float u = __shfl_sync(kFullMask, v, i);
    rank += (u > v || (u == v && i < lane)) ? 1 : 0;
  }
  const unsigned who = __ballot_sync(kFullMask, rank == kw - 1);
  const float tw = __shfl_sync(kFullMask, v, __ffs(who) - 1);
  if (lane == 0) sm.red_t[warp] = tw;
  __syncthreads();
  float t = sm.red_t[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) t = fminf(t, sm.red_t[w]);
  return t;
}

// Prune when more than this many keys are held: kCompactAt (the capacity bound: held + one chunk <= kCap), or,
// with kMarkMin > 0, already at max(2k, kMarkMin): a tighter threshold sooner, so fewer warps admit later.
template <int kMarkMin>
__device__ __forceinline__ int prune_mark(int k) {
  return kMarkMin > 0 ? min(kCompactAt, max(2 * k, kMarkMin)) : kCompactAt;
}

// One block's streaming state. thr and held are the same in every thread and change only at block-uniform
// points (after a barrier), so every thread takes the same prune decisions.
template <int kAdmit, int kMarkMin>
struct Stream {
  uint64_t* keys;
  TopkSmem& sm;
  int k;
  float floor = -INFINITY;  // sample_estimate's admission floor (-inf: none)
  bool first = true;
  float thr = -INFINITY;  // admit x >= thr: max(first bound, floor), then thr_val (or the float above it) of a prune
  int held = 0;           // sm.count as of the last check
  LseState st;

  // One chunk: LSE, admission, then one barrier; only a chunk that appended reads the count (and syncs again).
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned valid, int c) {
    const float mc = st.add(x);
    if (first) {
      first = false;
      if (k <= kThreads) thr = first_bound(mc, k, sm);
      thr = fmaxf(thr, floor);
    }
    if (!__syncthreads_or(admit<kAdmit, VW>(keys, sm, x, mc, valid, c, thr))) return;
    held = sm.count;
    __syncthreads();  // every thread has read the count before the next chunk appends
    if (held > prune_mark<kMarkMin>(k)) {
      held = prune(keys, k, k / 2, sm).kept;
      // Exact prune: the k kept keys beat every later logit equal to thr_val (later ids are larger).
      thr = sm.strict ? nextafterf(sm.thr_val, INFINITY) : sm.thr_val;
    }
  }
};

// A vector chunk c from cur while chunk c + 1 (below cend) loads into nxt. Callers alternate the two buffers,
// so no register copy waits on the load in flight (a copy nxt -> cur did, and serialized every chunk on DRAM
// latency before 2026-12-01 s4).
template <typename T, int VW, class S>
__device__ __forceinline__ void vec_step(S& s, Raw<T, VW>& cur, Raw<T, VW>& nxt, const T* row, int c, int cend) {
  if (c + 1 < cend) nxt.load(row, c + 1);
  float x[kPer];
  cur.to_float(x);
  s.template consume<VW>(x, (1u << kPer) - 1u, c);
}

// Block-wide (m, s) from the per-thread states, merged in a fixed order (every block of a row alike).
__device__ float2 block_ms(LseState st, TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float m = st.m, s = st.s;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) lse_merge(m, s, __shfl_xor_sync(kFullMask, m, o), __shfl_xor_sync(kFullMask, s, o));
  if (lane == 0) sm.red_m[warp] = m, sm.red_s[warp] = s;
  __syncthreads();
  m = sm.red_m[0], s = sm.red_s[0];
  for (int w = 1; w < kWarps; ++w) lse_merge(m, s, sm.red_m[w], sm.red_s[w]);
  return make_float2(m, s);
}

// Row r's outputs from its sorted top-k keys and its (max, sum of exp): top_lp = x - lse, top_tok, lse.
__device__ __forceinline__ void write_row(const uint64_t* keys, float m, float s, const TopkArgs& a, int64_t r) {
  const float lse = m + logf(s);
  write_top(keys, a.k, lse, a.top_lp + r * a.k, a.top_tok + r * a.k);
  if (a.lse != nullptr && threadIdx.x == 0) a.lse[r] = lse;
}

// Chunks [c0, c1) of the row through s: vector chunks [c0, cv) with one chunk in flight, then scalar ones.
template <typename T, int VW, class S>
__device__ __forceinline__ void stream_chunks(S& s, const T* row, int V, int c0, int cv, int c1) {
  if constexpr (sizeof(T) == 2) {
    // bf16 chunks are 32 B per thread: one chunk ahead keeps ~64 B per thread in flight (fp32 has it without,
    // and a second buffer would spill; cp.async stages in shared memory were slower, plans/0004).
    Raw<T, VW> p, q;
    if (c0 < cv) p.load(row, c0);
    int c = c0;
    for (; c + 1 < cv; c += 2) vec_step(s, p, q, row, c, cv), vec_step(s, q, p, row, c + 1, cv);
    if (c < cv) vec_step(s, p, q, row, c, cv);
  } else {
    for (int c = c0; c < cv; ++c) {
      Raw<T, VW> p;
      float x[kPer];
      p.load(row, c);
      p.to_float(x);
      s.template consume<VW>(x, (1u << kPer) - 1u, c);
    }
  }
  for (int c = cv; c < c1; ++c) {
    float x[kPer];
    unsigned valid;
    load_scalar(row, c, V, x, valid);
    s.template consume<1>(x, valid, c);
  }
}

// kSample, blocks of >= kSampleMinChunks vector chunks: an admission floor aimed at about the block's 4k-th
// largest logit, from kThreads * kPer = 4096 logits in kSampleVecs vectors spread evenly over its vector chunks
// (sample vector v is vector c0 * kChunk / VW + v * stride of the row, stride = the block's vectors /
// kSampleVecs; thread t loads v = t + q * kThreads). m = max(8, 4 k / chunks); the radix select returns a value
// word t with at least m samples >= t (the m-th largest sample's value, or, when its bin is taken whole, that
// value with the undecided low bits zeroed: at most the m-th, at least the (m+1)-th). Not a bound: the kernel
// streams the block again from -inf when fewer than k logits were >= it. Returns -inf when that value is -inf
// (too few finite samples) or NaN. kAim (the fixed-threshold stream, kFix): m = max(8, kAim k / chunks), or with
// kAim < 0 the z rule (sample_m). kEst 1: bisect_estimate instead of the radix select. All threads.
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

template <typename T, int VW, int kAim = 4, int kEst = 0>
__device__ __forceinline__ float sample_estimate(const T* row, int c0, int cv, int k, uint64_t* keys, TopkSmem& sm) {
  constexpr int kSampleVecs = kThreads * (kPer / VW);
  const int64_t stride = int64_t(cv - c0) * (kChunk / VW) / kSampleVecs;
  Raw<T, VW> r;
#pragma unroll
  for (int q = 0; q < kPer / VW; ++q)
    r.v[q] = __ldg(reinterpret_cast<const uint4*>(row) + int64_t(c0) * (kChunk / VW) + (q * kThreads + threadIdx.x) * stride);
  float x[kPer];
  r.to_float(x);
  if constexpr (kEst == 1) {
    const float est = bisect_estimate(x, kAim < 0 ? sample_m(k, cv - c0) : max(8, kAim * k / (cv - c0)), sm);
    __syncthreads();  // sm.hist is scratch: the stream's prunes use it
    return isnan(est) ? -INFINITY : est;
  } else {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int v = (j / VW) * kThreads + int(threadIdx.x);
      keys[v * VW + j % VW] = make_key(x[j], uint32_t((int64_t(c0) * (kChunk / VW) + v * stride) * VW + j % VW));
    }
    __syncthreads();
    const int m = kAim < 0 ? sample_m(k, cv - c0) : max(8, kAim * k / (cv - c0));
    const uint64_t t = radix_select_ge(keys, kChunk, m, kChunk, sm).t;  // tie stop once the value word is decided
    __syncthreads();  // the keys are scratch: the stream appends from slot 0
    const float est = float_from_order_key(uint32_t(t >> 32));
    return isnan(est) ? -INFINITY : est;
  }
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
// in the stream (warps run apart), and a lane stores its few keys >= thr by its set bits (the estimate aims at about
// kFix k keys: ~one a holding lane). A lane whose keys would pass kCap stores none; the count still grows, so after
// the stream count > kCap (too low an estimate) or count < k (too high) means the block streams again exactly.
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
    int slot = atomicAdd(&sm.count, n);
    if (slot + n > kCap) return;
    for (; pass != 0; pass &= pass - 1) {
      const int j = __ffs(pass) - 1;
      keys[slot++] = make_key(pick(x, j), uint32_t(chunk_index<VW>(c, j)));
    }
  }
};

// The block's stream with the fixed threshold est (-inf: none), then the exact stream where it did not hold at least
// k and at most kCap keys >= est. Returns the log-sum-exp state of the stream whose keys are held.
template <typename T, int VW, int kAdmit, int kMarkMin>
__device__ __forceinline__ LseState fixed_stream(uint64_t* keys, TopkSmem& sm, int k, float est, const T* row, int V,
                                                 int c0, int cv, int c1) {
  LseState st;
  if (est > -INFINITY) {  // block-uniform
    FixedStream s{keys, sm, est};
    stream_chunks<T, VW>(s, row, V, c0, cv, c1);
    st = s.st;
  }
  __syncthreads();
  const bool redo = !(est > -INFINITY) || sm.count < k || sm.count > kCap;
  __syncthreads();  // every thread has read the count before the exact stream zeroes it
  if (redo) st = stream_exact<T, VW, kAdmit, kMarkMin>(keys, sm, k, row, V, c0, cv, c1);
  return st;
}

// Block (row r, split s) streams chunks [s * cps, (s + 1) * cps) of row r. Unsplit (splits == 1): writes the
// row's outputs. Split: writes its top-min(k, held) keys, sorted and 0-padded to k, and its (m, s) partials.
// kFix != 0 (with kSample): the fixed-threshold stream above, the estimate aimed at about kFix k keys (kFix < 0: the
// z rule); kEst: the estimate's method (0 radix select, 1 bisection).
template <typename T, int VW, int kAdmit, int kMarkMin, bool kSample, int kFix = 0, int kEst = 0>
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
  float est = -INFINITY;
  if constexpr (kSample && VW > 1) {
    if (cv - c0 >= kSampleMinChunks) est = sample_estimate<T, VW, (kFix != 0 ? kFix : 4), kEst>(row, c0, cv, k, keys, sm);
  }
  if constexpr (kFix != 0) {
    const LseState st = fixed_stream<T, VW, kAdmit, kMarkMin>(keys, sm, k, est, row, V, c0, cv, c1);
    if constexpr (kAdmit == kBitsRank) {
      finish_by_rank(keys, k, sm);
    } else {
      finish_sorted(keys, k, sm);
    }
    const float2 ms = block_ms(st, sm);
    if (a.splits == 1) return write_row(keys, ms.x, ms.y, a, r);
    uint64_t* out = a.part_keys + int64_t(blockIdx.x) * k;
    for (int j = threadIdx.x; j < k; j += kThreads) out[j] = keys[j];
    if (threadIdx.x == 0) reinterpret_cast<float2*>(a.part_ms)[blockIdx.x] = ms;
    return;
  }
  Stream<kAdmit, kMarkMin> s{keys, sm, k, est};
  stream_chunks<T, VW>(s, row, V, c0, cv, c1);
  if constexpr (kAdmit == kLaneNoFinal) {  // keep the log-sum-exp live (never true: s >= 0), then stop
    if (s.st.s < 0.f && a.lse != nullptr) a.lse[r] = s.st.m;
    return;
  }
  LseState st = s.st;
  if (est > -INFINITY) {  // block-uniform
    __syncthreads();
    const bool redo = sm.count < k;  // fewer than k logits were >= est: est was above the k-th
    __syncthreads();
    if (redo) st = stream_exact<T, VW, kAdmit, kMarkMin>(keys, sm, k, row, V, c0, cv, c1);
  }
  if constexpr (kAdmit == kBitsRank) {
    finish_by_rank(keys, k, sm);
  } else {
    finish_sorted(keys, k, sm);
  }
  const float2 ms = block_ms(st, sm);
  if (a.splits == 1) return write_row(keys, ms.x, ms.y, a, r);
  uint64_t* out = a.part_keys + int64_t(blockIdx.x) * k;
  for (int j = threadIdx.x; j < k; j += kThreads) out[j] = keys[j];
  if (threadIdx.x == 0) reinterpret_cast<float2*>(a.part_ms)[blockIdx.x] = ms;
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
