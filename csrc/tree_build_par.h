// Parallel exact construction of the DDTree (included by tree_build.cu only): when every float64 score the
// reference heap computes is exact (ExactScale), its pop order is the global order (score desc, rank tuple
// asc), so the tree is the top-B of {tuples with score >= tau} for any tau whose set holds B..cap tuples.
// A bisection on tau enumerates that set level by level (rank-prefix property: a node's children are the
// ranks whose score clears tau, one binary search), then one sort gives pop order. Written against a block
// policy (Blk) so the host harness runs the same code with one thread. plans/0004 "tree_build".
#pragma once
#include <cmath>
#include <cstdint>

namespace kdb {
namespace par {

constexpr int kMaxCap = 2048;  // enumerated tuples (pop order key keeps 12 bits for the preorder index)
constexpr int kMaxDepth = 16;  // L of the parallel path (per-row words live in scratch 16..31, 48..63 and 64..79)
constexpr int kScratch = 80;
// Lexicographic digits of an entry (its first kLexLevels ranks + 1, 11 bits each, depth 1 highest; 0 = no rank):
// tuples that differ within their first kLexLevels ranks compare as their digits do.
constexpr int kLexLevels = 5, kLexBits = 11;
// The pop order by ranks (rank_order) when |E| x (entries below depth 1) is at most this; else preorder and a sort.
constexpr long kRankWorkMax = 1 << 16;  // <= ~256 compares a thread: below the sort at every n (s21 calls B, C)

// Enumeration capacity for a budget: a window [budget, cap] of set sizes for the bisection to land in.
__host__ __device__ inline int cap_for(int budget) { return min(max(4 * budget, 256), kMaxCap); }

// Tables of the enumerated set E, level by level (level t = depth t + 1), children grouped by parent in
// rank order, so a node's previous sibling is the previous entry.
struct ParTables {
  double* S;       // [cap] score (exact sum of log-probs)
  int* par;        // [cap] parent entry, -1 at depth 1
  int* rnk;        // [cap] rank at its depth
  int* coff;       // [cap] first child entry (absolute) once its level is expanded
  int* sz;         // [cap] subtree size, then (preorder) the sizes of the level's entries before it, then the entry
                   // at each pop index
  int* pre;        // [cap] preorder (= lexicographic) index in E
  int* bypre;      // [cap] entry of a preorder index
  int* nodeof;     // [cap] node index in the tree (1-based), 0 if not in it
  uint64_t* key;   // [pow2 >= cap] lexicographic digits (enumerate), then pop-order keys (the sort)
  int* lvl;        // [L + 2] level starts
  int* scratch;    // [80] block scan (0..7), row_scale (16..31), levels and q (40, 41), finite counts (48..63),
                   // each row's largest magnitude (64..79, float bits)
};

// Finite entries of a row sorted descending (-inf last).
__host__ __device__ inline int finite_count(const float* row, int kb) {
  if (kb > 0 && row[kb - 1] > -INFINITY) return kb;  // the usual case: one load, not log2(kb) dependent ones
  int lo = 0, hi = kb;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (row[mid] > -INFINITY) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Row d's share of exact mode (below): the ulp exponent of its first nonzero entry (rows sorted descending,
// magnitudes ascending, so that entry has the row's smallest ulp), 1 << 20 when every entry is 0 or -inf.
__host__ __device__ inline int row_scale(const float* row, int f) {
  int lo = 0, hi = f > 0 && row[0] != 0.f ? 0 : f;  // first entry below 0 (usually entry 0: one load)
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (row[mid] == 0.f) lo = mid + 1;
    else hi = mid;
  }
  if (lo == f) return 1 << 20;
  int e;
  frexpf(row[lo], &e);  // |v| in [2^(e-1), 2^e): ulp 2^(e-24) for normal floats
  return fabsf(row[lo]) < 1.17549435e-38f ? -149 : e - 24;
}

// Exact mode: all lp are multiples of 2^q and every partial sum the heap forms (|s| <= sum of the rows' largest
// magnitudes, |s - lp| one row maximum more) stays below 2^(51 + q), so float64 adds are exact (any order) and
// S / 2^q fits 52 bits. qd[d] = row_scale of row d, mag[d] its largest magnitude (its last finite entry, negated).
// Returns q, or INT32_MIN if not exact.
__host__ __device__ inline int exact_scale(const float* mag, const int* f, const int* qd, int L) {
  int q = 1 << 20;
  double m_sum = 0.0, m_max = 0.0;
  for (int d = 0; d < L; ++d) {
    if (f[d] == 0) continue;
    q = min(q, qd[d]);
    m_sum += double(mag[d]), m_max = fmax(m_max, double(mag[d]));
  }
  if (q == (1 << 20)) return 0;  // every lp is 0 or -inf
  return m_sum + m_max < ldexp(1.0, 51 + q) ? q : INT32_MIN;
}

// Count of r in [0, f) with s + row[r] >= tau; row sorted descending.
__host__ __device__ inline int count_ge(const float* row, int f, double s, double tau) {
  int lo = 0, hi = f;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (s + double(row[mid]) >= tau) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Last index i in [a, b) with off[i] <= j (off ascending, off[a] <= j).
__host__ __device__ inline int owner(const int* off, int a, int b, int j) {
  int lo = a, hi = b - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (off[mid] <= j) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// E = {tuples with score >= tau} (finite log-probs, ranks < f[d], depth <= L); returns |E|, or -1 beyond cap.
template <class Blk>
__host__ __device__ int enumerate(const ParTables& t, const float* lp, const int* f, int L, int kb, double tau,
                                  int cap) {
  const int m = count_ge(lp, f[0], 0.0, tau);
  if (m > cap) return -1;
  constexpr int top = kLexBits * (kLexLevels - 1);  // depth 1's digit
  for (int i = Blk::tid(); i < m; i += Blk::size())
    t.S[i] = double(lp[i]), t.par[i] = -1, t.rnk[i] = i, t.key[i] = uint64_t(i + 1) << top;
  if (Blk::tid() == 0) t.lvl[0] = 0, t.lvl[1] = m;
  Blk::sync();
  int n = m;
  for (int d = 1; d < L; ++d) {
    const int a = t.lvl[d - 1], b = n;
    const float* row = lp + d * kb;
    // coff[i] = n + children before i: the scan counts each entry's children itself (no barrier before it)
    const int total = Blk::exclusive_scan(t.coff + a, b - a, t.scratch, n,
                                          [&](int i) { return count_ge(row, f[d], t.S[a + i], tau); });
    if (n + total > cap) return -1;
    for (int j = Blk::tid(); j < total; j += Blk::size()) {
      const int i = owner(t.coff, a, b, n + j), e = n + j, r = e - t.coff[i];
      t.S[e] = t.S[i] + double(row[r]), t.par[e] = i, t.rnk[e] = r;
      t.key[e] = t.key[i] | (d < kLexLevels ? uint64_t(r + 1) << (top - kLexBits * d) : 0);
    }
    n += total;
    if (Blk::tid() == 0) t.lvl[d + 1] = n;
    Blk::sync();
    if (total == 0) break;
  }
  if (Blk::tid() == 0) {
    int levels = 1;  // non-empty levels
    while (levels < L && t.lvl[levels + 1] > t.lvl[levels]) ++levels;
    t.scratch[40] = levels;
  }
  Blk::sync();
  return n;
}

// Preorder (lexicographic) index of every entry: subtree sizes bottom-up, then offsets top-down.
template <class Blk>
__host__ __device__ void preorder(const ParTables& t, int n) {
  const int levels = t.scratch[40];
  for (int i = Blk::tid(); i < n; i += Blk::size()) t.sz[i] = 1;
  Blk::sync();
  for (int lv = levels - 1; lv >= 1; --lv) {
    for (int i = t.lvl[lv] + Blk::tid(); i < t.lvl[lv + 1]; i += Blk::size()) Blk::atomic_add(&t.sz[t.par[i]], t.sz[i]);
    Blk::sync();
  }
  for (int lv = 0; lv < levels; ++lv) {
    const int a = t.lvl[lv], b = t.lvl[lv + 1];
    int* before = t.sz + a;  // in place: sz[i] becomes the subtree sizes of the level's entries before i
    Blk::exclusive_scan(before, b - a, t.scratch, 0, [&](int i) { return before[i]; });
    for (int i = a + Blk::tid(); i < b; i += Blk::size()) {
      const int p = t.par[i];
      // under a parent: its own index + 1 + the sizes of i's earlier siblings (sz[i] - sz[first sibling])
      t.pre[i] = p < 0 ? t.sz[i] : t.pre[p] + 1 + t.sz[i] - t.sz[t.coff[p]];
    }
    Blk::sync();
  }
}

// Bisection on tau until budget <= |E(tau)| <= cap (or E holds every tuple and fewer than budget exist):
// count(hi) >= 1, count(lo_all) = every tuple; too many: raise tau; too few: lower it, first to lo_all once.
// Returns |E| with E enumerated in t, or -1 (no progress: exact ties at the cut spread over more than cap).
template <class Blk>
__host__ __device__ int bisect(const ParTables& t, const float* lp, const int* f, int L, int kb, int budget, int cap) {
  double hi = double(lp[0]), lo_all = 0.0;
  for (int d = 0; d < L; ++d) lo_all += f[d] > 0 ? double(lp[d * kb + f[d] - 1]) : 0.0;
  double lo = lo_all, tau = double(lp[min(budget, f[0]) - 1]);  // count(tau) >= min(budget, f0)
  bool lo_overflows = false;
  for (int it = 0; it < 32; ++it) {  // 2^-32 of the score range separates float32-spaced sums
    const int n = enumerate<Blk>(t, lp, f, L, kb, tau, cap);
    if (n >= budget || (n >= 0 && tau <= lo_all)) return n;
    double next;
    if (n < 0) {
      lo = tau, lo_overflows = true, next = 0.5 * (tau + hi);
    } else {
      hi = tau, next = lo_overflows ? 0.5 * (lo + tau) : lo_all;
    }
    if (next == tau || next != next) return -1;
    tau = next;
  }
  return -1;
}

// Depth of entry e (1 at level 0).
__host__ __device__ inline int entry_depth(const ParTables& t, int e) {
  int d = 1;
  for (int x = t.par[e]; x >= 0; x = t.par[x]) ++d;
  return d;
}

// Entry a's rank tuple before entry b's (a != b; lexicographic, a prefix first), by walking both up to their common
// ancestor: rank_order's tie-break where both tuples share their first kLexLevels ranks (rare).
__host__ __device__ inline bool tuple_less(const ParTables& t, int a, int b) {
  int da = entry_depth(t, a), db = entry_depth(t, b);
  const int oa = da, ob = db;
  for (; da > db; --da) a = t.par[a];
  for (; db > da; --db) b = t.par[b];
  if (a == b) return oa < ob;
  while (t.par[a] != t.par[b]) a = t.par[a], b = t.par[b];
  return t.rnk[a] < t.rnk[b];
}

// Entry i pops before entry j (i != j): score desc, then rank tuple asc (digits, else the walk).
__host__ __device__ inline bool precedes(const ParTables& t, int i, int j) {
  if (t.S[i] != t.S[j]) return t.S[i] > t.S[j];
  return t.key[i] != t.key[j] ? t.key[i] < t.key[j] : tuple_less(t, i, j);
}

// Deeper entries (n0..n-1) before entry e: one branch-free pass of compares (score, then digits); a tie the digits do
// not break (tuples sharing their first kLexLevels ranks; rare) sends e through the walk (precedes) instead.
__host__ __device__ inline int deep_before(const ParTables& t, int n0, int n, int e) {
  const double s = t.S[e];
  const uint64_t k = t.key[e];
  int r = 0, same = 0;
#pragma unroll 4
  for (int j = n0; j < n; ++j) {
    const double sj = t.S[j];
    const uint64_t kj = t.key[j];
    r += int(sj > s) | (int(sj == s) & int(kj < k));
    same += int(sj == s) & int(kj == k);
  }
  if (same > int(e >= n0)) {  // e itself aside
    r = 0;
    for (int j = n0; j < n; ++j) r += j != e && precedes(t, j, e) ? 1 : 0;
  }
  return r;
}

// Pop order by counting: an entry's pop index is the number of entries before it; level 0 is already in pop order
// (rank r at index r: scores non-increasing, ties by rank), so it takes a binary search there and one compare per
// deeper entry. Sets sz[pop index] = entry and nodeof[e] = pop index + 1 (0 from nn on).
template <class Blk>
__host__ __device__ void rank_order(const ParTables& t, int n, int nn) {
  const int n0 = t.lvl[1];
  for (int e = Blk::tid(); e < n; e += Blk::size()) {
    int lo = 0, hi = e < n0 ? 0 : n0;
    while (lo < hi) {  // level-0 entries before e
      const int mid = (lo + hi) >> 1;
      if (precedes(t, mid, e)) lo = mid + 1;
      else hi = mid;
    }
    const int r = (e < n0 ? e : lo) + deep_before(t, n0, n, e);
    t.nodeof[e] = r < nn ? r + 1 : 0;
    if (r < nn) t.sz[r] = e;
  }
  Blk::sync();
}

// Pop order by a sort (score desc, preorder asc): what rank_order gives, for large deep levels.
template <class Blk>
__host__ __device__ void sort_order(const ParTables& t, int n, int q, int nn) {
  preorder<Blk>(t, n);
  int p = 1;
  while (p < n) p <<= 1;
  const double inv = ldexp(1.0, -q);
  for (int i = Blk::tid(); i < p; i += Blk::size()) {
    if (i >= n) {
      t.key[i] = 0;
      continue;
    }
    const int64_t units = int64_t(t.S[i] * inv);  // exact: |units| < 2^51
    t.key[i] = (uint64_t(units + (int64_t(1) << 51)) << 12) | uint64_t(4095 - t.pre[i]);
    t.bypre[t.pre[i]] = i, t.nodeof[i] = 0;
  }
  Blk::sync();
  Blk::sort_desc(t.key, p);
  for (int j = Blk::tid(); j < nn; j += Blk::size()) {  // sz is free once preorder is done
    const int e = t.bypre[4095 - int(t.key[j] & 4095)];
    t.nodeof[e] = j + 1, t.sz[j] = e;
  }
  Blk::sync();
}

// E in pop order, the first min(budget, n) entries written as nodes: by counting when |E| x (entries below depth
// 1) <= rank_work_max, else by a sort.
template <class Blk>
__host__ __device__ int emit(const ParTables& t, int n, int q, int budget, long rank_work_max, int* parent, int* rank,
                             int* depth, double* score, int* first_child, int* next_sibling) {
  const int nn = min(budget, n);
  if (long(n) * (n - t.lvl[1]) <= rank_work_max) rank_order<Blk>(t, n, nn);
  else sort_order<Blk>(t, n, q, nn);
  for (int j = Blk::tid(); j < nn; j += Blk::size()) {
    const int e = t.sz[j], i = j + 1, pe = t.par[e];
    const int pn = pe < 0 ? 0 : t.nodeof[pe];
    parent[i] = pn, rank[i] = t.rnk[e], depth[i] = entry_depth(t, e), score[i] = t.S[e];
    if (t.rnk[e] == 0) first_child[pn] = i;
    else next_sibling[t.nodeof[e - 1]] = i;
  }
  if (Blk::tid() == 0) parent[0] = -1, rank[0] = -1, depth[0] = 0, score[0] = 0.0;
  Blk::sync();
  return nn + 1;
}

// The tree from the parallel path into the node tables; returns n (incl. the root), or -1 when the caller
// must run the heap (not exact, or no tau gives budget..cap tuples: heavy exact ties at the cut).
template <class Blk>
__host__ __device__ int build(const ParTables& t, const float* lp, int L, int kb, int budget, int cap,
                              int* parent, int* rank, int* depth, double* score, int* first_child,
                              int* next_sibling, long rank_work_max = kRankWorkMax) {
  if (L < 1 || L > kMaxDepth || kb < 1 || budget < 1 || budget > cap) return -1;
  int *f = t.scratch + 48, *qd = t.scratch + 16;  // per row: finite entries, row_scale (L <= kMaxDepth)
  float* mag = reinterpret_cast<float*>(t.scratch + 64);
  // One thread per row (all in warp 0: L <= 16), then thread 0: no block barrier between them.
  for (int d = Blk::tid(); d < L; d += Blk::size()) {
    f[d] = finite_count(lp + d * kb, kb), qd[d] = row_scale(lp + d * kb, f[d]);
    mag[d] = f[d] > 0 ? -lp[d * kb + f[d] - 1] : 0.f;
  }
  Blk::sync_warp();
  if (Blk::tid() == 0) t.scratch[41] = exact_scale(mag, f, qd, L);
  Blk::sync();
  const int q = t.scratch[41];
  if (q == INT32_MIN || f[0] == 0) return -1;
  const int n = bisect<Blk>(t, lp, f, L, kb, budget, cap);
  if (n < 0) return -1;
  return emit<Blk>(t, n, q, budget, rank_work_max, parent, rank, depth, score, first_child, next_sibling);
}

// One thread (the host harness; block code with Blk::size() == 1 runs sequentially).
struct HostBlk {
  __host__ __device__ static int tid() { return 0; }
  __host__ __device__ static int size() { return 1; }
  __host__ __device__ static void sync() {}
  __host__ __device__ static void sync_warp() {}
  __host__ __device__ static void atomic_add(int* p, int v) { *p += v; }
  template <class Gen>
  __host__ __device__ static int exclusive_scan(int* x, int n, int*, int base, Gen gen) {
    int s = 0;
    for (int i = 0; i < n; ++i) {
      const int v = gen(i);
      x[i] = base + s, s += v;
    }
    return s;
  }
  __host__ __device__ static void sort_desc(uint64_t* k, int p) {  // insertion sort: tests only
    for (int i = 1; i < p; ++i) {
      const uint64_t v = k[i];
      int j = i - 1;
      while (j >= 0 && k[j] < v) k[j + 1] = k[j], --j;
      k[j + 1] = v;
    }
  }
};

}  // namespace par
}  // namespace kdb
