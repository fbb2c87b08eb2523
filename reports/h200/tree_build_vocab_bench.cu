// tree_build vocabulary-pass variant bench, no torch (as kv_compact_bench.cu): the admission variants, prune
// marks and the sampled estimate of csrc/tree_build_vocab.h on the issue-16 shapes (L 15, V 163840, bf16 logits N(0, 3) and "rising"),
// every variant's top tokens checked exactly against a host sort (request 0) and against the shipped variant
// (every row, tokens and log-probs bit for bit) before and after timing; timed with CUDA events after a 256 MB
// L2-flush memset, variants alternating order between rounds (ABBA), next to the 1 GiB copy ceiling. s19: the
// block's final prune, sort and writes ("probe_no_final"); s22: a fixed threshold from the sampled estimate, one
// stream without barriers ("fixed*"); s23: its sample in segments, the end's radix sort, probes. Rows run in earlier
// sessions and since dropped (round 3's merge, PDL off, the s21 launcher, kBitsRank, the s22 aims, s23's deferred
// admission, value cut and other segment sizes) are in git.
// Build: nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc reports/h200/tree_build_vocab_bench.cu -o tvb
// Usage: tvb OUT.jsonl [SHAPES [FIRST]]: times SHAPES shapes from shape FIRST (all from 0 by default); SHAPES < 0:
// -SHAPES shapes, one checked launch per variant and no timing (for ncu). Inputs come from one generator seeded
// 2026 and drawn shape by shape, so a shape's logits depend on FIRST.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_env.h"
#include "tree_build.cu"  // kdb::launch_topk<T, VW, kAdmit, kMarkMin, kFix, kOpt>, launch_topk_shipped, the plan

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)
#include "bench_cli.h"

