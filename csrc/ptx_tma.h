// PTX wrappers for tree_verify_mla's seesaw path (v4, sm_90a) and the ping-pong's tile waits (v3): mbarriers, 3D tensor-memory-accelerator (TMA)
// loads that complete on an mbarrier, TMA stores in bulk groups, the non-waiting named-barrier arrive, and the 64-wide wgmma with A from
// registers. Elsewhere the init, the TMA load and the wgmma trap, the other mbarrier wrappers compile to nothing
// (the launcher never selects the path there). Included by csrc/*.cu only.
#pragma once
#include "ptx_mma.h"

namespace kdb {

// One-arrival mbarrier at a shared address; the arrive that comes with the TMA's expected byte count completes
// its phase together with the bytes.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if KDB_HAS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  __trap();
#endif
}
// Makes initialised mbarriers visible to the async proxy (the TMA unit) and to the other threads' waits.
__device__ __forceinline__ void fence_mbar_init() {
#if KDB_HAS_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// The issuing thread's arrive, announcing `bytes` that TMA loads will deliver to this phase.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if KDB_HAS_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// A plain arrive (no bytes): the phase completes when all `count` arrivals of mbar_init have come.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if KDB_HAS_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Spins until the phase with this parity has completed (parity = use count & 1).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if KDB_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred done;\nKDB_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra KDB_MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// Box (x = column element, y = row, z = plane) of the tensor map `map` (a __grid_constant__ kernel parameter) into
// shared memory at dst, in the map's swizzle; elements outside the map's extent (negative coordinates included)
// arrive as zeros and count toward the bytes. Completes on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int x, int y, int z, uint32_t bar) {
#if KDB_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}

// Box (x, y, z) of the tensor map `map` from shared memory at src (in the map's swizzle); elements outside the map's
// extent are not written. One bulk async group per commit; bulk_wait_read: the committed groups have read their
// shared memory (it may be reused, or the CTA exit), their global writes may still be in flight.
__device__ __forceinline__ void tma_store_3d(const void* map, uint32_t src, int x, int y, int z) {
#if KDB_HAS_WGMMA
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map), "r"(src),
               "r"(x), "r"(y), "r"(z)
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if KDB_HAS_WGMMA
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_read() {
#if KDB_HAS_WGMMA
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

// Non-tensor bulk copies (kv_compact's bulk path): `bytes` (a multiple of 16, both addresses 16-byte aligned) from
// global src into shared dst, completing on bar; and from shared src to global dst in the thread's bulk group.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if KDB_HAS_WGMMA
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
#if KDB_HAS_WGMMA
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// Producer side of a named barrier whose consumer bar.syncs: orders the producer's earlier shared-memory
// accesses before the consumer's later ones without waiting. -DKDB_RACECHECK_ARRIVE_AS_SYNC makes it bar.sync
// (the same order of barrier operations on both sides, so no deadlock): compute-sanitizer racecheck does not seem
// to model arrive -> sync (plans/0004, 2026-12-01 s2), so racecheck runs on that build.
__device__ __forceinline__ void named_arrive(int id, int n) {
  barrier_jitter();
#ifdef KDB_RACECHECK_ARRIVE_AS_SYNC
  bar_sync_raw(id, n);
#else
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
#endif
  barrier_jitter();
}

// d[64 x 64] (+)= A[64 x 16] . B[16 x 64] for one warpgroup, A from registers (the m16n8k16 A-fragment layout, as
// wgmma_m64n256k16_rs), B K-major through a descriptor. A's registers must stay unmodified until the group completes.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
#if KDB_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : KDB_ACC_OUT(d, 0), KDB_ACC_OUT(d, 4)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  __trap();
#endif
}

}  // namespace kdb
