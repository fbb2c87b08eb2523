// Diagnosis of the racecheck report on tree_verify_mla's ping-pong path (plans/0004): the kernel file compiled
// standalone (no torch) and launched on the three sanitize_kernels.py shapes, path chosen on the command line.
// Built twice: as shipped (the producer signals with bar.sync) and with -DKDB_PINGPONG_BAR_ARRIVE (bar.arrive, the
// form shipped until 2026-12-01 s3). racecheck flags the arrive build only: it does not treat bar.arrive ->
// bar.sync as an edge. Usage: racecheck_pingpong {mma|wgmma|pingpong} [time]
// `time`: the three shapes whose 1.25x-over-the-cascade target is missed, CUDA events (3 warm-up, median of 15),
// so the two builds' cost can be compared.
#include "../../csrc/tree_verify_mla.cu"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { std::printf("%s: %s\n", what, cudaGetErrorString(e)); std::exit(1); }
}

static void run_shape(int b, int h, int t, int past, kdb::TvmPath path, std::mt19937& rng, bool timed = false) {
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
  const int splits = kdb::tree_verify_mla_num_splits(sh, sms);
  void *dq, *dkv, *dpl, *danc, *dout, *dlse, *dws = nullptr;
  const size_t ws = kdb::tree_verify_mla_workspace_floats(sh, splits);
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
                           sh, 0.1309, splits, path};
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
  std::vector<float> lse(size_t(b) * t * h);
  cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost);
  double sum = 0;
  for (int i = 0; i < b * t * h; ++i) if ((i / h) % t != t - 1) sum += lse[i];   // padding rows are -inf
  std::printf("B %d H %d T %d past %d splits %d: sum of lse %.6f\n", b, h, t, past, splits, sum);
  cudaFree(dq); cudaFree(dkv); cudaFree(dpl); cudaFree(danc); cudaFree(dout); cudaFree(dlse); if (dws) cudaFree(dws);
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "pingpong";
  const kdb::TvmPath path = !std::strcmp(name, "mma") ? kdb::TvmPath::kMma
                          : !std::strcmp(name, "wgmma") ? kdb::TvmPath::kWgmma : kdb::TvmPath::kPingPong;
  std::mt19937 rng(0);
  if (argc > 2 && !std::strcmp(argv[2], "time")) {
    run_shape(16, 64, 65, 8192, path, rng, true);
    run_shape(64, 8, 9, 32768, path, rng, true);
    run_shape(32, 64, 9, 16384, path, rng, true);
    return 0;
  }
  run_shape(2, 16, 65, 300, path, rng);    // no split, many row tiles
  run_shape(1, 8, 17, 4097, path, rng);    // split-KV, few rows
  run_shape(3, 8, 9, 191, path, rng);      // ragged small
  return 0;
}
