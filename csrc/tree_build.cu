// tree_build kernels: (1) the vocabulary pass, one block per (request, depth) row: one streaming read of
// the logits computes the log-sum-exp and keeps top-K candidates in shared memory, pruned by radix
// selection on 64-bit (value, ~id) keys; (2) the best-first builder, one block per request.
// Design and napkin math: plans/0004-kernels.md "## tree_build".
#include <cuda_bf16.h>

#include <cmath>

#include "common.h"
#include "tree_build.h"

namespace kdb {
namespace {

// ------------------------------------------------------------------------------ vocabulary pass

constexpr int kThreads = 256;
constexpr int kPer = 16;                    // logits per thread per chunk
constexpr int kChunk = kThreads * kPer;     // 4096 logits per block step
constexpr int kCap = 6144;                  // candidate keys in shared memory (48 KB)
constexpr int kCompactAt = kCap - kChunk;   // prune when more than this (>= 2 * kTreeBuildMaxK) are held
constexpr int kRadixBits = 10;
constexpr int kBins = 1 << kRadixBits;
constexpr float kLog2e = 1.4426950408889634f;

// Candidates are 64-bit keys: order key of the fp32 logit in the high word, ~token id in the low word.
// Keys are distinct and "larger key" is exactly the reference order (logit desc, then smaller id).
__device__ __forceinline__ uint64_t make_key(float x, uint32_t id) {
  return (uint64_t(float_order_key(x)) << 32) | uint64_t(~id);
}

struct TopkSmem {
  uint32_t hist[kBins];
  int count;               // candidates held
  int new_count;
  float thr_val;           // logit value of the k-th largest key after the last prune: x >= thr_val is admitted
  int sel_digit, sel_above, sel_bin;
  float red_m[kThreads / 32], red_s[kThreads / 32];
};

// Warp 0: the digit (scanning bins from the top) whose bin holds the krem-th largest matching key.
__device__ void find_digit(TopkSmem& sm, int krem, int nbins) {
  const int lane = threadIdx.x;
  const int per = nbins >= 32 ? nbins / 32 : 1;
  const int top = nbins - lane * per;  // this lane owns bins [top - per, top), highest first
  int sum = 0;
  for (int i = 1; i <= per && top - i >= 0; ++i) sum += sm.hist[top - i];
  const int incl = warp_inclusive_scan(sum, lane);
  const unsigned hit = __ballot_sync(kFullMask, incl >= krem);
  if (lane != __ffs(hit) - 1) return;
  int above = incl - sum;
  for (int i = 1; i <= per; ++i) {
    const int c = sm.hist[top - i];
    if (above + c >= krem) {
      sm.sel_digit = top - i, sm.sel_above = above, sm.sel_bin = c;
      return;
    }
    above += c;
  }
}

// Returns T such that exactly k of the n (distinct) keys are >= T. 1 <= k <= n. Block-wide.
__device__ uint64_t radix_select_ge(const uint64_t* keys, int n, int k, TopkSmem& sm) {
  uint64_t prefix = 0, mask = 0;
  int krem = k;
  for (int hi = 64; hi > 0; hi -= kRadixBits) {
    const int shift = hi > kRadixBits ? hi - kRadixBits : 0;
    const uint32_t dmask = (1u << (hi - shift)) - 1u;
    for (int i = threadIdx.x; i < kBins; i += kThreads) sm.hist[i] = 0;
    __syncthreads();
    // Lanes with equal bins add once (__match_any_sync): logits crowd a few bins (bf16 leaves 16 key bits
    // constant), and same-address shared atomics serialize.
    for (int base = 0; base < n; base += kThreads) {
      const int i = base + int(threadIdx.x);
      const uint64_t key = i < n ? keys[i] : 0;
      const int bin = i < n && (key & mask) == prefix ? int((key >> shift) & dmask) : -1;
      const unsigned peers = __match_any_sync(kFullMask, bin);
      if (bin >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sm.hist[bin], unsigned(__popc(peers)));
    }
    __syncthreads();
    if (threadIdx.x < 32) find_digit(sm, krem, int(dmask) + 1);
    __syncthreads();
    prefix |= uint64_t(sm.sel_digit) << shift;
    mask |= uint64_t(dmask) << shift;
    krem -= sm.sel_above;
    if (sm.sel_bin == krem) break;  // the whole bin is taken: keys >= prefix (low bits 0) are exactly k
  }
  return prefix;
}

// Keep exactly the k largest of the sm.count candidates (moved to keys[0, k)); raise the threshold.
// In-place compaction in rounds: a round reads its slice into registers, syncs, then writes survivors
// below (survivors so far <= end of this round), so nothing unread is overwritten.
__device__ void prune_to_k(uint64_t* keys, int k, TopkSmem& sm) {
  const int n = sm.count;
  const uint64_t t = radix_select_ge(keys, n, k, sm);
  if (threadIdx.x == 0) sm.new_count = 0;
  __syncthreads();
  for (int base = 0; base < n; base += 4 * kThreads) {
    uint64_t v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = base + q * kThreads + threadIdx.x;
      v[q] = i < n ? keys[i] : 0;
    }
    __syncthreads();
    unsigned keep = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) keep |= (base + q * kThreads + int(threadIdx.x) < n && v[q] >= t ? 1u : 0u) << q;
    int slot = warp_append_base(__popc(keep), &sm.new_count);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if ((keep >> q) & 1u) keys[slot++] = v[q];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float tv = float_from_order_key(uint32_t(t >> 32));
    sm.count = k, sm.thr_val = isnan(tv) ? -INFINITY : tv;
  }
  __syncthreads();
}

