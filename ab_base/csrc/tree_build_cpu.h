// DDTree tree_build on the CPU (paper Algorithm 1): the host heap a serving stack would run, with the
// pop order, tie rule and float64 score arithmetic of references/tree_build.py (build_tree_from_topk
// + pad_tree_arrays). Header-only C++17; no torch, no pybind. See plans/0002-references.md "Rules".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__GNUC__)
#define KDB_NOINLINE __attribute__((noinline))
#else
#define KDB_NOINLINE
#endif

namespace kdb::cpu_heap {

struct Dims {
  int64_t batch;  // B requests
  int64_t depth;  // L draft depths
  int64_t k;      // K top-K entries per depth (each request uses min(K, its budget), Lemma 1)
  int64_t nodes;  // N = n_max rows per request, root included
  int64_t words() const { return (nodes + 63) / 64; }  // W: mask words per row
};

// Outputs, C-contiguous; [B, N] unless noted. Same values and padding as pad_tree_arrays.
struct Out {
  int64_t* tokens;
  int64_t* parents;       // -1 at the root, 0 at padding rows
  int64_t* depths;        // 0 at the root, 1 at padding rows
  int64_t* ranks;         // -1 at the root and padding rows
  double* scores;         // log Q(prefix): 0 at the root, -inf at padding rows
  int64_t* first_child;   // -1 = none
  int64_t* next_sibling;  // -1 = none
  uint64_t* bitmask;      // [B, N, W]: bit j % 64 of word j / 64 in row i = node j is ancestor-or-self
  int64_t* n_nodes;       // [B] real rows, root included
};

constexpr int64_t kMaxDepth = 65535;  // L: a heap entry stores depth in 16 bits
constexpr int64_t kMaxNodes = 65536;  // n_max: ranks < budget <= n_max - 1 fit 16 bits

namespace detail {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// 16 bytes (~20% faster than int64 fields at budget 256): hence the limits kMaxDepth and kMaxNodes.
struct Entry {      // a candidate prefix: rank tuple = ranks of `parent`'s path, then `rank`
  double score;     // float64 log Q, incremental as the reference
  uint32_t parent;  // node index of the prefix without its last token
  uint16_t depth;   // 1..L
  uint16_t rank;    // rank at `depth`, 0..min(K, budget)-1 < n_max
};

// One request's rows of the outputs plus reusable scratch (one per thread).
struct Builder {
  int64_t *tok, *par, *dep, *rnk;
  std::vector<Entry> heap;
  std::vector<int64_t> ta, tb, last;  // rank tuples on ties; last child linked per parent

  // Rank tuple of an entry, walking up the nodes already popped (only on exact score ties).
  void tuple(const Entry& e, std::vector<int64_t>& out) const {
    out.resize(static_cast<size_t>(e.depth));
    out[e.depth - 1] = e.rank;
    for (int64_t n = e.parent; n > 0; n = par[n]) out[dep[n] - 1] = rnk[n];
  }
  // Equal scores: a pops after b when its rank tuple is lexicographically larger. Kept out of line so the
  // score comparison inlines into the heap loops.
  KDB_NOINLINE bool tuple_after(const Entry& a, const Entry& b) {
    tuple(a, ta);
    tuple(b, tb);
    return std::lexicographical_compare(tb.begin(), tb.end(), ta.begin(), ta.end());
  }
  auto after() {  // heap order: true when a pops after b
    return [this](const Entry& a, const Entry& b) {
      return a.score < b.score || (a.score == b.score && tuple_after(a, b));
    };
  }
  void push(const Entry& e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), after());
  }
  Entry pop() {
    std::pop_heap(heap.begin(), heap.end(), after());
    Entry e = heap.back();
    heap.pop_back();
    return e;
  }
};

// Algorithm 1 for one request: lp, tok [L, K] rows of this request. Returns the node count (root included).
template <class T>
int64_t best_first(const T* lp, const int64_t* tok, const Dims& d, int64_t budget, double* score, Builder& bd) {
  const int64_t K = std::min(d.k, budget);  // Lemma 1: ranks >= budget never enter the top budget
  auto at = [&](int64_t depth, int64_t rank) { return static_cast<double>(lp[(depth - 1) * d.k + rank]); };
  bd.heap.clear();
  if (budget > 0 && d.depth > 0 && K > 0 && at(1, 0) > kNegInf) bd.push({at(1, 0), 0, 1, 0});
  int64_t n = 0;  // nodes popped so far; node n sits in row n
  while (!bd.heap.empty() && n < budget) {
    const Entry e = bd.pop();
    ++n;
    bd.tok[n] = tok[(e.depth - 1) * d.k + e.rank];
    bd.par[n] = e.parent;
    bd.dep[n] = e.depth;
    bd.rnk[n] = e.rank;
    score[n] = e.score;
    if (e.rank + 1 < K && at(e.depth, e.rank + 1) > kNegInf)  // sibling: s - lp[r] + lp[r+1], in this order
      bd.push({e.score - at(e.depth, e.rank) + at(e.depth, e.rank + 1), e.parent, e.depth,
               static_cast<uint16_t>(e.rank + 1)});
    if (e.depth < d.depth && at(e.depth + 1, 0) > kNegInf)    // first child: s + lp[d, 0]
      bd.push({e.score + at(e.depth + 1, 0), static_cast<uint32_t>(n), static_cast<uint16_t>(e.depth + 1), 0});
  }
  return n + 1;
}

