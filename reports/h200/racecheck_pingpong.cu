// Diagnosis of the racecheck report on tree_verify_mla's ping-pong path (plans/0004): the kernel file compiled
// standalone (no torch) and launched on six small shapes (sanitize_kernels.py's three, two unsplit ones, a tail-plan
// one), path chosen on the command line.
// Built twice: as shipped (the producer signals with bar.sync) and with -DKDB_PINGPONG_BAR_ARRIVE (bar.arrive, the
// form shipped until 2026-12-01 s3). racecheck flags the arrive build only: it does not treat bar.arrive ->
// bar.sync as an edge. Usage: racecheck_pingpong {mma|wgmma|pingpong|seesaw} [time [all|short] | trace]
// `time`: three peer anchor shapes (`all`: the six; `short`: and four 1K-context grid shapes), CUDA events (3 warm-up,
// median of 15), so two builds' cost can be compared; KDB_TVM_TAIL=0 turns the seesaw's tail plan off (the same
// binary's A/B). Paths: mma, wgmma, pingpong (the default here) and seesaw (v4, the extension's default on sm_90).
// Every run prints a hash of all output bits; built with -DKDB_TVM_JITTER (random sleeps around every named barrier),
// repeated runs must print the hashes of the plain build (plans/0004, "Design v4").
// `trace` (build with -DKDB_TVM_TRACE): per-phase timestamps of one CTA in the middle of the grid (thread 0 of each
// warpgroup, SM clock) on those three shapes plus B 8 H 128 T 257: the median of each phase's end, in cycles after
// the step's start, over the steady tiles, and the median step (two tiles) per warpgroup.
#include "../../csrc/tree_verify_mla.cu"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { std::printf("%s: %s\n", what, cudaGetErrorString(e)); std::exit(1); }
}

#ifdef KDB_TVM_TRACE
// Ping-pong: warpgroup wg's steps are its own tiles i = wg, wg + 2, ...; seesaw: both take pairs i = 0, 2, ...
static void print_trace(int n_tiles, kdb::TvmPath path) {
  static long long tr[2][kdb::tvm::kTraceSteps][kdb::tvm::kTraceEvents];
  check(cudaMemcpyFromSymbol(tr, kdb::tvm::g_tvm_trace, sizeof(tr)), "trace copy");
  const bool ss = path == kdb::TvmPath::kSeesaw;
  const char* pp[] = {"start", "free", "refill", "ready", "remote_pv", "loaded", "qk", "free_signal", "qk_done",
                      "published", "own_pv"};
  // Seesaw marks (csrc/tree_verify_mla_seesaw.h, kSsA..kSsI, kSsEnd), in index order, not time order.
  const char* ss0[] = {"start", "published_m0", "own_pv_issued", "own_pv_done", "m1_taken", "remote_pv_issued",
                       "max_known", "qk_lo_issued", "remote_pv_done", "qk_hi_issued", "end"};
  const char* ss1[] = {"start", "m0_taken", "remote_pv_issued", "published_m1", "remote_pv_done", "own_pv_done",
                       "s0_taken", "max_known", "-", "-", "qk_done"};
  const int n = std::min(n_tiles, kdb::tvm::kTraceSteps), events = 11;
  for (int wg = 0; wg < 2; ++wg) {
    const char* const* names = ss ? (wg ? ss1 : ss0) : pp;
    const int first = ss ? 4 : 4 + wg;
    std::printf("  wg %d (%d tiles):", wg, n);
    for (int ev = 1; ev < events; ++ev) {
      std::vector<long long> d;
      for (int i = first; i + 4 < n; i += 2)
        if (tr[wg][i][ev] && tr[wg][i][0]) d.push_back(tr[wg][i][ev] - tr[wg][i][0]);
      if (d.empty()) continue;
      std::sort(d.begin(), d.end());
      std::printf(" %s %lld", names[ev], d[d.size() / 2]);
    }
    std::vector<long long> step;
    for (int i = first; i + 6 < n; i += 2) step.push_back(tr[wg][i + 2][0] - tr[wg][i][0]);
    if (!step.empty()) {
      std::sort(step.begin(), step.end());
      std::printf(" | step %lld cycles (p10 %lld, p90 %lld)", step[step.size() / 2], step[step.size() / 10],
                  step[step.size() * 9 / 10]);
    }
    std::printf("\n");
  }
  const int i0 = (n / 2) & ~1;  // one steady stretch, both warpgroups on one time axis
  std::printf("  timeline from wg 0 step %d:", i0);
  for (int i = i0; i < std::min(i0 + 3, n); ++i)
    for (int wg = 0; wg < 2; ++wg) {
      if (!ss && (i & 1) != wg) continue;
      if (ss && (i & 1)) continue;
      const char* const* names = ss ? (wg ? ss1 : ss0) : pp;
      for (int ev = 0; ev < events; ++ev)
        if (tr[wg][i][ev]) std::printf(" [%d w%d %s %lld]", i, wg, names[ev], tr[wg][i][ev] - tr[0][i0][0]);
    }
  std::printf("\n");
}
#endif