// Logit loads: VW elements per 16-byte vector (1 = scalar, guarded). Element j of a thread's chunk is
// logit (j / VW) * (kThreads * VW) + tid * VW + j % VW of the chunk: every load is coalesced.
template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T, int VW>
__device__ __forceinline__ int chunk_index(int c, int j) {
  return c * kChunk + (j / VW) * (kThreads * VW) + int(threadIdx.x) * VW + j % VW;
}

template <typename T, int VW>
struct Raw {
  uint4 v[kPer / VW];
  __device__ __forceinline__ void load(const T* row, int c) {
#pragma unroll
    for (int q = 0; q < kPer / VW; ++q)
      v[q] = __ldcs(reinterpret_cast<const uint4*>(row + chunk_index<T, VW>(c, q * VW)));
  }
  __device__ __forceinline__ void to_float(float (&x)[kPer]) const {
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[j] = to_f32(reinterpret_cast<const T*>(&v[j / VW])[j % VW]);
  }
};

// Scalar loads of chunk c; logits at or beyond V read as -inf and are flagged invalid.
template <typename T>
__device__ __forceinline__ void load_scalar(const T* row, int c, int V, float (&x)[kPer], unsigned& valid) {
  valid = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = chunk_index<T, 1>(c, j);
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

// Append this thread's logits x >= thr_val (the float form of the threshold key) to the shared candidate
// list. Logits equal to thr_val whose key is below the threshold are admitted too: harmless (the prune keeps
// the K largest of whatever is held; capacity is bounded per chunk) and it saves the 64-bit compares. The
// common case costs one compare of the chunk max and one vote; a warp that admits takes one shared atomic.
template <typename T, int VW>
__device__ __forceinline__ void admit(uint64_t* keys, TopkSmem& sm, const float (&x)[kPer], float chunk_max,
                                      unsigned valid, int c, float thr_val) {
  if (!__any_sync(kFullMask, chunk_max >= thr_val)) return;
  unsigned pass = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) pass |= (x[j] >= thr_val ? 1u : 0u) << j;
  pass &= valid;
  int slot = warp_append_base(__popc(pass), &sm.count);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if ((pass >> j) & 1u) {
      const float xj = x[j] == 0.f ? 0.f : x[j];  // -0 and +0 are one logit value: one key
      keys[slot++] = make_key(xj, uint32_t(chunk_index<T, VW>(c, j)));
    }
  }
}

__device__ void bitonic_sort_desc(uint64_t* keys, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < p / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const uint64_t a = keys[i], b = keys[j];
        if ((a < b) == ((i & size) == 0)) keys[i] = b, keys[j] = a;
      }
      __syncthreads();
    }
  }
}

// Block-wide lse from the per-thread states (natural log).
__device__ float block_lse(LseState st, TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float m = st.m, s = st.s;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(kFullMask, m, o), __shfl_xor_sync(kFullMask, s, o));
  if (lane == 0) sm.red_m[warp] = m, sm.red_s[warp] = s;
  __syncthreads();
  m = sm.red_m[0], s = sm.red_s[0];
  for (int w = 1; w < kThreads / 32; ++w) lse_merge(m, s, sm.red_m[w], sm.red_s[w]);
  return m + logf(s);
}