// Root, padding rows, LCRS links and ancestor bits of one request (rows [0, n1) real, [n1, N) padding).
inline void layouts(const Dims& d, int64_t n1, int64_t root, double* score, int64_t* first, int64_t* next,
                    uint64_t* bits, Builder& bd) {
  const int64_t N = d.nodes, W = d.words();
  bd.tok[0] = root, bd.par[0] = -1, bd.dep[0] = 0, bd.rnk[0] = -1, score[0] = 0.0;
  for (int64_t i = n1; i < N; ++i)
    bd.tok[i] = root, bd.par[i] = 0, bd.dep[i] = 1, bd.rnk[i] = -1, score[i] = kNegInf;
  std::fill(first, first + N, -1);
  std::fill(next, next + N, -1);
  std::fill(bits, bits + N * W, uint64_t{0});
  bd.last.assign(static_cast<size_t>(n1), -1);
  for (int64_t i = 1; i < n1; ++i) {  // children linked in index order = rank order
    const int64_t p = bd.par[i];
    if (bd.last[p] < 0) {
      first[p] = i;
    } else {
      next[bd.last[p]] = i;
    }
    bd.last[p] = i;
  }
  bits[0] = 1;                       // the root sees itself
  for (int64_t i = 1; i < N; ++i) {  // row i = its parent's row (final: parent < i) plus bit i
    const int64_t src = i < n1 ? bd.par[i] : 0;  // padding rows see the root and themselves
    std::copy(bits + src * W, bits + (src + 1) * W, bits + i * W);
    bits[i * W + i / 64] |= uint64_t{1} << (i % 64);
  }
}

template <class T>
void build_range(const T* lp, const int64_t* tok, const int64_t* budgets, const int64_t* roots, const Dims& d,
                 const Out& o, int64_t b0, int64_t b1) {
  Builder bd;
  const int64_t N = d.nodes, LK = d.depth * d.k;
  for (int64_t b = b0; b < b1; ++b) {
    bd.tok = o.tokens + b * N, bd.par = o.parents + b * N, bd.dep = o.depths + b * N, bd.rnk = o.ranks + b * N;
    double* score = o.scores + b * N;
    const int64_t n1 = best_first(lp + b * LK, tok + b * LK, d, budgets[b], score, bd);
    layouts(d, n1, roots[b], score, o.first_child + b * N, o.next_sibling + b * N, o.bitmask + b * N * d.words(),
            bd);
    o.n_nodes[b] = n1;
  }
}

inline std::string at_index(int64_t b, int64_t l, int64_t r) {
  return "[" + std::to_string(b) + ", " + std::to_string(l) + ", " + std::to_string(r) + "]";
}

}  // namespace detail

// Checks the values the heap relies on; throws std::invalid_argument naming the argument and index.
template <class T>
void check_values(const T* lp, const int64_t* budgets, const Dims& d) {
  if (d.batch < 0 || d.depth < 0 || d.k < 0)
    throw std::invalid_argument("tree_build_cpu: bad dims B=" + std::to_string(d.batch) + " L=" +
                                std::to_string(d.depth) + " K=" + std::to_string(d.k));
  if (d.nodes < 1 || d.nodes > kMaxNodes)
    throw std::invalid_argument("n_max must be in [1, " + std::to_string(kMaxNodes) + "], got " +
                                std::to_string(d.nodes));
  if (d.depth > kMaxDepth)
    throw std::invalid_argument("L = " + std::to_string(d.depth) + " > " + std::to_string(kMaxDepth));
  for (int64_t b = 0; b < d.batch; ++b)
    if (budgets[b] < 0 || budgets[b] > d.nodes - 1)
      throw std::invalid_argument("budgets[" + std::to_string(b) + "] = " + std::to_string(budgets[b]) +
                                  " must lie in [0, n_max - 1 = " + std::to_string(d.nodes - 1) + "]");
  for (int64_t row = 0; row < d.batch * d.depth; ++row) {
    const T* x = lp + row * d.k;
    bool bad = d.k > 0 && !(x[0] <= 0);  // a branch-free pass per row; the message is found only on failure
    for (int64_t r = 1; r < d.k; ++r) bad |= !(x[r] <= 0) | (x[r] > x[r - 1]);
    if (!bad) continue;
    for (int64_t r = 0; r < d.k; ++r) {
      const std::string where = "top_lp" + detail::at_index(row / d.depth, row % d.depth, r);
      if (!(x[r] <= 0))
        throw std::invalid_argument(where + " = " + std::to_string(x[r]) + ": log-probs must be <= 0 and not NaN");
      if (r > 0 && x[r] > x[r - 1])
        throw std::invalid_argument(where + " is larger than the rank before it: rows must be sorted descending");
    }
  }
}

// Builds every request: lp, tok [B, L, K]; budgets, roots [B]. n_threads <= 1 runs on the calling thread.
template <class T>
void build_batch(const T* lp, const int64_t* tok, const int64_t* budgets, const int64_t* roots, const Dims& d,
                 const Out& o, int n_threads) {
  check_values(lp, budgets, d);
  const int64_t n_workers = std::min<int64_t>(std::max(n_threads, 1), std::max<int64_t>(d.batch, 1));
  if (n_workers == 1) return detail::build_range(lp, tok, budgets, roots, d, o, 0, d.batch);
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n_workers));
  for (int64_t w = 0; w < n_workers; ++w) {  // contiguous chunks of requests
    const int64_t b0 = d.batch * w / n_workers, b1 = d.batch * (w + 1) / n_workers;
    workers.emplace_back([&, w, b0, b1] {
      try {
        detail::build_range(lp, tok, budgets, roots, d, o, b0, b1);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (auto& t : workers) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kdb::cpu_heap
