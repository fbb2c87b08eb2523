// kv_compact variant bench, no torch (llm.c dev/cuda style): every variant checked bit-exact against an
// out-of-place device reference on fresh random bits, then timed with CUDA events (L2 flush + launch shield,
// as suite/timing.py) next to a cudaMemcpy of the same bytes and the 1 GiB copy ceiling, in one process.
// Two more views of the same cases: "read_flush" (memcpy_same_bytes, prod and vector = prod's vector kernel before
// the s16 bulk path, single launch, after a flush that leaves L2 clean: the A/B for the dirty-L2 cost of the memset
// flush) and "graph" (per launch in one CUDA graph of 16 launches on 16 cache copies, as the engine replays its
// step: the host launch cost amortized; every bulk_ shape of kVariants is timed there too, and every kernel graph is
// replayed on fresh bits and checked after the timing).
// Build: nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc reports/h200/kv_compact_bench.cu -o kvb
// Usage: kvb check | sanitize (small shapes, for compute-sanitizer) | time OUT.json
// OUT.json: {copy_bytes_per_s, cases: [{batch, moved_rows_per_layer, bytes_moved, floor_s, rows: {NAME: ROW},
//   read_flush: {rows: {memcpy_same_bytes, prod, vector}}, graph: {replicas, rows: {prod, memcpy_same_bytes,
//   empty_kernel, vector, bulk_*}}}]}, ROW = {median_s, p10_s, p90_s, min_s, pct_of_floor_rate} (graph: per launch).
// Exit code: 1 if any bit-exact check fails (check, or time's checks after timing).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_env.h"
#include "kv_compact.cu"  // kdb::kv_compact_launch, the production launcher, and kv_compact_kernel.h

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

namespace {
using kdb::KvCompactArgs;
using Launch = cudaError_t (*)(const KvCompactArgs&, cudaStream_t);

// ---- the kernel before this change (commit 0d6511e), kept as the baseline --------------------------
template <typename Vec>
__global__ void __launch_bounds__(256) old_kernel(KvCompactArgs a, int vecs_per_row) {
  const int64_t t = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (t >= int64_t(a.layers) * a.batch * vecs_per_row) return;
  const int col = int(t % vecs_per_row);
  const int64_t lb = t / vecs_per_row;
  const int b = int(lb % a.batch);
  const int past = __ldg(a.past_lens + b), len = min(__ldg(a.accept_len + b), a.width);
  const int32_t* acc = a.accepted + int64_t(b) * a.width;
  Vec* rows = reinterpret_cast<Vec*>(a.cache) + lb * a.seq * vecs_per_row + col;
  for (int k0 = 0; k0 < len; k0 += 8) {
    Vec v[8];
    bool move[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int k = k0 + j, src = k < len ? __ldg(acc + k) : k;
      move[j] = src != k && src >= 0 && past + src < a.seq && past + k < a.seq;
      if (move[j]) v[j] = rows[int64_t(past + src) * vecs_per_row];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (move[j]) rows[int64_t(past + k0 + j) * vecs_per_row] = v[j];
  }
}

template <typename Vec>
cudaError_t old_as(const KvCompactArgs& a, cudaStream_t s) {
  const int vecs = int(int64_t(a.dim) * a.element_bytes / sizeof(Vec));
  const int64_t total = int64_t(a.layers) * a.batch * vecs;
  old_kernel<Vec><<<unsigned((total + 255) / 256), 256, 0, s>>>(a, vecs);
  return cudaGetLastError();
}

// Widest vector that divides the rows and the base, as the production launcher does.
template <template <typename> class F>
cudaError_t by_vector(const KvCompactArgs& a, cudaStream_t s) {
  const int64_t rb = int64_t(a.dim) * a.element_bytes;
  const uintptr_t p = reinterpret_cast<uintptr_t>(a.cache);
  if (rb % 16 == 0 && p % 16 == 0) return F<uint4>::go(a, s);
  if (rb % 8 == 0 && p % 8 == 0) return F<uint2>::go(a, s);
  if (rb % 4 == 0 && p % 4 == 0) return F<uint32_t>::go(a, s);
  return F<uint16_t>::go(a, s);
}
template <typename V> struct Old { static cudaError_t go(const KvCompactArgs& a, cudaStream_t s) { return old_as<V>(a, s); } };
template <int C, int G, bool S = false> struct New {
  template <typename V> struct F { static cudaError_t go(const KvCompactArgs& a, cudaStream_t s) {
    return kdb::kv_compact_launch_as<V, C, G, S>(a, s); } };
};
// Persistent: as many CTAs as fit at once (one resident wave), striding over the (request, chunk) ids.
template <int C, int G> struct Persistent {
  template <typename V> struct F { static cudaError_t go(const KvCompactArgs& a, cudaStream_t s) {
    static int64_t resident = 0;
    if (resident == 0) {
      int per_sm = 0, sms = 0;
      const kdb::KvCompactGeometry g = kdb::kv_compact_geometry(a, int(sizeof(V)), C);
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kdb::kv_compact_kernel<V, C, G, false>, g.threads, 0));
      CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      resident = int64_t(per_sm) * sms;
    }
    return kdb::kv_compact_launch_as<V, C, G, false>(a, s, resident); } };
};