#ifdef KDB_TVM_TRACE
// The seesaw's phase marks of the traced CTA (kPhaseEntry .. kPhaseDone), cycles after warpgroup 0's entry.
static void print_phases() {
  static long long ph[2][kdb::tvm::kPhases];
  check(cudaMemcpyFromSymbol(ph, kdb::tvm::g_tvm_phases, sizeof(ph)), "phase trace copy");
  for (int wg = 0; wg < 2; ++wg)
    std::printf("  phases wg %d: q_ready %lld first_qk %lld pairs_done %lld epilogue_done %lld (cycles after entry)\n", wg,
                ph[wg][1] - ph[0][0], ph[wg][2] - ph[0][0], ph[wg][3] - ph[0][0], ph[wg][4] - ph[0][0]);
}
#endif

static void run_shape(int b, int h, int t, int past, kdb::TvmPath path, std::mt19937& rng, bool timed = false,
                      bool traced = false) {
  const int s = past + t + 7, words = (t + 63) / 64;
  std::normal_distribution<float> nd;
  std::vector<__nv_bfloat16> q(size_t(b) * t * h * 576), kv(size_t(b) * s * 576);
  for (auto* v : {&q, &kv}) {      // 4M fresh normals, then repeated: the timed shapes hold up to 1.2G values
    const size_t fresh = std::min(v->size(), size_t(1) << 22);
    for (size_t i = 0; i < v->size(); ++i) (*v)[i] = i < fresh ? __float2bfloat16(nd(rng)) : (*v)[i % fresh];
  }
  std::vector<uint64_t> anc(size_t(b) * t * words, 0);
  for (int r = 0; r < b; ++r)
    for (int i = 0; i < t - 1; ++i)                       // causal chain; the last node is padding (all zero)
      for (int j = 0; j <= i; ++j) anc[(size_t(r) * t + i) * words + j / 64] |= 1ull << (j % 64);
  std::vector<int32_t> pl(b, past);
  kdb::TreeVerifyMlaShape sh{b, t, h, s, words};
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attr");
  const kdb::TvmPlan plan = kdb::tree_verify_mla_plan(sh, sms, path);
  const int splits = plan.tail_pieces > 0 ? plan.tail_pieces : plan.num_splits;
  void *dq, *dkv, *dpl, *danc, *dout, *dlse, *dws = nullptr;
  const size_t ws = kdb::tree_verify_mla_workspace_floats(sh, plan);
  check(cudaMalloc(&dq, q.size() * 2), "malloc"); check(cudaMalloc(&dkv, kv.size() * 2), "malloc");
  check(cudaMalloc(&dpl, b * 4), "malloc"); check(cudaMalloc(&danc, anc.size() * 8), "malloc");
  check(cudaMalloc(&dout, size_t(b) * t * h * 512 * 2), "malloc"); check(cudaMalloc(&dlse, size_t(b) * t * h * 4), "malloc");
  if (ws) check(cudaMalloc(&dws, ws * 4), "malloc");
  cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dkv, kv.data(), kv.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dpl, pl.data(), b * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(danc, anc.data(), anc.size() * 8, cudaMemcpyHostToDevice);
  kdb::TreeVerifyMlaArgs a{static_cast<const __nv_bfloat16*>(dq), static_cast<const __nv_bfloat16*>(dkv),
                           static_cast<const int32_t*>(dpl), static_cast<const uint64_t*>(danc),
                           static_cast<__nv_bfloat16*>(dout), static_cast<float*>(dlse), static_cast<float*>(dws),
                           sh, 0.1309, plan, path};
  check(kdb::tree_verify_mla_launch(a, nullptr), "launch");
  check(cudaDeviceSynchronize(), "sync");
  if (timed) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> ms(18);
    for (float& m : ms) {
      cudaEventRecord(e0); check(kdb::tree_verify_mla_launch(a, nullptr), "launch"); cudaEventRecord(e1);
      cudaEventSynchronize(e1); cudaEventElapsedTime(&m, e0, e1);
    }
    std::sort(ms.begin() + 3, ms.end());
    std::printf("time B %d H %d T %d past %d: median %.4f ms (min %.4f, max %.4f, 15 samples)\n", b, h, t, past,
                ms[3 + 7], ms[3], ms.back());
  }
