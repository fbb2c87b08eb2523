// The variant benches' shared command line and setup: OUT.jsonl [SHAPES [FIRST]] runs SHAPES shapes from shape FIRST
// (all from 0 by default; SHAPES < 0: -SHAPES shapes, checked once, no timing), with a 256 MB L2-flush buffer and
// two timing events. The caller defines CK (its error check) before including this. KDB_BENCH_READ_FLUSH=1: after
// each memset a read of another 256 MB buffer, so the timed launch starts with a clean L2 (the memset leaves it dirty).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

struct BenchCli {
  int limit = 0, first = 0;
  bool once = false;  // SHAPES < 0
  FILE* out = nullptr;
  void* flush = nullptr;
  cudaEvent_t e0{}, e1{};
};
inline uint4* g_read_flush = nullptr;  // the second buffer when KDB_BENCH_READ_FLUSH=1
constexpr size_t kFlushBytes = size_t(256) << 20;

__global__ void read_flush_kernel(const uint4* p, size_t n, unsigned* sink) {  // reads every byte once
  unsigned x = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x ^= p[i].x ^ p[i].w;
  if (x == 0x9e3779b9u) *sink = x;  // keeps the loads
}

// The q-quantile of samples v (nearest rank; q 0.5: the median).
inline double quantile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * (v.size() - 1) + 0.5)];
}

// false: usage printed (argc < 2).
inline bool bench_cli_open(int argc, char** argv, BenchCli& c) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s OUT.jsonl [SHAPES [FIRST]]\n", argv[0]), false;
  const int nshapes = argc > 2 ? std::atoi(argv[2]) : 0;
  c.limit = nshapes == 0 ? 1 << 30 : std::abs(nshapes), c.once = nshapes < 0;
  c.first = argc > 3 ? std::max(0, std::atoi(argv[3])) : 0;
  c.out = std::fopen(argv[1], "w");
  CK(cudaMalloc(&c.flush, kFlushBytes));
  CK(cudaEventCreate(&c.e0));
  CK(cudaEventCreate(&c.e1));
  const char* rf = std::getenv("KDB_BENCH_READ_FLUSH");
  if (rf != nullptr && rf[0] == '1') {
    CK(cudaMalloc(&g_read_flush, kFlushBytes + 16));
    CK(cudaMemset(g_read_flush, 1, kFlushBytes + 16));
  }
  std::fprintf(c.out, "{\"flush\": \"%s\"}\n", g_read_flush ? "memset + read 256 MB" : "memset 256 MB");
  return true;
}

// Per variant, `rounds` samples (us) after 2 warm-up rounds, each launch after an L2-flush memset and between the two
// events; the order is reversed on odd rounds (ABBA). launch(i) launches variant i on stream 0.
template <class Launch>
std::vector<std::vector<float>> time_abba(int nv, int rounds, void* flush, cudaEvent_t e0, cudaEvent_t e1,
                                          Launch launch) {
  std::vector<std::vector<float>> t(nv);
  for (int round = 0; round < rounds + 2; ++round)
    for (int n = 0; n < nv; ++n) {
      const int i = round % 2 ? nv - 1 - n : n;
      CK(cudaMemsetAsync(flush, round & 0xff, kFlushBytes));
      if (g_read_flush != nullptr) {
        unsigned* sink = reinterpret_cast<unsigned*>(g_read_flush) + kFlushBytes / 4;  // past the 256 MB
        read_flush_kernel<<<1056, 512>>>(g_read_flush, kFlushBytes / 16, sink);
      }
      CK(cudaEventRecord(e0));
      CK(launch(i));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (round >= 2) t[i].push_back(ms * 1e3f);
    }
  return t;
}