const Launch kVector = by_vector<New<1, 16, true>::F>;  // the launcher's vector kernel (off sm_90, KDB_KVC_BULK=0)

// The bulk path with L layers per CTA, R rows per batch and S stages where the rows allow it (else the vector kernel,
// as the launcher does); R = 40 is one 45 KB batch (the s16 shape: 4 CTAs per SM), smaller R lets more CTAs reside.
template <int L, int R, int S, bool kLateIndex = false> struct Bulk {
  static cudaError_t go(const KvCompactArgs& a, cudaStream_t s) {
    return kdb::kv_bulk_fits(a) ? kdb::kv_compact_bulk_launch(a, s, {L, R, S, kLateIndex}) : kVector(a, s);
  }
};

// F with KDB_PDL=0 (read at every launch, so also at graph capture): plain stream order, the PDL A/B.
template <Launch F> cudaError_t no_pdl(const KvCompactArgs& a, cudaStream_t s) {
  return with_env("KDB_PDL", "0", [&] { return F(a, s); });
}

struct Variant { const char* name; Launch fn; };
const Variant kVariants[] = {
    {"old", by_vector<Old>},
    {"prod", kdb::kv_compact_launch},  // the bulk path on sm_90 since s16 (its own shape); c1g16cs is its vector kernel
    {"prod_no_pdl", no_pdl<kdb::kv_compact_launch>},  // every prod_ and bulk_ row is timed in the graph view as well
    {"c1g8", by_vector<New<1, 8>::F>},
    {"c1g16", by_vector<New<1, 16>::F>},
    {"c2g4", by_vector<New<2, 4>::F>},
    {"c1g16cs", kVector},
    {"c1g16persist", by_vector<Persistent<1, 16>::F>},
    // the s16-s17 launcher (2 layers, 40 rows, indices after accept_len, plain order); s18: 1 layer, 16 rows, early
    // indices, PDL (= bulk_l1_r16_s1); _late: indices after accept_len; _no_pdl: plain stream order
    {"bulk_l2_r40_s1_late_no_pdl", no_pdl<Bulk<2, 40, 1, true>::go>},
    {"bulk_l1_r16_s1_late_no_pdl", no_pdl<Bulk<1, 16, 1, true>::go>},
    {"bulk_l1_r16_s1_late", Bulk<1, 16, 1, true>::go},
    {"bulk_l2_r40_s1", Bulk<2, 40, 1>::go},
    {"bulk_l2_r16_s1", Bulk<2, 16, 1>::go},
    {"bulk_l1_r16_s1", Bulk<1, 16, 1>::go},
    {"bulk_l1_r8_s1", Bulk<1, 8, 1>::go},
    {"bulk_l1_r4_s2", Bulk<1, 4, 2>::go},
};

// ---- inputs ------------------------------------------------------------------------------------------
struct Shape { const char* kind; int layers, batch, dim, elem, width, nodes, max_past, misalign; uint64_t seed; };
struct Inputs {
  Shape s;
  int seq;
  std::vector<int32_t> past, acc, lens;  // [B], [B, width], [B]
};

