// PTX wrappers for the attention kernels: cp.async, ldmatrix + mma.sync (sm_80+), and the sm_90a warpgroup
// MMA (wgmma) with its shared-memory descriptors and fences. No torch; included by csrc/*.cu only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

// wgmma exists only in the architecture-specific sm_90a target; elsewhere its wrappers trap.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KDB_HAS_WGMMA 1
#else
#define KDB_HAS_WGMMA 0
#endif

namespace kdb {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// src_bytes = 0 zero-fills the 16 smem bytes without reading src (out-of-range rows never reach smem).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// The inverse of ldsm_x4 (sm_90+): lane l gives the address of row l % 8 of matrix l / 8; r[m] holds (row lane / 4,
// cols 2 (lane % 4), +1) of matrix m, which is the mma / wgmma A fragment of a 16 x 16 block.
__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3]) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// d[16x8 f32] += a[16x16 bf16, row] * b[16x8 bf16, col]. Lane (g = lane/4, c = lane%4) holds
// d[0..1] = (row g, cols 2c, 2c+1), d[2..3] = (row g+8, cols 2c, 2c+1).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- wgmma (sm_90a) ----
// Shared-memory matrix descriptor for the 128-byte swizzle (PTX ISA "matrix descriptor"): start address,
// leading and stride byte offsets in 16-byte units, swizzle mode 1 (128 B) in bits 62-63. The swizzle
// atom is 8 rows x 128 B at a 1024-byte aligned base; chunk c of row r sits at chunk c ^ (r & 7).
// K-major (rows = M or N, 64 bf16 of K per row): sbo = 1024 (next 8-row group), lbo unused (1).
// MN-major (rows = K, 64 bf16 of N per row): lbo = byte distance to the next 64-wide N block, sbo = 1024.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}
// Orders this thread's earlier register writes (accumulators) before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() {
#if KDB_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if KDB_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() {
#if KDB_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the async proxy
// that wgmma reads through; call after the writes, before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if KDB_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of v across a wgmma boundary (the asm above only names d).
__device__ __forceinline__ void reg_fence(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// Accumulator operands of the wgmma wrappers below: rows d[j..j+3] of the m16n8 C-fragment array, 4 fp32 each,
// in the order of the PTX register list; KDB_ACC_REGS128 is that list for the 32 rows of an m64n256 product.
#define KDB_ACC_ROW(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define KDB_ACC_OUT(d, j) KDB_ACC_ROW(d, j), KDB_ACC_ROW(d, j + 1), KDB_ACC_ROW(d, j + 2), KDB_ACC_ROW(d, j + 3)
#define KDB_ACC_OUT32(d)                                                                                   \
  KDB_ACC_OUT(d, 0), KDB_ACC_OUT(d, 4), KDB_ACC_OUT(d, 8), KDB_ACC_OUT(d, 12), KDB_ACC_OUT(d, 16),          \
      KDB_ACC_OUT(d, 20), KDB_ACC_OUT(d, 24), KDB_ACC_OUT(d, 28)
#define KDB_ACC_REGS128 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "

// d[64 x 32] (+)= A[64 x 16] . B[16 x 32] for one warpgroup, A and B read from shared memory through
// descriptors; d[j][e] is the m16n8 C-fragment layout per n8 block j. scale_d = 0 overwrites d, 1 accumulates.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if KDB_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, %19;\n}\n"
      : KDB_ACC_OUT(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
#else
  __trap();  // sm_90a only: launchers never select this path elsewhere
#endif
}

// d[64 x 256] (+)= A[64 x 16] . B[16 x 256] for one warpgroup, A and B read from shared memory through
// descriptors; d[j][e] is the m16n8 C-fragment layout per n8 block j. scale_d = 0 overwrites d, 1 accumulates.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if KDB_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      KDB_ACC_REGS128
      "%128, %129, p, 1, 1, 0, %131;\n}\n"
      : KDB_ACC_OUT32(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
#else
  __trap();  // sm_90a only: launchers never select this path elsewhere
#endif
}

// Waits until at most kPending of this thread's wgmma groups are still in flight (0: all done).
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if KDB_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
__device__ __forceinline__ void reg_fence(uint32_t& v) { asm volatile("" : "+r"(v)::"memory"); }
// Named barriers (ids 1..15; 0 is __syncthreads); both sides' thread counts together = n. named_signal is the
// ping-pong's producer-to-consumer signal: bar.sync by default, so the producer waits for the consumer as well.
// bar.arrive (no wait) orders the same accesses per the PTX ISA, but compute-sanitizer racecheck seems not to model
// the arrive -> sync edge (7-8 reported hazards, 0 with bar.sync), and on the H200 bar.sync cost -0.3 .. +1.0 %
// (two calls, plans/0004, 2026-12-01 s3). -DKDB_PINGPONG_BAR_ARRIVE builds the arrive form for that A/B.
// -DKDB_TVM_JITTER (reports/h200/racecheck_pingpong.cu `jitter`): a pseudo-random sleep of 0..1.5 us per warp before
// and after every named barrier, so the warpgroups' relative timing varies run to run; outputs that change with it
// would reveal an ordering the barriers do not enforce (plans/0004, "Design v4"). A no-op otherwise.
__device__ __forceinline__ void barrier_jitter() {
#ifdef KDB_TVM_JITTER
  const unsigned r = (static_cast<unsigned>(clock()) * 2654435761u) >> 28;  // warp-uniform: one clock read per warp
  __nanosleep(100 * r);
#endif
}
__device__ __forceinline__ void bar_sync_raw(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
#ifdef KDB_PINGPONG_BAR_ARRIVE
__device__ __forceinline__ void named_signal(int id, int n) {
  barrier_jitter();
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
  barrier_jitter();
}
#else
__device__ __forceinline__ void named_signal(int id, int n) { barrier_jitter(); bar_sync_raw(id, n); barrier_jitter(); }
#endif
__device__ __forceinline__ void named_sync(int id, int n) { barrier_jitter(); bar_sync_raw(id, n); barrier_jitter(); }

// d[64 x 64] (+)= A[64 x 16] . B[16 x 64] for one warpgroup, A and B through shared-memory descriptors (both
// K-major); d[j][e] is the m16n8 C-fragment layout per n8 block j. scale_d = 0 overwrites d, 1 accumulates.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if KDB_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : KDB_ACC_OUT(d, 0), KDB_ACC_OUT(d, 4)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  __trap();  // sm_90a only: launchers never select this path elsewhere
#endif
}

// d[64 x 256] += A[64 x 16] . B[16 x 256] for one warpgroup, A from registers (the m16n8k16 A-fragment layout per
// warp: a[0] rows g / cols 2c, a[1] rows g+8, a[2] cols +8, a[3] both; bf16x2 each), B through an MN-major
// descriptor (trans-b = 1). A's registers must stay unmodified until the wgmma group completes.
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[32][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                    int scale_d) {
#if KDB_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      KDB_ACC_REGS128
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : KDB_ACC_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  __trap();  // sm_90a only: launchers never select this path elsewhere
#endif
}

}  // namespace kdb