namespace {
using Launch = cudaError_t (*)(const kdb::TopkArgs&, cudaStream_t);

struct Variant { const char* name; Launch fn; };
namespace v = kdb::vocab;
template <int kAdmit, bool kFix, int kOpt = 0>
constexpr Launch topk = kdb::launch_topk<__nv_bfloat16, 8, kAdmit, 512, kFix, kOpt>;
// The launcher until s23: s22's fixed stream (scattered sample, bitonic end) and the bitonic end elsewhere. (At
// k >= 512 on blocks of < 8 vector chunks s22 took a sampled instantiation that could not sample there: 1.5-2 us
// slower at B 1 K 1024 than this unsampled one, s23 calls A-B.)
cudaError_t s22_shipped(const kdb::TopkArgs& a, cudaStream_t stream) {
  if (a.k <= kdb::kSmallKMax) return topk<v::kBitsRank, false>(a, stream);
  if (std::min(a.chunks_per_split, a.vocab / v::kChunk) >= v::kSampleMinChunks)
    return topk<v::kLane, true, v::kScatterSample | v::kBitonicSort>(a, stream);
  return topk<v::kLane, false, v::kBitonicSort>(a, stream);
}
const Variant kVariants[] = {  // [0] is the shipped one: every other variant is compared with it
    {"shipped", kdb::launch_topk_shipped<__nv_bfloat16, 8>},  // bits_rank/512 to k 64, fixed/lane above (s23)
    {"s22_shipped", s22_shipped},
    {"lane/512", topk<v::kLane, false>},  // with the radix-sorted end since s23
    {"probe", topk<v::kProbe, false>},    // admits nothing: not checked
    {"probe_no_final", topk<v::kLaneNoFinal, false>},  // lane/512 without its final prune, sort and writes (s19):
    // lane/512 minus it is that tail; not checked
    // s22: one stream with the sampled estimate as a fixed threshold (kFix; blocks of fewer than 8 vector chunks
    // take the exact stream at once); s23: its sample in 128-byte segments and the end's radix sort, each against
    // s22's (scattered sample, bitonic end), and probes (not checked): the fixed stream without the block's end, its
    // log-sum-exp alone (the sample and the stream: no admission, no barrier), the end without its sort. s23's
    // deferred admission (call A), 512 / 64-byte segments and the end by a value cut (calls B, C) are in git.
    {"fixed/scatter", topk<v::kLane, true, v::kScatterSample>},
    {"fixed/bitonic", topk<v::kLane, true, v::kBitonicSort>},
    {"fixed/pick_tree", topk<v::kLane, true, v::kPickTree>},  // s23, not yet timed: pick by a select tree
    {"probe_fix_no_end", topk<v::kLane, true, v::kFixNoEnd>},
    {"probe_fix_lse", topk<v::kLane, true, v::kFixNoAdmit | v::kFixNoEnd>},
    {"probe_fix_no_sort", topk<v::kLane, true, v::kNoSort>},
};
constexpr int kNV = sizeof(kVariants) / sizeof(kVariants[0]);
constexpr int L = 15, kRounds = 15;

struct Shape { int batch, k; bool rising; int vocab = 163840; };
const Shape kShapes[] = {{32, 256, false}, {32, 16, false}, {1, 64, false}, {8, 64, false}, {64, 16, false},
                         {32, 1024, false}, {1, 16, false}, {32, 256, true}, {32, 1024, true}, {64, 1024, false},
                         {32, 512, false}, {32, 128, false}, {8, 128, false}, {64, 128, false}, {64, 256, false},
                         {8, 256, false}, {8, 1024, false}, {1, 256, false}, {1, 1024, false}, {8, 16, false},
                         // s23: V 32000 (blocks of 7 vector chunks and a scalar tail: the kLane path, not kFix)
                         {32, 256, false, 32000}, {64, 256, false, 32000}, {32, 1024, false, 32000},
                         {8, 256, false, 32000}};

uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Top-k ids of one row in the reference order: value descending, then smaller id.
std::vector<int64_t> host_topk(const uint16_t* row, int V, int k) {
  std::vector<int> id(V);
  std::iota(id.begin(), id.end(), 0);
  std::partial_sort(id.begin(), id.begin() + k, id.end(), [&](int a, int b) {
    const float x = from_bf16(row[a]), y = from_bf16(row[b]);
    return x != y ? x > y : a < b;
  });
  return std::vector<int64_t>(id.begin(), id.begin() + k);
}

struct Buffers {  // one set per variant, so each variant's last timed outputs can be checked afterwards
  float *lp = nullptr, *lse = nullptr, *ms = nullptr;
  int64_t* tok = nullptr;
  uint64_t* part = nullptr;
};

// 0: ok; else prints what differs. Variant i's outputs against variant 0's (all rows) and the host (request 0).
int check(const kdb::TopkArgs& a, const std::vector<Buffers>& buf, const std::vector<std::vector<int64_t>>& ref, int i) {
  if (std::strncmp(kVariants[i].name, "probe", 5) == 0) return 0;  // a bound, not a kernel: its outputs are wrong
  const size_t n = size_t(a.rows) * a.k;
  std::vector<int64_t> t0(n), ti(n);
  std::vector<float> l0(n), li(n);
  CK(cudaMemcpy(t0.data(), buf[0].tok, n * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ti.data(), buf[i].tok, n * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(l0.data(), buf[0].lp, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(li.data(), buf[i].lp, n * 4, cudaMemcpyDeviceToHost));
  for (int r = 0; r < L; ++r)
    for (int j = 0; j < a.k; ++j)
      if (ti[size_t(r) * a.k + j] != ref[r][j]) return std::printf("  %s: row %d slot %d token %lld, host %lld\n",
          kVariants[i].name, r, j, (long long)ti[size_t(r) * a.k + j], (long long)ref[r][j]), 1;
  if (t0 != ti) return std::printf("  %s: tokens differ from shipped\n", kVariants[i].name), 1;
  // Every variant computes the same sums in the same order: log-probs bit for bit.
  for (size_t j = 0; j < n; ++j)
    if (!(l0[j] == li[j])) return std::printf("  %s: log-prob %zu differs from shipped by %g\n", kVariants[i].name, j,
                                              double(l0[j] - li[j])), 1;
  return 0;
}

// Copy ceiling: 2 x 1 GiB / t of a device copy (read + write), best of 5.
double copy_bytes_per_s(cudaEvent_t e0, cudaEvent_t e1) {
  void *src, *dst;
  CK(cudaMalloc(&src, 1 << 30));
  CK(cudaMalloc(&dst, 1 << 30));
  float best = 1e9f, ms;
  for (int i = 0; i < 5; ++i) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpy(dst, src, 1 << 30, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return 2.0 * (1 << 30) / (best * 1e-3);
}

// bf16 logits [rows, V]: N(0, 3), or rising (ascending in the id, small noise).
std::vector<uint16_t> make_logits(const Shape& sh, int64_t rows, std::mt19937& gen) {
  std::normal_distribution<float> nd(0.f, 3.f);
  const int V = sh.vocab;
  std::vector<uint16_t> host(size_t(rows) * V);
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < V; ++v) host[size_t(r) * V + v] = to_bf16(sh.rising ? -8.f + 16.f * v / V + 0.01f * nd(gen) / 3.f : nd(gen));
  return host;
}

// Each variant's outputs and work buffers, poisoned, and one launch of each.
void launch_all(const kdb::TopkArgs& a, std::vector<Buffers>& buf, std::vector<kdb::TopkArgs>& args) {
  const int64_t rows = a.rows, k = a.k;
  for (int i = 0; i < kNV; ++i) {
    CK(cudaMalloc(&buf[i].lp, rows * k * 4));
    CK(cudaMalloc(&buf[i].tok, rows * k * 8));
    CK(cudaMalloc(&buf[i].lse, rows * 4));
    CK(cudaMalloc(&buf[i].part, rows * a.splits * k * 8));
    CK(cudaMalloc(&buf[i].ms, rows * a.splits * 8));
    CK(cudaMemset(buf[i].tok, 0xff, rows * k * 8));  // poison: an unwritten slot reads as token -1
    CK(cudaMemset(buf[i].lp, 0xff, rows * k * 4));
    args[i].top_lp = buf[i].lp, args[i].top_tok = buf[i].tok, args[i].lse = buf[i].lse;
    args[i].part_keys = buf[i].part, args[i].part_ms = buf[i].ms;
    CK(kVariants[i].fn(args[i], 0));
  }
  CK(cudaDeviceSynchronize());
}

// Per variant, kRounds samples (us): time_abba (bench_cli.h).
std::vector<std::vector<float>> time_all(const std::vector<kdb::TopkArgs>& args, void* flush, cudaEvent_t e0,
                                         cudaEvent_t e1) {
  return time_abba(kNV, kRounds, flush, e0, e1, [&](int i) { return kVariants[i].fn(args[i], 0); });
}

void report(FILE* out, const Shape& sh, const kdb::TopkArgs& a, int i, const std::vector<float>& t, int bad) {
  const char* kind = sh.rising ? "rising" : "normal";
  std::fprintf(out, "{\"batch\": %d, \"k\": %d, \"logits\": \"%s\", \"splits\": %d, \"variant\": \"%s\", "
               "\"median_us\": %.2f, \"p10_us\": %.2f, \"p90_us\": %.2f, \"bytes\": %lld, \"exact\": %s, "
               "\"vocab\": %d}\n",
               sh.batch, sh.k, kind, a.splits, kVariants[i].name, quantile(t, 0.5), quantile(t, 0.1), quantile(t, 0.9),
               (long long)(a.rows * sh.vocab * 2), bad ? "false" : "true", sh.vocab);
  std::printf("B%-3d K%-5d %-7s splits %-3d %-12s %8.2f us (p10 %.2f p90 %.2f)%s%s\n", sh.batch, sh.k, kind, a.splits,
              kVariants[i].name, quantile(t, 0.5), quantile(t, 0.1), quantile(t, 0.9), bad ? "  MISMATCH" : "",
              sh.vocab == 163840 ? "" : (" V" + std::to_string(sh.vocab)).c_str());
}

// One shape: logits, host reference (request 0), check, time, check again, report; returns mismatches.
int run_shape(const Shape& sh, bool once, FILE* out, void* flush, cudaEvent_t e0, cudaEvent_t e1, std::mt19937& gen) {
  const int64_t rows = int64_t(sh.batch) * L;
  const std::vector<uint16_t> host = make_logits(sh, rows, gen);
  std::vector<std::vector<int64_t>> ref(L);
  for (int r = 0; r < L; ++r) ref[r] = host_topk(host.data() + size_t(r) * sh.vocab, sh.vocab, sh.k);
  void* logits;
  CK(cudaMalloc(&logits, host.size() * 2));
  CK(cudaMemcpy(logits, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  kdb::TopkArgs a{logits, kdb::LogitDtype::kBF16, rows, sh.vocab, sh.k, nullptr, nullptr, nullptr};
  CK(kdb::tree_build_topk_plan(a, 0, 0));
  std::vector<Buffers> buf(kNV);
  std::vector<kdb::TopkArgs> args(kNV, a);
  launch_all(a, buf, args);
  int fails = 0;
  for (int i = 0; i < kNV; ++i) fails += check(a, buf, ref, i);
  if (!once) {
    const std::vector<std::vector<float>> t = time_all(args, flush, e0, e1);
    for (int i = 0; i < kNV; ++i) {
      const int bad = check(a, buf, ref, i);  // the outputs of the last timed launch
      fails += bad;
      report(out, sh, a, i, t[i], bad);
    }
  }
  for (Buffers& b : buf) {  // after every check: each reads the shipped variant's buffers
    CK(cudaFree(b.lp));
    CK(cudaFree(b.tok));
    CK(cudaFree(b.lse));
    CK(cudaFree(b.part));
    CK(cudaFree(b.ms));
  }
  std::fflush(out);
  CK(cudaFree(logits));
  return fails;
}
}  // namespace

int main(int argc, char** argv) {
  BenchCli c;
  if (!bench_cli_open(argc, argv, c)) return 2;
  std::fprintf(c.out, "{\"copy_bytes_per_s\": %.6e}\n", copy_bytes_per_s(c.e0, c.e1));
  int fails = 0;
  std::mt19937 gen(2026);
  for (int si = c.first; si < int(sizeof(kShapes) / sizeof(kShapes[0])) && si < c.first + c.limit; ++si)
    fails += run_shape(kShapes[si], c.once, c.out, c.flush, c.e0, c.e1, gen);
  std::fclose(c.out);
  std::printf("tree_build_vocab_bench: %d mismatches\n", fails);
  return fails ? 1 : 0;
}
