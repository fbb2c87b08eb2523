// What compute-sanitizer racecheck reports on tree_verify_mla's max hand-offs, stripped of everything else
// (issue 15 item 4; plans/0004 "Design v4", racecheck). One CTA of two warpgroups passes a row max per
// iteration through shared memory the way v4 (two slots: max[0] 0 -> 1, max[1] 1 -> 0) and v3 (one slot, the
// owner alternates, __syncwarp before a lane overwrites what its quad read) do. Every mode but the two controls is
// ordered by bar.sync of all 256 threads between each write and each access of another thread (PTX ISA, memory
// consistency: bar.sync is a release/acquire pattern among its participants), so a report on them is racecheck's
// model, not the kernel. The controls drop one ordering and must be reported.
// Build: nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a racecheck_handoff.cu -o rch
// Run:   for m in 0 1 2 3 4 5 6 7 8 9 10 11; do compute-sanitizer --tool racecheck ./rch $m; done
#include <cstdint>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void bsync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }

enum Mode {
  kV4 = 0,          // two slots, barriers 5 (0 -> 1) and 6 (1 -> 0), as v4's M0 / M1
  kV4SameId = 1,    // the same with one barrier id for both hand-offs
  kV4Block = 2,     // the same with __syncthreads (barrier 0)
  kV3 = 3,          // one slot, owner i & 1, barrier 5 + owner, __syncwarp between the quad's read and lane 0's write
  kV3NoWarpSync = 4,  // control: kV3 without the __syncwarp (intra-warp WAR, unordered under independent scheduling)
  kV4EarlyRead = 5,   // control: warpgroup 0 reads slot 1 between the barriers, while warpgroup 1 writes it
  kV4Unrolled = 6,    // kV4 with the loop split in two bodies (even and odd i), as a pair loop's code layout
  kV4OneSidedWgBarrier = 7,  // kV4, but at i = 1 warpgroup 1 alone also syncs its 128 threads (id 9 + wg in a
                             // register), as v4's tail fill did (until s8) for the warpgroup owning the tail tile
  kV4Mbarrier = 8,           // kV4 after every thread arrives on and waits for an mbarrier (v4's TMA boxes' waits)
  kV4BothWgBarrier = 9,      // kV4 after a 128-thread barrier of each warpgroup (ids 9 and 10) every iteration
  kV4StaggeredWgBarrier = 10,  // kV4, each warpgroup syncs its own 128 threads once: 0 at i = 1, 1 at i = 2 (v3's
                               // per-warpgroup tile waits until s8: equal counts, different places)
  kV4OneSidedMbarrier = 11,    // kV4, but at i = 1 warpgroup 1 alone waits on its own 128-arrival mbarrier (v3 since s8)
};

__device__ __forceinline__ void mbar_round(uint32_t bar, uint32_t parity) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
               "r"(parity) : "memory");
}

template <int kMode>
__global__ void handoff(float* out, int iters) {
  __shared__ float slot[2][64];
  __shared__ __align__(8) unsigned long long mbar, mbar_wg;
  const uint32_t mbar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&mbar));
  const uint32_t mbar_wg_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&mbar_wg));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 256;\n" ::"r"(mbar_addr) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(mbar_wg_addr) : "memory");
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int c = lane & 3, row = 16 * warp + (lane >> 2);  // a thread's rows: row and row + 8, as the wgmma layout
  float x = threadIdx.x * 1e-3f;
  for (int i = 0; i < iters; ++i) {
    if constexpr (kMode == kV3 || kMode == kV3NoWarpSync) {
      const int owner = i & 1;
      if (wg == owner) {
        if (c == 0) slot[0][row] = x + i, slot[0][row + 8] = x - i;
        bsync(5 + owner);
      } else {
        bsync(5 + owner);
        x += slot[0][row] + slot[0][row + 8];
        if constexpr (kMode == kV3) __syncwarp();
      }
    } else {
      if (kMode == kV4BothWgBarrier || (kMode == kV4OneSidedWgBarrier && wg == 1 && i == 1))
        asm volatile("bar.sync %0, 128;\n" ::"r"(9 + wg) : "memory");
      if (kMode == kV4StaggeredWgBarrier && i == 1 + wg) asm volatile("bar.sync %0, 128;\n" ::"r"(9 + wg) : "memory");
      if (kMode == kV4OneSidedMbarrier && wg == 1 && i == 1) mbar_round(mbar_wg_addr, 0);
      if constexpr (kMode == kV4Mbarrier) mbar_round(mbar_addr, i & 1);
      const int id0 = kMode == kV4Block ? 0 : 5, id1 = kMode == kV4Block ? 0 : kMode == kV4SameId ? 5 : 6;
      if (wg == 0) {
        if (c == 0) slot[0][row] = x + i, slot[0][row + 8] = x - i;
        bsync(id0);
        if constexpr (kMode == kV4EarlyRead) x += slot[1][row];  // concurrent with warpgroup 1's write below
        bsync(id1);
        if constexpr (kMode != kV4EarlyRead) x += slot[1][row] + slot[1][row + 8];
      } else {
        bsync(id0);
        x += slot[0][row] + slot[0][row + 8];
        if (c == 0) slot[1][row] = x * 0.5f, slot[1][row + 8] = x * 0.25f;
        bsync(id1);
      }
      if constexpr (kMode == kV4Unrolled) {
        if (++i >= iters) break;
        if (wg == 0) {
          if (c == 0) slot[0][row] = x - i, slot[0][row + 8] = x + i;
          bsync(5);
          bsync(6);
          x += slot[1][row] * slot[1][row + 8];
        } else {
          bsync(5);
          x += slot[0][row] * slot[0][row + 8];
          if (c == 0) slot[1][row] = x * 0.75f, slot[1][row + 8] = x * 0.125f;
          bsync(6);
        }
      }
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

// Usage: rch MODE [ITERS [BLOCKS [DYN_SMEM_BYTES]]]; e.g. 600 blocks with 200,000 B each run one CTA per SM in
// several waves on the same shared memory, as the harness's unsplit shape (260 CTAs) does.
int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0, iters = argc > 2 ? std::atoi(argv[2]) : 6;
  const int blocks = argc > 3 ? std::atoi(argv[3]) : 2, smem = argc > 4 ? std::atoi(argv[4]) : 0;
  float* out = nullptr;
  cudaMalloc(&out, blocks * 256 * sizeof(float));
  void (*k[])(float*, int) = {handoff<0>, handoff<1>, handoff<2>, handoff<3>, handoff<4>,
                              handoff<5>, handoff<6>, handoff<7>, handoff<8>, handoff<9>, handoff<10>, handoff<11>};
  if (mode < 0 || mode > 11) return std::fprintf(stderr, "mode must be 0..11\n"), 2;
  cudaFuncSetAttribute(k[mode], cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  k[mode]<<<blocks, 256, smem>>>(out, iters);
  const cudaError_t err = cudaDeviceSynchronize();
  float h[4] = {};
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  std::printf("mode %d iters %d blocks %d smem %d: %s, out[0..3] %.4f %.4f %.4f %.4f\n", mode, iters, blocks, smem,
              cudaGetErrorString(err), h[0], h[1], h[2], h[3]);
  return err == cudaSuccess ? 0 : 1;
}
