// Small helpers shared by the raw CUDA launchers (tree_build, tree_accept, kv_compact): error
// propagation, ceil_div, warp reductions and the order-preserving float key. No torch headers here.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

// Return a failing cudaError_t to the caller instead of aborting; the torch layer turns it into an error.
#define KDB_CUDA_TRY(expr)                        \
  do {                                            \
    cudaError_t kdb_err_ = (expr);                \
    if (kdb_err_ != cudaSuccess) return kdb_err_; \
  } while (0)

// After a <<<...>>> launch: configuration errors (too much shared memory, bad grid) surface here.
#define KDB_LAUNCH_CHECK() KDB_CUDA_TRY(cudaGetLastError())

namespace kdb {

constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// store(i, load(i)) for i = tid, tid + stride, ... < n with U loads issued before their stores: one memory round
// trip per U elements instead of one per element (a copy loop of dependent load-store pairs waits on each load).
template <int U, typename T, class Load, class Store>
__host__ __device__ __forceinline__ void copy_batched(int n, int tid, int stride, Load load, Store store) {
  for (int i0 = 0; i0 < n; i0 += U * stride) {
    T v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * stride + tid;
      v[u] = i < n ? load(i) : T{};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * stride + tid;
      if (i < n) store(i, v[u]);
    }
  }
}

// Raise a kernel's dynamic shared-memory limit when it needs more than the default 48 KB.
template <typename Kernel>
inline cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// An A/B switch in the environment, read at every call so a bench can flip it within one process: off when the
// variable is set and starts with '0' (KDB_PDL, KDB_TVM_TAIL, KDB_KVC_BULK).
inline bool env_switch_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0';
}

// Programmatic dependent launch (PDL, sm_90+): a kernel launched by launch_pdl may start while the previous
// kernel of the stream is still running (that kernel lets it with pdl_launch_dependents, or by exiting), so its
// launch and prologue overlap the other's tail. It must call pdl_wait() before it reads anything the previous
// kernel wrote: griddepcontrol.wait returns once that grid has completed and its writes are visible (a no-op
// when the kernel was launched without the attribute). Both are no-ops below sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the stream's previous
// kernel on devices of compute capability >= 9.0 (plain stream order elsewhere, or when the environment has
// KDB_PDL=0: the A/B switch the benches use, read at every launch). Stream capture records a programmatic edge.
// Invariant: the kernel runs machine code built for that capability (cuda_build.arch_flags builds exact SASS per
// device), so its pdl_wait is compiled in; PTX for an older target JIT-run on sm_90 would wait on nothing.
template <typename... Params, typename... Args>
inline cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              Args... args) {
  int dev = 0, major = 0;
  KDB_CUDA_TRY(cudaGetDevice(&dev));
  KDB_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cfg.attrs = &attr, cfg.numAttrs = major >= 9 && !env_switch_off("KDB_PDL") ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Monotone map float -> uint32: a < b (as floats, -0 == +0 canonicalised by the caller) iff key(a) < key(b).
__device__ __forceinline__ uint32_t float_order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float float_from_order_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// 2^x with one MUFU op (flushes results below 2^-126 to zero: negligible in a sum that includes 1).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Inclusive prefix sum across the warp (lane order).
__device__ __forceinline__ double warp_inclusive_scan(double v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

__device__ __forceinline__ int warp_inclusive_scan(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// All lanes call this with their own item count n >= 0; returns the lane's first slot of n consecutive slots
// in a shared list, with one atomic per warp.
__device__ __forceinline__ int warp_append_base(int n, int* counter) {
  const int lane = threadIdx.x & 31;
  const int incl = warp_inclusive_scan(n, lane);
  int base = 0;
  if (lane == 31 && incl > 0) base = atomicAdd(counter, incl);
  return __shfl_sync(kFullMask, base, 31) + incl - n;
}

// Appends value(j) for every set bit j < N of this lane's mask to a shared list, in j order after the lane's
// slot from warp_append_base (all lanes call it; N and the loop are unrolled, so value may read a register array).
template <int N, typename T, typename F>
__device__ __forceinline__ void append_masked(T* list, int* counter, unsigned bits, F value) {
  int slot = warp_append_base(__popc(bits), counter);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if ((bits >> j) & 1u) list[slot++] = value(j);
  }
}

// Sum of n (a power of two) floats as a balanced tree: short dependency chains, small rounding error.
template <int n>
__device__ __forceinline__ float pairwise_sum(const float* e) {
  if constexpr (n == 1) {
    return e[0];
  } else {
    return pairwise_sum<n / 2>(e) + pairwise_sum<n / 2>(e + n / 2);
  }
}

}  // namespace kdb