template <typename T, int VW>
__global__ void __launch_bounds__(kThreads, 4) topk_kernel(TopkArgs a) {
  extern __shared__ __align__(16) unsigned char topk_smem_raw[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(topk_smem_raw);  // [kCap]
  __shared__ TopkSmem sm;
  const int64_t r = blockIdx.x;
  const int V = a.vocab, k = a.k;
  const T* row = static_cast<const T*>(a.logits) + r * V;
  if (threadIdx.x == 0) sm.count = 0, sm.thr_val = -INFINITY;
  __syncthreads();

  LseState st;
  float thr_val = -INFINITY;
  const int nfull = VW > 1 ? V / kChunk : 0;  // vector chunks; the rest goes through scalar loads
  // bf16 chunks are 32 B per thread: prefetch one ahead to keep ~64 B per thread in flight (fp32 has it
  // without, and the extra registers would spill).
  constexpr bool kPrefetch = sizeof(T) == 2;
  Raw<T, VW> cur, nxt;
  if (kPrefetch && nfull > 0) cur.load(row, 0);
  for (int c = 0; c < ceil_div(V, kChunk); ++c) {
    float x[kPer];
    unsigned valid = (1u << kPer) - 1u;
    if (c < nfull) {
      if constexpr (kPrefetch) {
        if (c + 1 < nfull) nxt.load(row, c + 1);  // next chunk in flight while this one is processed
        cur.to_float(x);
        cur = nxt;
      } else {
        cur.load(row, c);
        cur.to_float(x);
      }
      const float mc = st.add(x);
      admit<T, VW>(keys, sm, x, mc, valid, c, thr_val);
    } else {
      load_scalar(row, c, V, x, valid);
      const float mc = st.add(x);
      admit<T, 1>(keys, sm, x, mc, valid, c, thr_val);
    }
    __syncthreads();
    const int held = sm.count;
    __syncthreads();  // every thread has read `held` before the next chunk appends
    if (held > kCompactAt) {
      prune_to_k(keys, k, sm);
      thr_val = sm.thr_val;
    }
  }
  __syncthreads();
  if (sm.count > k) prune_to_k(keys, k, sm);
  int p = 1;
  while (p < k) p <<= 1;
  for (int i = k + threadIdx.x; i < p; i += kThreads) keys[i] = 0;  // below every real key
  __syncthreads();
  bitonic_sort_desc(keys, p);
  const float lse = block_lse(st, sm);
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const uint64_t key = keys[j];
    a.top_lp[r * k + j] = float_from_order_key(uint32_t(key >> 32)) - lse;
    a.top_tok[r * k + j] = int64_t(~uint32_t(key));
  }
  if (a.lse != nullptr && threadIdx.x == 0) a.lse[r] = lse;
}

