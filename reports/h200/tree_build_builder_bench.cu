// tree_build builder bench, no torch (as tree_build_vocab_bench.cu): the builder alone (`build_kernel`, one block a
// request) on the issue-16 shapes (L 15, V 163840, bf16 logits N(0, 3) through the shipped vocabulary pass, budget =
// K = N - 1), its outputs checked against the host's BestFirst (the reference heap, every request) and every
// variant's against the shipped one's bit for bit, before and after timing; timed with CUDA events after a 256 MB
// L2-flush memset, variants alternating order between rounds (ABBA). A profile launch (`ProfBlk`: thread 0 logs
// clock64 at each barrier and mark of the builder) gives where a block's time goes. s21: plans/0004 "tree_build".
// Build: nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//   reports/h200/tree_build_builder_bench.cu -o tbb
// Usage: tbb OUT.jsonl [SHAPES [FIRST]]: SHAPES shapes from shape FIRST (all from 0 by default); SHAPES < 0: -SHAPES
// shapes, checked once, no timing (for compute-sanitizer and ncu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tree_build.cu"  // kdb::build_kernel<Blk>, BestFirst, BuildLayout, the launchers

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)
#include "bench_cli.h"

namespace {
constexpr int L = 15, V = 163840, kRounds = 15, kMaxMarks = 512;

// ---- the profile: clock64 of thread 0 at every barrier and mark, per block (request)
__device__ long long g_marks[64][kMaxMarks];
__device__ int g_nmarks[64];
struct ProfBlk : kdb::vocab::DevBlk {
  __device__ static void mark() {
    if (threadIdx.x != 0 || blockIdx.x >= 64) return;
    const int n = g_nmarks[blockIdx.x];
    if (n < kMaxMarks) g_marks[blockIdx.x][n] = clock64();
    g_nmarks[blockIdx.x] = n + 1;
  }
  __device__ static void sync() { __syncthreads(), mark(); }
};

template <class Blk, int kParMin, int kOpt>
cudaError_t launch_v(const kdb::TreeBuildArgs& a, cudaStream_t stream) {  // as tree_build_heap_launch
  const size_t smem = kdb::tree_build_heap_smem_bytes(a.depth, a.k, a.nodes);
  CK(kdb::allow_dynamic_smem(kdb::build_kernel<Blk, kParMin, kOpt>, smem));
  return kdb::launch_pdl(kdb::build_kernel<Blk, kParMin, kOpt>, dim3(unsigned(a.batch)), dim3(kdb::kBuildThreads),
                         smem, stream, a);
}
using Launch = cudaError_t (*)(const kdb::TreeBuildArgs&, cudaStream_t);
using kdb::DevBlk;
constexpr int kAll = kdb::kOptAll, kPar = kdb::kParMinBudget;
struct Variant { const char* name; Launch fn; };
const Variant kVariants[] = {  // [0] is the shipped one: every other variant is compared with it
    {"shipped", kdb::tree_build_heap_launch},
    {"opts_off", launch_v<DevBlk, kPar, 0>},  // s21's switches off (the parallel path from budget 1 and the
    // warp-local prologue stay)
    {"no_rank", launch_v<DevBlk, kPar, kAll & ~kdb::kOptRank>},
    {"no_vec_load", launch_v<DevBlk, kPar, kAll & ~kdb::kOptVecLoad>},
    {"no_tok_first", launch_v<DevBlk, kPar, kAll & ~kdb::kOptTokFirst>},
    {"heap_below_32", launch_v<DevBlk, 32, kAll>},  // the heap below budget 32 (shipped until s21)
    {"anc_rows", launch_v<DevBlk, kPar, kAll & ~kdb::kOptAncSparse>},  // every word of a row a thread at every W
    {"probe_no_anc", launch_v<DevBlk, kPar, kAll | kdb::kOptProbeNoAnc>},  // no ancestor masks: not checked
};
const Variant kProfiled[] = {{"shipped", launch_v<ProfBlk, kPar, kAll>}, {"opts_off", launch_v<ProfBlk, kPar, 0>}};
constexpr int kNV = sizeof(kVariants) / sizeof(kVariants[0]);

struct Shape { int batch, budget; };
const Shape kShapes[] = {{1, 16}, {1, 64}, {1, 256}, {1, 1024}, {8, 16}, {8, 64}, {8, 256}, {8, 1024},
                         {32, 16}, {32, 64}, {32, 256}, {32, 1024}, {64, 16}, {64, 64}, {64, 256}, {64, 1024}};

__global__ void fill_normal(__nv_bfloat16* x, int64_t n, uint64_t seed) {  // N(0, 3) by Box-Muller on a hash
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull, z ^= z >> 31;
    const float u1 = (float(z >> 40) + 1.f) / 16777217.f, u2 = float((z >> 16) & 0xffffff) / 16777216.f;
    x[i] = __float2bfloat16(3.f * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}

struct Out {  // one variant's outputs
  int64_t *tokens, *positions;
  int32_t *parents, *depths, *fc, *ns, *n_nodes;
  uint64_t* anc;
  double* scores;
};

template <class T>
T* dalloc(size_t n) {
  T* p;
  CK(cudaMalloc(&p, n * sizeof(T)));
  CK(cudaMemset(p, 0xff, n * sizeof(T)));  // poison: -1 ints, NaN scores
  return p;
}
Out make_out(kdb::TreeBuildArgs& a) {
  const size_t bn = size_t(a.batch) * a.nodes;
  Out o{dalloc<int64_t>(bn), dalloc<int64_t>(bn), dalloc<int32_t>(bn), dalloc<int32_t>(bn), dalloc<int32_t>(bn),
        dalloc<int32_t>(bn), dalloc<int32_t>(a.batch), dalloc<uint64_t>(bn * a.words), dalloc<double>(bn)};
  a.tokens = o.tokens, a.positions = o.positions, a.parents = o.parents, a.depths = o.depths;
  a.first_child = o.fc, a.next_sibling = o.ns, a.n_nodes = o.n_nodes, a.anc = o.anc, a.scores = o.scores;
  return o;
}
void free_out(Out& o) {
  for (void* p : {(void*)o.tokens, (void*)o.positions, (void*)o.parents, (void*)o.depths, (void*)o.fc, (void*)o.ns,
                  (void*)o.n_nodes, (void*)o.anc, (void*)o.scores}) CK(cudaFree(p));
}

template <class T>
std::vector<T> host(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// The host reference: BestFirst (the kernel's heap, run on the host) on each request's top log-probs.
struct Ref { std::vector<int> n, parent, rank, depth, fc, ns; std::vector<double> score; };
Ref reference(const kdb::TreeBuildArgs& a) {
  const int N = a.nodes, K = a.k, B = a.batch;
  const std::vector<float> lp_all = host(a.top_lp, size_t(B) * L * K);
  Ref r{std::vector<int>(B), std::vector<int>(size_t(B) * N), std::vector<int>(size_t(B) * N),
        std::vector<int>(size_t(B) * N), std::vector<int>(size_t(B) * N, -1), std::vector<int>(size_t(B) * N, -1),
        std::vector<double>(size_t(B) * N)};
  std::vector<double> hs(N + kdb::kHeapPad + 8);
  std::vector<uint32_t> hp(N + kdb::kHeapPad + 8);
  for (int b = 0; b < B; ++b) {
    const size_t o = size_t(b) * N;
    kdb::BestFirst bf{hs.data() + 3, hp.data() + 3, &r.parent[o], &r.rank[o], &r.depth[o], &r.score[o], &r.fc[o],
                      &r.ns[o], &lp_all[size_t(b) * L * K], L, K, 0};
    r.n[b] = bf.run(N - 1);
  }
  return r;
}

// 0: ok; else prints the first difference. Variant 0 against the reference, every variant against variant 0.
int check(const kdb::TreeBuildArgs& a, const std::vector<Out>& out, const Ref& ref, int i) {
  const int N = a.nodes, B = a.batch;
  const size_t bn = size_t(B) * N;
  const auto par = host(out[i].parents, bn), dep = host(out[i].depths, bn), fc = host(out[i].fc, bn);
  const auto ns = host(out[i].ns, bn), nn = host(out[i].n_nodes, B);
  const auto sc = host(out[i].scores, bn);
  const auto tok = host(out[i].tokens, bn), top_tok = host(a.top_tok, size_t(B) * L * a.k);
  if (std::strncmp(kVariants[i].name, "probe", 5) == 0) return 0;  // a bound, not a builder: its outputs are wrong
  if (i == 0) {
    for (int b = 0; b < B; ++b) {
      if (nn[b] != ref.n[b]) return std::printf("  %s: request %d has %d nodes, host %d\n", kVariants[i].name, b,
                                                 nn[b], ref.n[b]), 1;
      for (int j = 1; j < nn[b]; ++j) {
        const size_t o = size_t(b) * N + j;
        const int64_t t = top_tok[(size_t(b) * L + ref.depth[o] - 1) * a.k + ref.rank[o]];
        if (par[o] != ref.parent[o] || dep[o] != ref.depth[o] || fc[o] != ref.fc[o] || ns[o] != ref.ns[o] ||
            std::memcmp(&sc[o], &ref.score[o], 8) != 0 || tok[o] != t)
          return std::printf("  %s: request %d node %d differs from the host heap\n", kVariants[i].name, b, j), 1;
      }
    }
    return 0;
  }
  const Out& z = out[0];
  const bool same = par == host(z.parents, bn) && dep == host(z.depths, bn) && fc == host(z.fc, bn) &&
                    ns == host(z.ns, bn) && nn == host(z.n_nodes, B) && tok == host(z.tokens, bn) &&
                    host(out[i].positions, bn) == host(z.positions, bn) &&
                    host(out[i].anc, bn * a.words) == host(z.anc, bn * a.words) &&
                    std::memcmp(sc.data(), host(z.scores, bn).data(), bn * 8) == 0;
  return same ? 0 : (std::printf("  %s: outputs differ from shipped\n", kVariants[i].name), 1);
}

// Per variant, kRounds samples (us): time_abba (bench_cli.h).
std::vector<std::vector<float>> time_all(const std::vector<kdb::TreeBuildArgs>& args, void* flush, cudaEvent_t e0,
                                         cudaEvent_t e1) {
  return time_abba(kNV, kRounds, flush, e0, e1, [&](int i) { return kVariants[i].fn(args[i], 0); });
}

// One profile launch: per request the cycles from the first mark (after pdl_wait) to the last, and request 0's
// gaps between consecutive marks (the barriers in program order; plans/0004 maps them to phases).
void profile(FILE* out, const Shape& sh, kdb::TreeBuildArgs a, const Variant& v) {
  Out o = make_out(a);
  const std::vector<int> zero(64, 0);
  CK(cudaMemcpyToSymbol(g_nmarks, zero.data(), sizeof(int) * 64));
  CK(v.fn(a, 0));
  CK(cudaDeviceSynchronize());
  std::vector<int> nm(64);
  std::vector<long long> mk(size_t(64) * kMaxMarks);
  CK(cudaMemcpyFromSymbol(nm.data(), g_nmarks, sizeof(int) * 64));
  CK(cudaMemcpyFromSymbol(mk.data(), g_marks, sizeof(long long) * 64 * kMaxMarks));
  std::vector<float> tot;
  int slow = 0;
  for (int b = 0; b < std::min(a.batch, 64); ++b) {
    const int n = std::min(nm[b], kMaxMarks);
    tot.push_back(float(mk[size_t(b) * kMaxMarks + n - 1] - mk[size_t(b) * kMaxMarks]));
    if (tot.back() > tot[slow]) slow = b;
  }
  std::fprintf(out, "{\"batch\": %d, \"budget\": %d, \"profile\": \"%s\", \"marks\": %d, \"cycles_median\": %.0f, "
               "\"cycles_max\": %.0f, \"slowest\": %d, \"marks_slowest\": %d", sh.batch, sh.budget, v.name, nm[0],
               quantile(tot, 0.5), quantile(tot, 1), slow, nm[slow]);
  for (int which = 0; which < 2; ++which) {  // request 0's and the slowest request's gaps between consecutive marks
    const int b = which == 0 ? 0 : slow;
    std::fprintf(out, ", \"gaps%s\": [", which == 0 ? "0" : "_slowest");
    for (int j = 1; j < std::min(nm[b], kMaxMarks); ++j)
      std::fprintf(out, "%s%lld", j > 1 ? ", " : "", mk[size_t(b) * kMaxMarks + j] - mk[size_t(b) * kMaxMarks + j - 1]);
    std::fprintf(out, "]");
  }
  std::fprintf(out, "}\n");
  std::printf("B%-3d budget %-5d profile %-10s %d marks, %.0f cycles a block (median; max %.0f, request %d)\n",
              sh.batch, sh.budget, v.name, nm[0], quantile(tot, 0.5), quantile(tot, 1), slow);
  free_out(o);
}

// One shape: the vocabulary pass on fresh logits, the host reference, check, time, check again, profile, report.
int run_shape(const Shape& sh, bool once, FILE* out, void* flush, cudaEvent_t e0, cudaEvent_t e1, int si) {
  const int B = sh.batch, K = sh.budget, N = sh.budget + 1;
  const int64_t rows = int64_t(B) * L;
  __nv_bfloat16* logits;
  CK(cudaMalloc(&logits, rows * V * 2));
  fill_normal<<<1024, 256>>>(logits, rows * V, 2026 + 7919ull * si);
  kdb::TopkArgs t{logits, kdb::LogitDtype::kBF16, rows, V, K, nullptr, nullptr, nullptr};
  CK(kdb::tree_build_topk_plan(t, 0, 0));
  t.top_lp = dalloc<float>(rows * K), t.top_tok = dalloc<int64_t>(rows * K), t.lse = dalloc<float>(rows);
  t.part_keys = dalloc<uint64_t>(rows * t.splits * K), t.part_ms = dalloc<float>(rows * t.splits * 2);
  CK(kdb::tree_build_topk_launch(t, 0));
  std::vector<int32_t> budgets(B, sh.budget), past(B);
  std::vector<int64_t> roots(B);
  for (int b = 0; b < B; ++b) past[b] = 100 + 37 * b, roots[b] = 1000 + b;
  int32_t *d_budgets = dalloc<int32_t>(B), *d_past = dalloc<int32_t>(B);
  int64_t* d_roots = dalloc<int64_t>(B);
  CK(cudaMemcpy(d_budgets, budgets.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_past, past.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_roots, roots.data(), B * 8, cudaMemcpyHostToDevice));
  kdb::TreeBuildArgs a{t.top_lp, t.top_tok, d_budgets, d_roots, d_past, B, L, K, N, (N + 63) / 64};
  std::vector<kdb::TreeBuildArgs> args(kNV, a);
  std::vector<Out> outs;
  for (int i = 0; i < kNV; ++i) outs.push_back(make_out(args[i]));
  for (int i = 0; i < kNV; ++i) CK(kVariants[i].fn(args[i], 0));
  CK(cudaDeviceSynchronize());
  const Ref ref = reference(a);
  int fails = 0;
  for (int i = 0; i < kNV; ++i) fails += check(a, outs, ref, i);
  if (!once) {
    const std::vector<std::vector<float>> tm = time_all(args, flush, e0, e1);
    for (int i = 0; i < kNV; ++i) {
      const int bad = check(a, outs, ref, i);  // the outputs of the last timed launch
      fails += bad;
      std::fprintf(out, "{\"batch\": %d, \"budget\": %d, \"variant\": \"%s\", \"median_us\": %.2f, "
                   "\"p10_us\": %.2f, \"p90_us\": %.2f, \"exact\": %s}\n", B, sh.budget, kVariants[i].name,
                   quantile(tm[i], 0.5), quantile(tm[i], 0.1), quantile(tm[i], 0.9), bad ? "false" : "true");
      std::printf("B%-3d budget %-5d %-14s %8.2f us (p10 %.2f p90 %.2f)%s\n", B, sh.budget, kVariants[i].name,
                  quantile(tm[i], 0.5), quantile(tm[i], 0.1), quantile(tm[i], 0.9), bad ? "  MISMATCH" : "");
    }
    for (const Variant& v : kProfiled) profile(out, sh, a, v);
  }
  for (Out& o : outs) free_out(o);
  for (void* p : {(void*)logits, (void*)t.top_lp, (void*)t.top_tok, (void*)t.lse, (void*)t.part_keys,
                  (void*)t.part_ms, (void*)d_budgets, (void*)d_past, (void*)d_roots}) CK(cudaFree(p));
  std::fflush(out);
  return fails;
}
}  // namespace

int main(int argc, char** argv) {
  BenchCli c;
  if (!bench_cli_open(argc, argv, c)) return 2;
  int fails = 0;
  for (int si = c.first; si < int(sizeof(kShapes) / sizeof(kShapes[0])) && si < c.first + c.limit; ++si)
    fails += run_shape(kShapes[si], c.once, c.out, c.flush, c.e0, c.e1, si);
  std::fclose(c.out);
  std::printf("tree_build_builder_bench: %d mismatches\n", fails);
  return fails ? 1 : 0;
}