// kind: "scen" = the scenario's make_inputs (k uniform 1..width, sorted random rows, every 4th request in
// place); "chain" acc[k] = k + 1 (each source is the next destination); "double" acc[k] = 2k; "none" all in
// place; "skip": rows past the cache, a negative past, accept_len > width (the kernel skips those moves).
Inputs make(const Shape& s) {
  std::mt19937_64 rng(s.seed);
  Inputs in{s, 0, std::vector<int32_t>(s.batch), std::vector<int32_t>(size_t(s.batch) * s.width, -1),
            std::vector<int32_t>(s.batch)};
  const std::string kind = s.kind;
  int maxp = 0;
  for (int b = 0; b < s.batch; ++b) {
    in.past[b] = 1 + int(rng() % s.max_past);
    maxp = std::max(maxp, in.past[b]);
    int k = 1 + int(rng() % std::min(s.width, s.nodes));
    if (kind != "scen") k = std::min(s.width, kind == "double" ? (s.nodes + 1) / 2 : s.nodes);
    std::vector<int> rows(size_t(s.nodes - 1));
    for (int i = 0; i < s.nodes - 1; ++i) rows[i] = i + 1;
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(k - 1);
    std::sort(rows.begin(), rows.end());
    for (int j = 0; j < k - 1; ++j) {
      if (kind == "chain") rows[j] = j + 2;
      if (kind == "double") rows[j] = 2 * (j + 1);
      if (kind == "none" || (kind == "scen" && b % 4 == 1)) rows[j] = j + 1;
    }
    in.acc[size_t(b) * s.width] = 0;
    for (int j = 0; j < k - 1; ++j) in.acc[size_t(b) * s.width + j + 1] = rows[j];
    in.lens[b] = k;
  }
  in.seq = maxp + s.nodes + 3;
  if (kind == "skip") {  // request 0: sources beyond the cache; 1: past < 0; 2: accept_len > width
    in.past[0] = in.seq - s.nodes / 2;
    if (s.batch > 1) in.past[1] = -1;
    if (s.batch > 2) in.lens[2] = s.width + 7;
  }
  return in;
}

bool moves(const Inputs& in, int b, int k) {
  const int len = std::min(in.lens[b], in.s.width), past = in.past[b];
  const int src = k < len ? in.acc[size_t(b) * in.s.width + k] : k;
  return k < len && src != k && src >= 0 && past >= 0 && src < in.seq - past && k < in.seq - past;
}

int64_t moved_rows(const Inputs& in) {  // per layer
  int64_t m = 0;
  for (int b = 0; b < in.s.batch; ++b)
    for (int k = 0; k < in.s.width; ++k) m += moves(in, b, k);
  return m;
}

// ---- device side: data, reference, compare -----------------------------------------------------------
__global__ void fill_bits(uint8_t* p, int64_t n, uint64_t seed) {  // splitmix64 bytes
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) >> 3) + seed * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; z ^= z >> 31;
    p[i] = uint8_t(z >> (8 * (i & 7)));
  }
}

// Out-of-place reference: out = orig, then out[past + k] = orig[past + accepted[k]] for every moved k.
__global__ void reference(const uint8_t* orig, uint8_t* out, KvCompactArgs a, int64_t row_bytes) {
  const int64_t r = blockIdx.x;  // over layers * batch * width
  const int k = int(r % a.width);
  const int64_t lb = r / a.width;
  const int b = int(lb % a.batch), len = min(a.accept_len[b], a.width), past = a.past_lens[b];
  const int src = k < len ? a.accepted[int64_t(b) * a.width + k] : k;
  if (!(k < len && src != k && src >= 0 && past >= 0 && src < a.seq - past && k < a.seq - past)) return;
  const uint8_t* s = orig + (lb * a.seq + past + src) * row_bytes;
  uint8_t* d = out + (lb * a.seq + past + k) * row_bytes;
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
}

__global__ void count_diff(const uint8_t* x, const uint8_t* y, int64_t n, unsigned long long* bad) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    c += x[i] != y[i];
  if (c) atomicAdd(bad, c);
}