#ifdef KDB_TVM_TRACE
  if (traced) {
    static long long zero[2][kdb::tvm::kTraceSteps][kdb::tvm::kTraceEvents];
    static long long zero_phases[2][kdb::tvm::kPhases];
    check(cudaMemcpyToSymbol(kdb::tvm::g_tvm_trace, zero, sizeof(zero)), "trace reset");
    check(cudaMemcpyToSymbol(kdb::tvm::g_tvm_phases, zero_phases, sizeof(zero_phases)), "phase trace reset");
    check(kdb::tree_verify_mla_launch(a, nullptr), "launch");
    check(cudaDeviceSynchronize(), "sync");
    const int tiles = (past + t + 63) / 64;
    std::printf("trace B %d H %d T %d past %d splits %d:\n", b, h, t, past, splits);
    // The traced CTA (gridDim.x / 2) is a whole unit of a tail plan unless the plan has a single full wave.
    print_trace(plan.tail_pieces > 0 ? tiles : (tiles + splits - 1) / splits, path);
    if (path == kdb::TvmPath::kSeesaw) print_phases();
  }
#else
  (void)traced;
#endif
  std::vector<float> lse(size_t(b) * t * h);
  std::vector<uint16_t> o(size_t(b) * t * h * 512);
  cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), dout, o.size() * 2, cudaMemcpyDeviceToHost);
  double sum = 0;
  for (int i = 0; i < b * t * h; ++i) if ((i / h) % t != t - 1) sum += lse[i];   // padding rows are -inf
  uint64_t fnv = 1469598103934665603ull;  // FNV-1a over every output bit: o_lat, then lse
  auto mix = [&fnv](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) fnv = (fnv ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  mix(o.data(), o.size() * 2);
  mix(lse.data(), lse.size() * 4);
  std::printf("B %d H %d T %d past %d splits %d%s: sum of lse %.6f, output hash %016llx\n", b, h, t, past, splits,
              plan.tail_pieces > 0 ? " (tail plan: pieces of the last wave's units)" : "", sum,
              static_cast<unsigned long long>(fnv));
  cudaFree(dq); cudaFree(dkv); cudaFree(dpl); cudaFree(danc); cudaFree(dout); cudaFree(dlse); if (dws) cudaFree(dws);
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "pingpong";
  const kdb::TvmPath path = !std::strcmp(name, "mma") ? kdb::TvmPath::kMma
                          : !std::strcmp(name, "wgmma") ? kdb::TvmPath::kWgmma
                          : !std::strcmp(name, "seesaw") ? kdb::TvmPath::kSeesaw : kdb::TvmPath::kPingPong;
  std::mt19937 rng(0);
  if (argc > 3 && !std::strcmp(argv[2], "trace") && !std::strcmp(argv[3], "short")) {  // 1K context (Session 9)
    run_shape(8, 128, 64, 1024, path, rng, false, true);
    run_shape(32, 64, 64, 1024, path, rng, false, true);
    run_shape(16, 64, 65, 8192, path, rng, false, true);
    return 0;
  }
  if (argc > 2 && !std::strcmp(argv[2], "trace")) {
    run_shape(16, 64, 65, 8192, path, rng, false, true);
    run_shape(64, 8, 9, 32768, path, rng, false, true);
    run_shape(32, 64, 9, 16384, path, rng, false, true);
    run_shape(8, 128, 257, 8192, path, rng, false, true);
    return 0;
  }
  if (argc > 2 && !std::strcmp(argv[2], "time")) {
    run_shape(16, 64, 65, 8192, path, rng, true);
    run_shape(64, 8, 9, 32768, path, rng, true);
    run_shape(32, 64, 9, 16384, path, rng, true);
    if (argc > 3 && !std::strcmp(argv[3], "all")) {  // the other peer anchors (plans/0004): the tail plan's shapes
      run_shape(64, 16, 65, 4096, path, rng, true);
      run_shape(8, 128, 257, 8192, path, rng, true);
      run_shape(4, 64, 1025, 2048, path, rng, true);
    }
    if (argc > 3 && !std::strcmp(argv[3], "short")) {  // 1K-context grid shapes: 17-20 KV tiles per unit (Session 9)
      run_shape(8, 128, 64, 1024, path, rng, true);
      run_shape(8, 16, 256, 1024, path, rng, true);
      run_shape(32, 64, 64, 1024, path, rng, true);
      run_shape(8, 128, 256, 1024, path, rng, true);
    }
    return 0;
  }
  run_shape(4, 64, 65, 300, path, rng);    // no split (260 CTAs), pairs of tiles with a tail
  run_shape(3, 64, 65, 300, path, rng);    // seesaw: the tail plan (132 whole units, 63 in 2 pieces)
  run_shape(5, 64, 65, 100, path, rng);    // no split, 325 units of 3 tiles (an odd count: the last pair has one)
  run_shape(2, 16, 65, 300, path, rng);    // split, many row tiles
  run_shape(1, 8, 17, 4097, path, rng);    // split-KV, few rows
  run_shape(3, 8, 9, 191, path, rng);      // ragged small
  return 0;
}
