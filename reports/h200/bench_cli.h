// The variant benches' shared command line and setup: OUT.jsonl [SHAPES [FIRST]] runs SHAPES shapes from shape FIRST
// (all from 0 by default; SHAPES < 0: -SHAPES shapes, checked once, no timing), with a 256 MB L2-flush buffer and
// two timing events. The caller defines CK (its error check) before including this.
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

// false: usage printed (argc < 2).
inline bool bench_cli_open(int argc, char** argv, BenchCli& c) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s OUT.jsonl [SHAPES [FIRST]]\n", argv[0]), false;
  const int nshapes = argc > 2 ? std::atoi(argv[2]) : 0;
  c.limit = nshapes == 0 ? 1 << 30 : std::abs(nshapes), c.once = nshapes < 0;
  c.first = argc > 3 ? std::max(0, std::atoi(argv[3])) : 0;
  c.out = std::fopen(argv[1], "w");
  CK(cudaMalloc(&c.flush, 256 << 20));
  CK(cudaEventCreate(&c.e0));
  CK(cudaEventCreate(&c.e1));
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
      CK(cudaMemsetAsync(flush, round & 0xff, 256 << 20));
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