template <typename T, int VW>
cudaError_t launch_topk(const TopkArgs& a, cudaStream_t stream) {
  const size_t smem = kCap * sizeof(uint64_t);
  KDB_CUDA_TRY(cudaFuncSetAttribute(topk_kernel<T, VW>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  topk_kernel<T, VW><<<unsigned(a.rows), kThreads, smem, stream>>>(a);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

// ------------------------------------------------------------------------------ best-first builder

constexpr int kBuildThreads = 256;
constexpr int kHeapPad = 8;  // heap arrays start 3 slots in (aligned children) and may be read 4 past size

// Heap entry payload: prev (12 bits: the previous sibling when rank > 0, else the parent), rank (11 bits),
// depth (8 bits). Entry (prev, rank, depth) stands for the rank tuple of its parent plus (rank,).
__host__ __device__ __forceinline__ uint32_t pack_entry(int prev, int rank, int depth) {
  return uint32_t(prev) | (uint32_t(rank) << 12) | (uint32_t(depth) << 23);
}
__host__ __device__ __forceinline__ int entry_prev(uint32_t e) { return int(e & 0xfffu); }
__host__ __device__ __forceinline__ int entry_rank(uint32_t e) { return int((e >> 12) & 0x7ffu); }
__host__ __device__ __forceinline__ int entry_depth(uint32_t e) { return int(e >> 23); }

// Paper Algorithm 1 for one request, run by one thread over shared-memory tables. Heap order: score
// descending, exact ties by the lexicographically smaller rank tuple (the reference's heapq key).
struct BestFirst {
  double* hs;          // heap scores; children of slot h are 4h+1..4h+4
  uint32_t* hp;        // heap payloads
  int* parent;         // node tables [N]: parent, rank, depth, score, first child, next sibling
  int* rank;
  int* depth;
  double* score;
  int* first_child;
  int* next_sibling;
  const float* lp;     // [L, kb] this request's top log-probs, row-major
  int L, kb, size;

  __host__ __device__ int entry_parent(uint32_t e) const {
    return entry_rank(e) > 0 ? parent[entry_prev(e)] : entry_prev(e);
  }

  // Lexicographic rank-tuple order by walking both entries up to their common ancestor: O(L), ties only.
  __host__ __device__ bool lex_less(uint32_t a, uint32_t b) const {
    int da = entry_depth(a), ra = entry_rank(a), xa = entry_parent(a);
    int db = entry_depth(b), rb = entry_rank(b), xb = entry_parent(b);
    const int oa = da, ob = db;
    for (; da > db; --da) ra = rank[xa], xa = parent[xa];  // (xa, ra): child of xa with rank ra
    for (; db > da; --db) rb = rank[xb], xb = parent[xb];
    if (xa == xb && ra == rb) return oa < ob;  // a prefix first (unreachable between heap entries)
    while (xa != xb) ra = rank[xa], xa = parent[xa], rb = rank[xb], xb = parent[xb];
    return ra < rb;
  }

  __host__ __device__ bool before(double sa, uint32_t pa, double sb, uint32_t pb) const {
    return sa != sb ? sa > sb : lex_less(pa, pb);
  }

  __host__ __device__ void sift_down(double xs, uint32_t xp) {
    int pos = 0;
    for (int c = 1; c < size; c = 4 * pos + 1) {
      int best = c;
      double bs = hs[c];
      uint32_t bp = hp[c];
      for (int j = 1; j < 4; ++j) {
        const double s2 = hs[c + j];
        const uint32_t p2 = hp[c + j];
        if (c + j < size && before(s2, p2, bs, bp)) best = c + j, bs = s2, bp = p2;
      }
      if (!before(bs, bp, xs, xp)) break;
      hs[pos] = bs, hp[pos] = bp, pos = best;
    }
    hs[pos] = xs, hp[pos] = xp;
  }

  __host__ __device__ void push(double xs, uint32_t xp) {
    int pos = size++;
    while (pos > 0) {
      const int up = (pos - 1) >> 2;
      if (!before(xs, xp, hs[up], hp[up])) break;
      hs[pos] = hs[up], hp[pos] = hp[up], pos = up;
    }
    hs[pos] = xs, hp[pos] = xp;
  }

  // Pops up to `budget` nodes (first_child / next_sibling must be -1 on entry); returns n incl. the root.
  __host__ __device__ int run(int budget) {
    parent[0] = -1, rank[0] = -1, depth[0] = 0, score[0] = 0.0;
    size = 0;
    if (budget > 0 && L > 0 && kb > 0 && lp[0] > -INFINITY) push(double(lp[0]), pack_entry(0, 0, 1));
    int n = 1;
    while (size > 0 && n - 1 < budget) {
      const double s = hs[0];
      const uint32_t e = hp[0];
      const int i = n++, r = entry_rank(e), d = entry_depth(e), prev = entry_prev(e);
      const int par = r > 0 ? parent[prev] : prev;
      parent[i] = par, rank[i] = r, depth[i] = d, score[i] = s;
      if (r > 0) next_sibling[prev] = i;
      else first_child[par] = i;
      const float* row = lp + (d - 1) * kb;                 // this node's depth
      const bool sib = r + 1 < kb && row[r + 1] > -INFINITY;
      const bool child = d < L && lp[d * kb] > -INFINITY;  // zero-probability entries are never pushed
      // float64 exactly as the reference: sibling s - lp[r] + lp[r+1] (left to right), child s + lp[d, 0]
      const double s_sib = sib ? s - double(row[r]) + double(row[r + 1]) : 0.0;
      const double s_child = child ? s + double(lp[d * kb]) : 0.0;
      if (sib) sift_down(s_sib, pack_entry(i, r + 1, d));             // replaces the popped top
      else if (child) sift_down(s_child, pack_entry(i, 0, d + 1));
      else if (--size > 0) sift_down(hs[size], hp[size]);
      if (sib && child) push(s_child, pack_entry(i, 0, d + 1));
    }
    return n;
  }
};

// Shared-memory layout of the builder (byte offsets); doubles first so every array stays aligned.
struct BuildLayout {
  size_t heap_s, score, lp, heap_p, ints, bytes;
  __host__ __device__ BuildLayout(int L, int K, int N) {
    heap_s = 0;
    score = heap_s + sizeof(double) * (N + kHeapPad);
    lp = score + sizeof(double) * N;
    heap_p = lp + sizeof(float) * size_t(L) * K;
    ints = heap_p + sizeof(uint32_t) * (N + kHeapPad);
    bytes = ints + sizeof(int) * 5 * N;  // parent, rank, depth, first_child, next_sibling
  }
};

// Row i's ancestor-or-self bits, W words; walking parents gives indices in decreasing order.
__device__ void write_anc_row(uint64_t* out, int i, int n, int W, const int* parent) {
  int j = i;
  for (int w = W - 1; w >= 0; --w) {
    uint64_t word = 0;
    while (j >= 0 && (j >> 6) == w) {
      word |= 1ull << (j & 63);
      j = j == 0 ? -1 : (j < n ? parent[j] : 0);  // padding rows hang off the root
    }
    out[w] = word;
  }
}

__global__ void __launch_bounds__(kBuildThreads) build_kernel(TreeBuildArgs a) {
  extern __shared__ __align__(16) unsigned char build_smem_raw[];
  __shared__ int n_shared;
  const int b = blockIdx.x, N = a.nodes, L = a.depth, K = a.k, W = a.words;
  const int budget = min(max(a.budgets[b], 0), N - 1);
  const int kb = min(budget, K);  // ranks >= budget can never be popped (Lemma 1)
  const BuildLayout lay(L, K, N);
  double* hs = reinterpret_cast<double*>(build_smem_raw + lay.heap_s);
  double* score = reinterpret_cast<double*>(build_smem_raw + lay.score);
  float* lp = reinterpret_cast<float*>(build_smem_raw + lay.lp);
  uint32_t* hp = reinterpret_cast<uint32_t*>(build_smem_raw + lay.heap_p);
  int* ints = reinterpret_cast<int*>(build_smem_raw + lay.ints);
  int *parent = ints, *rank = ints + N, *depth = ints + 2 * N, *fc = ints + 3 * N, *ns = ints + 4 * N;
  for (int i = threadIdx.x; i < N; i += kBuildThreads) fc[i] = -1, ns[i] = -1;
  for (int i = threadIdx.x; i < L * kb; i += kBuildThreads)
    lp[i] = a.top_lp[(int64_t(b) * L + i / kb) * K + i % kb];
  __syncthreads();
  if (threadIdx.x == 0) {
    BestFirst bf{hs + 3, hp + 3, parent, rank, depth, score, fc, ns, lp, L, kb, 0};
    n_shared = bf.run(budget);
  }
  __syncthreads();
  const int n = n_shared;
  const int64_t root = a.root_tokens[b], past = a.past_lens[b];
  for (int i = threadIdx.x; i < N; i += kBuildThreads) {
    const int64_t o = int64_t(b) * N + i;
    const bool real = i > 0 && i < n;
    const int d = i == 0 ? 0 : (real ? depth[i] : 1);
    a.tokens[o] = real ? a.top_tok[(int64_t(b) * L + d - 1) * K + rank[i]] : root;
    a.parents[o] = i == 0 ? -1 : (real ? parent[i] : 0);
    a.depths[o] = d;
    a.positions[o] = past + d;
    a.scores[o] = i == 0 ? 0.0 : (real ? score[i] : -INFINITY);
    a.first_child[o] = i < n ? fc[i] : -1;
    a.next_sibling[o] = i < n ? ns[i] : -1;
    write_anc_row(a.anc + o * W, i, n, W, parent);
  }
  if (threadIdx.x == 0) a.n_nodes[b] = n;
}

}  // namespace

size_t tree_build_heap_smem_bytes(int depth, int k, int nodes) { return BuildLayout(depth, k, nodes).bytes; }

cudaError_t tree_build_heap_launch(const TreeBuildArgs& a, cudaStream_t stream) {
  if (a.batch == 0) return cudaSuccess;
  if (a.nodes < 1 || a.nodes > kTreeBuildMaxNodes || a.depth > kTreeBuildMaxDepth || a.k > kTreeBuildMaxK ||
      a.words != ceil_div(a.nodes, 64))
    return cudaErrorInvalidValue;
  const size_t smem = tree_build_heap_smem_bytes(a.depth, a.k, a.nodes);
  KDB_CUDA_TRY(allow_dynamic_smem(build_kernel, smem));
  build_kernel<<<a.batch, kBuildThreads, smem, stream>>>(a);
  KDB_LAUNCH_CHECK();
  return cudaSuccess;
}

cudaError_t tree_build_topk_launch(const TopkArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.k < 1 || a.k > kTreeBuildMaxK || a.k > a.vocab) return cudaErrorInvalidValue;
  const size_t esize = a.dtype == LogitDtype::kF32 ? 4 : 2;
  // 16-byte vectors need every row start aligned: V * esize a multiple of 16 and an aligned base.
  const bool vec = (size_t(a.vocab) * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0;
  if (a.dtype == LogitDtype::kF32)
    return vec ? launch_topk<float, 4>(a, stream) : launch_topk<float, 1>(a, stream);
  return vec ? launch_topk<__nv_bfloat16, 8>(a, stream) : launch_topk<__nv_bfloat16, 1>(a, stream);
}

}  // namespace kdb