unsigned long long diff_bytes(const uint8_t* x, const uint8_t* y, int64_t n) {  // bytes that differ
  unsigned long long *d, h = 0;
  CK(cudaMalloc(&d, 8)); CK(cudaMemset(d, 0, 8));
  count_diff<<<1024, 256>>>(x, y, n, d);
  CK(cudaMemcpy(&h, d, 8, cudaMemcpyDeviceToHost)); CK(cudaFree(d));
  return h;
}

struct Device {  // one shape's buffers: cache (+ misalignment offset), pristine copy, reference, indices
  Inputs in;
  KvCompactArgs a{};
  uint8_t *raw = nullptr, *orig = nullptr, *want = nullptr;
  int64_t bytes = 0, row_bytes = 0;
  int32_t* idx = nullptr;
  explicit Device(const Inputs& i) : in(i) {
    const Shape& s = in.s;
    row_bytes = int64_t(s.dim) * s.elem;
    bytes = int64_t(s.layers) * s.batch * in.seq * row_bytes;
    CK(cudaMalloc(&raw, bytes + 16)); CK(cudaMalloc(&orig, bytes)); CK(cudaMalloc(&want, bytes));
    CK(cudaMalloc(&idx, sizeof(int32_t) * (2 * s.batch + in.acc.size())));
    CK(cudaMemcpy(idx, in.past.data(), 4 * s.batch, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(idx + s.batch, in.lens.data(), 4 * s.batch, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(idx + 2 * s.batch, in.acc.data(), 4 * in.acc.size(), cudaMemcpyHostToDevice));
    a = KvCompactArgs{raw + s.misalign, s.elem, s.layers, s.batch, in.seq, s.dim, idx, idx + 2 * s.batch,
                      idx + s.batch, s.width};
  }
  ~Device() { cudaFree(raw); cudaFree(orig); cudaFree(want); cudaFree(idx); }
  void reset(uint64_t seed) {  // fresh bits, rows past each tree poisoned (0xff: NaN in bf16 and f32)
    fill_bits<<<1024, 256>>>(orig, bytes, seed);
    for (int l = 0; l < in.s.layers; ++l)
      for (int b = 0; b < in.s.batch; ++b) {
        const int64_t first = std::max(0, in.past[b] + in.s.nodes);
        if (first < in.seq)
          CK(cudaMemset(orig + ((int64_t(l) * in.s.batch + b) * in.seq + first) * row_bytes, 0xff,
                        (in.seq - first) * row_bytes));
      }
    CK(cudaMemcpy(static_cast<uint8_t*>(a.cache), orig, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(want, orig, bytes, cudaMemcpyDeviceToDevice));
    reference<<<unsigned(int64_t(in.s.layers) * in.s.batch * in.s.width), 128>>>(orig, want, a, row_bytes);
    CK(cudaGetLastError());
  }
  unsigned long long diff() const { return diff_bytes(static_cast<uint8_t*>(a.cache), want, bytes); }
};

// ---- check -------------------------------------------------------------------------------------------
std::vector<Shape> check_shapes(bool small) {
  std::vector<Shape> v = {
      {"scen", 3, 5, 576, 2, 16, 65, 16, 0, 11},   {"scen", 61, 2, 576, 2, 16, 65, 16, 0, 12},
      {"scen", 1, 1, 576, 2, 16, 65, 16, 0, 13},   {"chain", 5, 3, 576, 2, 16, 65, 4097, 0, 14},
      {"double", 2, 3, 576, 4, 16, 65, 8, 0, 15},  {"none", 2, 4, 576, 2, 16, 65, 8, 0, 16},
      {"scen", 2, 5, 7, 4, 16, 30, 8, 0, 17},      {"scen", 2, 4, 3, 2, 16, 30, 8, 0, 18},
      {"scen", 3, 3, 576, 2, 16, 65, 8, 2, 19},    {"scen", 1, 3, 64, 4, 1025, 1100, 8, 0, 20},
      {"chain", 1, 2, 64, 4, 1025, 1100, 8, 0, 21}, {"scen", 2, 3, 8192, 2, 16, 40, 8, 0, 22},
      {"skip", 3, 4, 576, 2, 16, 65, 8, 0, 23},    {"skip", 2, 3, 7, 4, 40, 60, 8, 0, 24},
  };
  if (!small) {
    v.push_back({"scen", 61, 64, 576, 2, 16, 65, 16, 0, 25});
    v.push_back({"scen", 61, 128, 576, 2, 16, 65, 16, 0, 26});
  }
  return v;
}

int check(bool small) {
  int failures = 0;
  for (const Shape& s : check_shapes(small)) {
    Device dev(make(s));
    for (const Variant& v : kVariants) {
      if (std::string(v.name) == "old" && std::string(s.kind) == "skip") continue;  // old: no past < 0 guard
      for (int trial = 0; trial < 2; ++trial) {
        dev.reset(s.seed * 1000 + trial);
        CK(v.fn(dev.a, nullptr));
        CK(cudaDeviceSynchronize());
        const unsigned long long bad = dev.diff();
        failures += bad != 0;
        if (bad || trial == 0)
          std::printf("%-6s %-6s L%d B%d D%d e%d W%d N%d mis%d moved/layer %lld trial %d: %s (%llu bytes differ)\n",
                      v.name, s.kind, s.layers, s.batch, s.dim, s.elem, s.width, s.nodes, s.misalign,
                      (long long)moved_rows(dev.in), trial, bad ? "FAIL" : "ok", bad);
      }
    }
  }
  std::printf("check: %d failures\n", failures);
  return failures != 0;
}

// ---- timing ------------------------------------------------------------------------------------------
__global__ void spin(long long cycles) { const long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
__global__ void empty_kernel() {}

// Reads n 16-byte vectors into a register sum; the store under a test that (practically) never holds keeps the
// loads alive. The lines it leaves in L2 are clean, where a memset leaves dirty ones.
__global__ void read_all(const uint4* p, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc += p[i].x + p[i].y + p[i].z + p[i].w;
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// The L2 flush before each timed sample. memset: 2 x L2 of writes, as suite/timing.py; it leaves ~L2-size of
// dirty lines, which the timed call's first allocations must write back. read: the same memset, then a read of
// another 2 x L2 buffer: the read pass writes back whatever dirty lines were in L2 (the memset's), so the timed
// call starts with a clean L2. (A read of the memset's own buffer could hit its surviving dirty lines.)
enum class Flush { none, memset, read };
struct Flusher {
  static constexpr int kBlocks = 2048;
  Flush kind;
  size_t n = 0;  // bytes per buffer (2 x L2)
  uint8_t *wbuf = nullptr, *rbuf = nullptr;  // memset, read
  unsigned* sink = nullptr;
  explicit Flusher(Flush k) : kind(k) {
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    n = 2 * size_t(l2);
    if (kind != Flush::none) CK(cudaMalloc(&wbuf, n));
    if (kind == Flush::read) {
      CK(cudaMalloc(&rbuf, n)); CK(cudaMemset(rbuf, 0, n)); CK(cudaMalloc(&sink, 4 * kBlocks));
    }
  }
  ~Flusher() { cudaFree(wbuf); cudaFree(rbuf); cudaFree(sink); }
  void operator()(int r, cudaStream_t s) const {
    if (kind != Flush::none) CK(cudaMemsetAsync(wbuf, r & 0xff, n, s));
    if (kind == Flush::read) read_all<<<kBlocks, 256, 0, s>>>(reinterpret_cast<const uint4*>(rbuf), n / 16, sink);
    CK(cudaGetLastError());
  }
};

struct Stats { double median, p10, p90, min; };
Stats stats(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  auto q = [&](double f) { return 1e-3 * ms[size_t(f * (ms.size() - 1) + 0.5)]; };
  return {q(0.5), q(0.1), q(0.9), 1e-3 * ms[0]};
}

// Times each contender round-robin: per sample the L2 flush (Flusher), the launch shield (a 200k-cycle spin),
// then events around the call, all on stream s (the stream the contenders use). Returns seconds per contender.
template <typename Fn>
std::vector<Stats> time_all(const std::vector<Fn>& fns, int warmup, int repeat, Flush flush,
                            cudaStream_t s = nullptr) {
  const Flusher flusher(flush);
  std::vector<std::vector<float>> ms(fns.size());
  std::vector<cudaEvent_t> ev(2 * fns.size());
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int r = 0; r < warmup + repeat; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) {
      flusher(r, s);
      spin<<<1, 1, 0, s>>>(200000);
      CK(cudaEventRecord(ev[2 * i], s));
      fns[i]();
      CK(cudaEventRecord(ev[2 * i + 1], s));
    }
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < fns.size() && r >= warmup; ++i) {
      float t;
      CK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
      ms[i].push_back(t);
    }
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::vector<Stats> out;
  for (auto& m : ms) out.push_back(stats(m));
  return out;
}

double copy_ceiling() {  // as suite/timing.py: 1 GiB each way, no flush, median of 10; bytes read + written
  const size_t n = size_t(1) << 30;
  uint8_t *x, *y;
  CK(cudaMalloc(&x, n)); CK(cudaMalloc(&y, n)); CK(cudaMemset(x, 1, n));
  std::vector<std::function<void()>> f = {[&] { CK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice)); }};
  const Stats s = time_all(f, 3, 10, Flush::none)[0];
  CK(cudaFree(x)); CK(cudaFree(y));
  return 2.0 * n / s.median;
}

// One JSON row per contender (seconds) and one printed line each; tag prefixes the printed name only.
void emit_rows(FILE* out, int batch, const std::string& tag, const std::vector<std::string>& names,
               const std::vector<Stats>& st, double floor) {
  for (size_t i = 0; i < st.size(); ++i) {
    std::fprintf(out, "%s\"%s\": {\"median_s\": %.4e, \"p10_s\": %.4e, \"p90_s\": %.4e, \"min_s\": %.4e, "
                 "\"pct_of_floor_rate\": %.2f}", i ? ", " : "", names[i].c_str(), st[i].median, st[i].p10,
                 st[i].p90, st[i].min, 100 * floor / st[i].median);
    std::printf("B %3d  %-18s median %6.2f us  (p10 %6.2f, p90 %6.2f)  floor %5.2f us = %5.1f %%\n", batch,
                (tag + names[i]).c_str(), st[i].median * 1e6, st[i].p10 * 1e6, st[i].p90 * 1e6, floor * 1e6,
                100 * floor / st[i].median);
  }
}

// Read-flush A/B of the dirty-L2 hypothesis: the single-launch memcpy_same_bytes and prod, flushed clean.
void time_read_flush(Device& dev, double bytes, double floor, FILE* out) {
  const std::vector<std::string> names = {"memcpy_same_bytes", "prod", "vector"};
  const std::vector<std::function<void()>> fns = {
      [&] { CK(cudaMemcpyAsync(dev.want, dev.orig, size_t(bytes / 2), cudaMemcpyDeviceToDevice)); },
      [&] { CK(kdb::kv_compact_launch(dev.a, nullptr)); },
      [&] { CK(kVector(dev.a, nullptr)); }};
  std::fprintf(out, ", \"read_flush\": {\"rows\": {");
  emit_rows(out, dev.in.s.batch, "read_flush/", names, time_all(fns, 3, 30, Flush::read), floor);
  std::fprintf(out, "}}");
}

// ---- graph-amortized timing: R launches in one graph, each on its own buffers (cold in L2) ---------------
constexpr int kReplicas = 16;

struct Replica { uint8_t *raw, *src, *dst; KvCompactArgs a; };  // own cache bytes, dev's shape and indices
struct Replicas {  // R caches and R src/dst pairs of copy_bytes each; freed with the struct
  std::vector<Replica> r;
  size_t copy_bytes;
  Replicas(const Device& dev, size_t cb) : r(kReplicas, Replica{nullptr, nullptr, nullptr, dev.a}), copy_bytes(cb) {
    for (Replica& x : r) {
      CK(cudaMalloc(&x.raw, dev.bytes + 16)); CK(cudaMalloc(&x.src, cb)); CK(cudaMalloc(&x.dst, cb));
      CK(cudaMemset(x.src, 1, cb));
      x.a.cache = x.raw + dev.in.s.misalign;
    }
    refill(dev);
    std::printf("B %3d  graph: %d cache copies of %.1f MB, %d copy pairs of %.1f MB\n", dev.in.s.batch, kReplicas,
                dev.bytes * 1e-6, kReplicas, cb * 1e-6);
  }
  ~Replicas() { for (Replica& x : r) { cudaFree(x.raw); cudaFree(x.src); cudaFree(x.dst); } }
  void refill(const Device& dev) const {  // dev's pristine bits into every copy
    for (const Replica& x : r) CK(cudaMemcpy(x.a.cache, dev.orig, dev.bytes, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());  // a D2D cudaMemcpy may return early, and s does not wait for the legacy stream
  }
};

// Captures node(0..R-1), each of which enqueues on the capturing stream s, back to back into one graph.
cudaGraphExec_t capture(cudaStream_t s, const std::function<void(int)>& node) {
  cudaGraph_t g;
  cudaGraphExec_t e;  // kernel nodes keep their arguments by value: each node's own cache pointer
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kReplicas; ++i) node(i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  return e;
}

// The graph rows that write no cache, so have nothing to check.
bool writes_no_cache(const std::string& name) { return name == "memcpy_same_bytes" || name == "empty_kernel"; }

// After the timing, for every graph that compacts: fresh bits in every copy and one replay, each copy must equal the
// reference; then the production launcher once on copy 0 outside the graph. Returns the failed checks.
int check_graph(Device& dev, const Replicas& rep, const std::vector<std::string>& names,
                const std::vector<cudaGraphExec_t>& g, cudaStream_t s) {
  int failures = 0;
  for (size_t k = 0; k < g.size(); ++k) {
    if (writes_no_cache(names[k])) continue;
    dev.reset(9 + k);
    rep.refill(dev);
    CK(cudaGraphLaunch(g[k], s));
    CK(cudaStreamSynchronize(s));
    int bad = 0;
    for (const Replica& x : rep.r) bad += diff_bytes(static_cast<uint8_t*>(x.a.cache), dev.want, dev.bytes) != 0;
    std::printf("B %3d  graph replay %-16s %s (%d of %d copies differ)\n", dev.in.s.batch, names[k].c_str(),
                bad ? "FAIL" : "ok", bad, kReplicas);
    failures += bad;
  }
  CK(cudaMemcpy(rep.r[0].a.cache, dev.orig, dev.bytes, cudaMemcpyDeviceToDevice));
  CK(cudaDeviceSynchronize());
  CK(kdb::kv_compact_launch(rep.r[0].a, s));
  CK(cudaStreamSynchronize(s));
  const bool bad0 = diff_bytes(static_cast<uint8_t*>(rep.r[0].a.cache), dev.want, dev.bytes) != 0;
  std::printf("B %3d  prod on copy 0: %s\n", dev.in.s.batch, bad0 ? "FAIL" : "ok");
  return failures + bad0;
}

// Per launch = replay / R, timed as time_all (memset flush and spin before each replay, so its first node starts
// cold; the graph launch and the events are spread over R). The replays need no re-fill: which rows move depends
// only on the index arrays, so every replay moves the same bytes (the rows just hold the last replay's bits).
int time_graph(Device& dev, double bytes, double floor, FILE* out) {
  const Replicas rep(dev, size_t(bytes / 2));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::string> names = {"prod", "memcpy_same_bytes", "empty_kernel", "vector"};
  std::vector<cudaGraphExec_t> g = {
      capture(s, [&](int i) { CK(kdb::kv_compact_launch(rep.r[i].a, s)); }),
      capture(s, [&](int i) {
        CK(cudaMemcpyAsync(rep.r[i].dst, rep.r[i].src, rep.copy_bytes, cudaMemcpyDeviceToDevice, s)); }),
      capture(s, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); CK(cudaGetLastError()); }),
      capture(s, [&](int i) { CK(kVector(rep.r[i].a, s)); })};
  for (const Variant& v : kVariants) {  // the bulk shapes and prod's A/B rows, where the engine runs them
    const std::string name = v.name;
    if (name.rfind("bulk_", 0) != 0 && name.rfind("prod_", 0) != 0) continue;
    names.push_back(v.name);
    g.push_back(capture(s, [&rep, s, fn = v.fn](int i) { CK(fn(rep.r[i].a, s)); }));
  }
  std::vector<std::function<void()>> fns;
  for (cudaGraphExec_t e : g) fns.push_back([e, s] { CK(cudaGraphLaunch(e, s)); });
  std::vector<Stats> st = time_all(fns, 3, 20, Flush::memset, s);
  for (Stats& x : st) x = {x.median / kReplicas, x.p10 / kReplicas, x.p90 / kReplicas, x.min / kReplicas};
  std::fprintf(out, ", \"graph\": {\"replicas\": %d, \"rows\": {", kReplicas);
  emit_rows(out, dev.in.s.batch, "graph/", names, st, floor);
  std::fprintf(out, "}}");
  const int failures = check_graph(dev, rep, names, g, s);
  for (cudaGraphExec_t e : g) CK(cudaGraphExecDestroy(e));
  CK(cudaStreamDestroy(s));
  return failures;
}

