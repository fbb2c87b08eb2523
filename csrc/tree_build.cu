// tree_build kernels: (1) the vocabulary pass, one block per (request, depth) row: one streaming read of
// the logits computes the log-sum-exp and keeps top-K candidates in shared memory, pruned by radix
// selection on 64-bit (value, ~id) keys; (2) the best-first builder, one block per request.
// Design and napkin math: plans/0004-kernels.md "## tree_build".
#include <algorithm>
#include <cmath>

#include "common.h"
#include "tree_build.h"
#include "tree_build_par.h"
#include "tree_build_vocab.h"

namespace kdb {
namespace {

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

// Shared-memory layout of the builder (byte offsets); doubles first so every array stays aligned. The
// parallel path's tables (par::ParTables, capacity par::cap_for(N - 1)) follow when L <= par::kMaxDepth.
struct BuildLayout {
  size_t heap_s, score, lp, heap_p, ints, par_S, par_key, par_ints, bytes;
  int cap, pow2;
  __host__ __device__ BuildLayout(int L, int K, int N) {
    heap_s = 0;
    score = heap_s + sizeof(double) * (N + kHeapPad);
    lp = score + sizeof(double) * N;
    heap_p = lp + sizeof(float) * size_t(L) * K;
    ints = heap_p + sizeof(uint32_t) * (N + kHeapPad);
    par_S = (ints + sizeof(int) * 5 * N + 15) / 16 * 16;  // after parent, rank, depth, first_child, next_sibling
    cap = L <= par::kMaxDepth ? par::cap_for(N - 1) : 0;
    for (pow2 = 1; pow2 < cap; pow2 <<= 1) {}
    par_key = par_S + sizeof(double) * cap;
    par_ints = par_key + sizeof(uint64_t) * pow2;
    bytes = cap > 0 ? par_ints + sizeof(int) * (7 * size_t(cap) + L + 2 + par::kScratch) : par_S;
  }
  __host__ __device__ par::ParTables tables(unsigned char* base, int L) const {
    int* i = reinterpret_cast<int*>(base + par_ints);
    return {reinterpret_cast<double*>(base + par_S), i, i + cap, i + 2 * cap, i + 3 * cap, i + 4 * cap,
            i + 5 * cap, i + 6 * cap, reinterpret_cast<uint64_t*>(base + par_key), i + 7 * cap, i + 7 * cap + L + 2};
  }
};

using vocab::DevBlk;
static_assert(kBuildThreads == vocab::kThreads, "the builder runs on the vocabulary pass's block policy");

// Budgets below this take the heap. 1: the parallel path first at every budget (s21 call B: at budget 16 it takes 10-13
// us a launch where the heap's ~1,200 cycles a pop took 13-15; until s21 the heap ran below 32).
constexpr int kParMinBudget = 1;

// Session 21's A/B switches of build_kernel (plans/0004 "tree_build", Session 21): each on in kOptAll.
constexpr int kOptRank = 1;     // pop order by counting where cheap (par::rank_order), else preorder and a sort
constexpr int kOptVecLoad = 2;  // the log-probs staged by 16-byte loads, all of a thread's in flight at once
constexpr int kOptTokFirst = 4;  // the emission's token gathers (up to kRowsPer a thread) in flight before any store
constexpr int kOptProbeNoAnc = 8;  // a bench probe: no ancestor masks (outputs wrong by design; never shipped)
// ancestor masks as coalesced zeros, a barrier, then each row's nonzero words, from kAncSparseMinWords words a row
// (s21 call G: 25-34 % faster builds at budget 1024 (W 17), a tie at 256 (W 5) but B 1, slower at 16-64; W 6-16 not
// measured)
constexpr int kOptAncSparse = 16;
constexpr int kAncSparseMinWords = 8;
constexpr int kOptAll = kOptRank | kOptVecLoad | kOptTokFirst | kOptAncSparse;  // the probe is never in it
constexpr int kRowsPer = (kTreeBuildMaxNodes + kBuildThreads - 1) / kBuildThreads;

// Row i's ancestor-or-self bits, W words; walking parents gives indices in decreasing order. kSparse: only the
// nonzero words (at most the row's depth + 1; the caller wrote zeros first).
template <bool kSparse>
__device__ void write_anc_row(uint64_t* out, int i, int n, int W, const int* parent) {
  int j = i;
  for (int w = W - 1; w >= 0; --w) {
    if (kSparse) {  // straight to the next ancestor's word
      if (j < 0) break;
      w = j >> 6;
    }
    uint64_t word = 0;
    while (j >= 0 && (j >> 6) == w) {
      word |= 1ull << (j & 63);
      j = j == 0 ? -1 : (j < n ? parent[j] : 0);  // padding rows hang off the root
    }
    out[w] = word;
  }
}

// The request's top log-probs [L, kb] into shared memory: kb == K rows are contiguous, so (4 | K) 16-byte loads,
// kVec of them a thread in flight before the stores; else one float a thread and iteration.
template <bool kVecLoad>
__device__ void stage_lp(float* lp, const float* top_lp, int b, int L, int K, int kb) {
  const float* src = top_lp + int64_t(b) * L * K;
  if (kVecLoad && kb == K && K % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kVec = 4;
    const int n4 = L * K / 4;
    for (int base = 0; base < n4; base += kVec * kBuildThreads) {
      float4 v[kVec];
#pragma unroll
      for (int u = 0; u < kVec; ++u) {
        const int i = base + u * kBuildThreads + int(threadIdx.x);
        if (i < n4) v[u] = reinterpret_cast<const float4*>(src)[i];
      }
#pragma unroll
      for (int u = 0; u < kVec; ++u) {
        const int i = base + u * kBuildThreads + int(threadIdx.x);
        if (i < n4) reinterpret_cast<float4*>(lp)[i] = v[u];
      }
    }
    return;
  }
  // (one load per iteration: batching them as the merge does made ptxas spill 28 B here, s5)
  for (int i = threadIdx.x; i < L * kb; i += kBuildThreads) lp[i] = src[(i / kb) * K + i % kb];
}

// The node tables into the padded outputs, a row a thread (a word a thread for the ancestor masks, coalesced, was no
// faster: s21 call B). kTokFirst: every token gather of the thread first, then the stores; !kAnc: a probe.
template <class Blk, bool kTokFirst, bool kAnc, bool kAncSparse>
__device__ void emit_rows(const TreeBuildArgs& a, int b, int n, int64_t root, int64_t past, const int* parent,
                          const int* rank, const int* depth, const double* score, const int* fc, const int* ns) {
  const int N = a.nodes, L = a.depth, K = a.k, W = a.words;
  auto token = [&](int i) {
    return i > 0 && i < n ? a.top_tok[(int64_t(b) * L + depth[i] - 1) * K + rank[i]] : root;
  };
  int64_t tok[kRowsPer];
  if (kTokFirst) {
#pragma unroll
    for (int u = 0; u < kRowsPer; ++u) {
      const int i = int(threadIdx.x) + u * kBuildThreads;
      if (i < N) tok[u] = token(i);
    }
  }
#pragma unroll
  for (int u = 0; u < kRowsPer; ++u) {
    const int i = int(threadIdx.x) + u * kBuildThreads;
    if (i >= N) break;
    const int64_t o = int64_t(b) * N + i;
    const bool real = i > 0 && i < n;
    const int d = i == 0 ? 0 : (real ? depth[i] : 1);
    a.tokens[o] = kTokFirst ? tok[u] : token(i);
    a.parents[o] = i == 0 ? -1 : (real ? parent[i] : 0);
    a.depths[o] = d;
    a.positions[o] = past + d;
    a.scores[o] = i == 0 ? 0.0 : (real ? score[i] : -INFINITY);
    a.first_child[o] = i < n ? fc[i] : -1;
    a.next_sibling[o] = i < n ? ns[i] : -1;
  }
  Blk::mark();
  uint64_t* anc = a.anc + int64_t(b) * N * W;
  if (kAnc && kAncSparse && W >= kAncSparseMinWords) {  // block-uniform
    for (int o = threadIdx.x; o < N * W; o += kBuildThreads) anc[o] = 0;
    __syncthreads();  // the zeros before any row's words (other threads write them)
    for (int i = threadIdx.x; i < N; i += kBuildThreads) write_anc_row<true>(anc + int64_t(i) * W, i, n, W, parent);
  } else if (kAnc) {
    for (int i = threadIdx.x; i < N; i += kBuildThreads) write_anc_row<false>(anc + int64_t(i) * W, i, n, W, parent);
  }
}

// Blk: the block policy (DevBlk; the builder bench's profiling policy logs a clock at each barrier and mark).
// kParMin: the smallest budget the parallel path takes; kOpt: Session 21's switches (kOptAll ships).
template <class Blk = DevBlk, int kParMin = kParMinBudget, int kOpt = kOptAll>
__global__ void __launch_bounds__(kBuildThreads) build_kernel(TreeBuildArgs a) {
  extern __shared__ __align__(16) unsigned char build_smem_raw[];
  __shared__ int n_shared;
  const int b = blockIdx.x, N = a.nodes, L = a.depth, K = a.k;
  const BuildLayout lay(L, K, N);
  double* hs = reinterpret_cast<double*>(build_smem_raw + lay.heap_s);
  double* score = reinterpret_cast<double*>(build_smem_raw + lay.score);
  float* lp = reinterpret_cast<float*>(build_smem_raw + lay.lp);
  uint32_t* hp = reinterpret_cast<uint32_t*>(build_smem_raw + lay.heap_p);
  int* ints = reinterpret_cast<int*>(build_smem_raw + lay.ints);
  int *parent = ints, *rank = ints + N, *depth = ints + 2 * N, *fc = ints + 3 * N, *ns = ints + 4 * N;
  for (int i = threadIdx.x; i < N; i += kBuildThreads) fc[i] = -1, ns[i] = -1;
  pdl_wait();  // launched as a programmatic dependent of the vocabulary pass: its outputs are read from here on
  Blk::mark();
  const int budget = min(max(a.budgets[b], 0), N - 1);
  const int64_t root = a.root_tokens[b], past = a.past_lens[b];  // for the emission, loaded early
  const int kb = min(budget, K);  // ranks >= budget can never be popped (Lemma 1)
  stage_lp<(kOpt & kOptVecLoad) != 0>(lp, a.top_lp, b, L, K, kb);
  Blk::sync();
  int n = -1;
  if (lay.cap >= budget && budget >= kParMin && kb > 0 && L > 0)
    n = par::build<Blk>(lay.tables(build_smem_raw, L), lp, L, kb, budget, lay.cap, parent, rank, depth, score, fc, ns,
                        (kOpt & kOptRank) ? par::kRankWorkMax : -1);
  if (n < 0) {  // not exact in float64, or heavy exact ties at the cut: the heap, which is exact always
    if (threadIdx.x == 0) {
      BestFirst bf{hs + 3, hp + 3, parent, rank, depth, score, fc, ns, lp, L, kb, 0};
      n_shared = bf.run(budget);
    }
    Blk::sync();
    n = n_shared;
  }
  constexpr bool kTok = (kOpt & kOptTokFirst) != 0, kAnc = (kOpt & kOptProbeNoAnc) == 0;
  emit_rows<Blk, kTok, kAnc, (kOpt & kOptAncSparse) != 0>(a, b, n, root, past, parent, rank, depth, score, fc, ns);
  if (threadIdx.x == 0) a.n_nodes[b] = n;
  Blk::mark();
}

}  // namespace

size_t tree_build_heap_smem_bytes(int depth, int k, int nodes) { return BuildLayout(depth, k, nodes).bytes; }

cudaError_t tree_build_heap_launch(const TreeBuildArgs& a, cudaStream_t stream) {
  if (a.batch == 0) return cudaSuccess;
  if (a.nodes < 1 || a.nodes > kTreeBuildMaxNodes || a.depth > kTreeBuildMaxDepth || a.k > kTreeBuildMaxK ||
      a.words != ceil_div(a.nodes, 64))
    return cudaErrorInvalidValue;
  const size_t smem = tree_build_heap_smem_bytes(a.depth, a.k, a.nodes);
  KDB_CUDA_TRY(allow_dynamic_smem(build_kernel<>, smem));
  return launch_pdl(build_kernel<>, dim3(unsigned(a.batch)), dim3(kBuildThreads), smem, stream, a);
}

constexpr int64_t kMaxAutoSplits = 8;

cudaError_t tree_build_topk_plan(TopkArgs& a, int forced, int device) {
  int sms = 0;
  KDB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int nchunks = ceil_div(a.vocab, vocab::kChunk);
  // One wave of 4 blocks per SM; a merge streams splits * k keys, so wide rows split less; at most kMaxAutoSplits
  // (batch 1: 8 splits of 5 chunks beat 20 of 2 by 8 % at k 16 and 15 % at k 256, tie at k 64; s14 call D).
  const int64_t fill = std::max<int64_t>(1, int64_t(sms) * 4 / std::max<int64_t>(a.rows, 1));
  const int64_t by_k = std::max(2, 8192 / std::max(a.k, 1));
  int want = forced > 0 ? forced : int(std::min<int64_t>({fill, kMaxAutoSplits, by_k}));
  want = std::max(1, std::min(want, nchunks));
  a.chunks_per_split = ceil_div(nchunks, want);
  a.splits = ceil_div(nchunks, a.chunks_per_split);  // every split holds at least one chunk
  return cudaSuccess;
}

// The vocabulary pass's shipped variant: prune at max(2k, 512) held keys; to k 64 kBitsRank (about one key a lane
// admits, and blocks end holding few: 6-11 % faster at batch >= 8, s20 call E). Above it, where the plan gives blocks
// of at least kSampleMinChunks chunks, one stream with the sampled estimate as a fixed threshold (kFix: 12-29 % faster
// at batch >= 32, s22 call B; the sample in 128-byte segments, s23), its rare second stream kLane admission; else kLane
// admission (the sampled floor it took from k 512 until s23 could not sample on such blocks). Above 128 kept keys the
// end sorts by the radix sort (s23; tree_build_end.h). reports/h200/tree_build_vocab_bench.cu times the others.
constexpr int kAdmitShipped = vocab::kLane, kAdmitSmallK = vocab::kBitsRank, kSmallKMax = 64;
constexpr int kMarkShipped = 512;

template <typename T, int VW, int kAdmit, int kMarkMin, bool kFix, int kOpt = 0>
cudaError_t launch_topk(const TopkArgs& a, cudaStream_t stream) {
  const size_t smem = vocab::kCap * sizeof(uint64_t);
  auto* kernel = vocab::topk_kernel<T, VW, kAdmit, kMarkMin, kFix, kOpt>;
  KDB_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<unsigned(a.rows * a.splits), vocab::kThreads, smem, stream>>>(a);
  KDB_LAUNCH_CHECK();
  if (a.splits == 1) return cudaSuccess;
  KDB_CUDA_TRY(cudaFuncSetAttribute(vocab::merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  return launch_pdl(vocab::merge_kernel, dim3(unsigned(a.rows)), dim3(vocab::kThreads), smem, stream, a);
}

template <typename T, int VW>
cudaError_t launch_topk_shipped(const TopkArgs& a, cudaStream_t stream) {
  if (a.k <= kSmallKMax) return launch_topk<T, VW, kAdmitSmallK, kMarkShipped, false>(a, stream);
  if constexpr (VW > 1) {  // blocks of enough vector chunks sample
    if (std::min(a.chunks_per_split, a.vocab / vocab::kChunk) >= vocab::kSampleMinChunks)
      return launch_topk<T, VW, kAdmitShipped, kMarkShipped, true>(a, stream);
  }
  return launch_topk<T, VW, kAdmitShipped, kMarkShipped, false>(a, stream);
}

cudaError_t tree_build_topk_launch(const TopkArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  if (a.k < 1 || a.k > kTreeBuildMaxK || a.k > a.vocab || a.splits < 1 || a.chunks_per_split < 1 ||
      int64_t(a.splits - 1) * a.chunks_per_split * vocab::kChunk >= a.vocab ||
      (a.splits > 1 && (a.part_keys == nullptr || a.part_ms == nullptr)))
    return cudaErrorInvalidValue;
  const size_t esize = a.dtype == LogitDtype::kF32 ? 4 : 2;
  // 16-byte vectors need every row start aligned: V * esize a multiple of 16 and an aligned base.
  const bool vec = (size_t(a.vocab) * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0;
  if (a.dtype == LogitDtype::kF32)
    return vec ? launch_topk_shipped<float, 4>(a, stream) : launch_topk_shipped<float, 1>(a, stream);
  return vec ? launch_topk_shipped<__nv_bfloat16, 8>(a, stream) : launch_topk_shipped<__nv_bfloat16, 1>(a, stream);
}

}  // namespace kdb
