// The per-chunk streaming of the tree_build vocabulary pass (included by tree_build_vocab.h): logit loads, the
// running log-sum-exp, the admission variants, the block's Stream (admission, prunes, the threshold) and the chunk
// loop; the block's (m, s) merge and row write. plans/0004 "tree_build".
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "common.h"
#include "tree_build.h"
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
// needs kPer / 2 temporaries and spilled at the 64-register cap in s20). kTree: the tree on j's four bits (15 selects
// on 4 predicates instead of 15 compares and 15 selects: s23 call H put ~9M of the fixed stream's 21.7M admission
// instructions at B 32 K 1024 in the chain; with nvcc 13.0 the tree adds no spill to the fixed kernel). Not yet timed:
// the bench's fixed/pick_tree row.
template <bool kTree = false>
__device__ __forceinline__ float pick(const float (&x)[kPer], int j) {
  if constexpr (kTree) {
    float a[kPer / 2];
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) a[i] = (j & 1) ? x[2 * i + 1] : x[2 * i];
#pragma unroll
    for (int i = 0; i < kPer / 4; ++i) a[i] = (j & 2) ? a[2 * i + 1] : a[2 * i];
#pragma unroll
    for (int i = 0; i < kPer / 8; ++i) a[i] = (j & 4) ? a[2 * i + 1] : a[2 * i];
    return (j & 8) ? a[1] : a[0];
  } else {
    float v = x[0];
#pragma unroll
    for (int i = 1; i < kPer; ++i) v = j == i ? x[i] : v;
    return v;
  }
}

// Bit j set: x[j] is valid and >= thr.
__device__ __forceinline__ unsigned pass_mask(const float (&x)[kPer], unsigned valid, float thr) {
  unsigned pass = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) pass |= (x[j] >= thr ? 1u : 0u) << j;
  return pass & valid;
}

// The keys of x[j] for the set bits j of pass into keys[slot, slot + popc(pass)), j ascending.
template <int VW, bool kTree = false>
__device__ __forceinline__ void store_set_bits(uint64_t* keys, int slot, unsigned pass, const float (&x)[kPer], int c) {
  for (; pass != 0; pass &= pass - 1) {
    const int j = __ffs(pass) - 1;
    keys[slot++] = make_key(pick<kTree>(x, j), uint32_t(chunk_index<VW>(c, j)));
  }
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
      store_set_bits<VW>(keys, atomicAdd(&sm.count, n), pass, x, c);
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
  bool first = true;
  float thr = -INFINITY;  // admit x >= thr: the first bound, then thr_val (or the float above it) of a prune
  int held = 0;           // sm.count as of the last check
  LseState st;

  // One chunk: LSE, admission, then one barrier; only a chunk that appended reads the count (and syncs again).
  template <int VW>
  __device__ __forceinline__ void consume(const float (&x)[kPer], unsigned valid, int c) {
    const float mc = st.add(x);
    if (first) {
      first = false;
      if (k <= kThreads) thr = first_bound(mc, k, sm);
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

}  // namespace vocab
}  // namespace kdb