int time_main(const char* out_path) {
  const double ceiling = copy_ceiling();
  FILE* out = std::fopen(out_path, "w");
  if (!out) { std::perror(out_path); return 2; }
  std::fprintf(out, "{\"copy_bytes_per_s\": %.6e, \"cases\": [", ceiling);
  std::printf("copy ceiling (1 GiB, read + written): %.1f GB/s\n", ceiling * 1e-9);
  const int batches[] = {8, 64, 128};
  int failures = 0;
  for (int bi = 0; bi < 3; ++bi) {
    Device dev(make({"scen", 61, batches[bi], 576, 2, 16, 65, 16, 0, uint64_t(700 + bi)}));
    dev.reset(7);
    const double bytes = 2.0 * dev.in.s.layers * moved_rows(dev.in) * dev.row_bytes;  // read + written
    const double floor = bytes / ceiling;
    std::vector<std::string> names = {"empty_kernel", "memcpy_same_bytes"};
    std::vector<std::function<void()>> fns = {
        [] { empty_kernel<<<1, 32>>>(); },
        [&] { CK(cudaMemcpyAsync(dev.want, dev.orig, size_t(bytes / 2), cudaMemcpyDeviceToDevice)); }};
    for (const Variant& v : kVariants) {
      names.push_back(v.name);
      fns.push_back([&dev, fn = v.fn] { CK(fn(dev.a, nullptr)); });
    }
    const std::vector<Stats> st = time_all(fns, 3, 30, Flush::memset);
    std::fprintf(out, "%s{\"batch\": %d, \"moved_rows_per_layer\": %lld, \"bytes_moved\": %.0f, \"floor_s\": %.4e, "
                 "\"rows\": {", bi ? ", " : "", batches[bi], (long long)moved_rows(dev.in), bytes, floor);
    emit_rows(out, batches[bi], "", names, st, floor);
    std::fprintf(out, "}");
    time_read_flush(dev, bytes, floor, out);
    failures += time_graph(dev, bytes, floor, out);
    std::fprintf(out, "}");
    dev.reset(8);  // the timed calls compacted the same cache again and again: check a fresh run
    CK(kdb::kv_compact_launch(dev.a, nullptr));
    CK(cudaDeviceSynchronize());
    const bool bad = dev.diff() != 0;
    failures += bad;
    std::printf("B %3d  prod after timing: %s\n", batches[bi], bad ? "FAIL" : "ok");
  }
  std::fprintf(out, "]}\n");
  std::fclose(out);
  std::printf("time: %d failed checks\n", failures);
  return failures != 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check" || mode == "sanitize") return check(mode == "sanitize");
  if (mode == "time" && argc > 2) return time_main(argv[2]);
  std::fprintf(stderr, "usage: %s check | sanitize | time OUT.json\n", argv[0]);
  return 2;
}
