// kv_compact launcher: the bulk path on sm_90 (kv_compact_bulk.h); elsewhere, or for rows it does not take, the
// CTA-per-(request, layer chunk) kernel of kv_compact_kernel.h with the widest vector that divides every row and the
// base address. Design: plans/0004-kernels.md "## kv_compact".
#include "kv_compact.h"
#include "kv_compact_bulk.h"
#include "kv_compact_kernel.h"

namespace kdb {
namespace {

// One chain (layer, column vector) per thread, up to 16 moved rows loaded before they are stored (at width 16,
// depth 15, a request's whole path is one round trip), evict-first loads and stores. The fastest of the seven
// variants in reports/h200/kv_compact_bench.cu at B 8 / 64 and within 0.5 % of the best at B 128 on the H200
// (reports/h200/2026-12-01-s2/kvcompact/); every variant is within ~6 % of a cudaMemcpy of the same bytes.
constexpr int kChainsPerThread = 1;
constexpr int kGroup = 16;
constexpr bool kStreaming = true;

// The bulk path (kv_compact_bulk.h) on sm_90 devices, whose build is sm_90a (cuda_build.arch_flags), for aligned rows
// that fit its batch; KDB_KVC_BULK=0 in the environment (read at every launch) forces the vector kernel: the A/B
// switch of the benches.
bool use_bulk(const KvCompactArgs& a) {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major == 9 && kv_bulk_fits(a) && !env_switch_off("KDB_KVC_BULK");
}

}  // namespace

cudaError_t kv_compact_launch(const KvCompactArgs& a, cudaStream_t stream) {
  if (int64_t(a.layers) * a.batch * a.dim == 0 || a.width == 0) return cudaSuccess;
  if (use_bulk(a)) return kv_compact_bulk_launch(a, stream);
  const int64_t row_bytes = int64_t(a.dim) * a.element_bytes;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(a.cache);
  if (row_bytes % 16 == 0 && addr % 16 == 0) return kv_compact_launch_as<uint4, kChainsPerThread, kGroup, kStreaming>(a, stream);
  if (row_bytes % 8 == 0 && addr % 8 == 0) return kv_compact_launch_as<uint2, kChainsPerThread, kGroup, kStreaming>(a, stream);
  if (row_bytes % 4 == 0 && addr % 4 == 0) return kv_compact_launch_as<uint32_t, kChainsPerThread, kGroup, kStreaming>(a, stream);
  return kv_compact_launch_as<uint16_t, kChainsPerThread, kGroup, kStreaming>(a, stream);
}

}  // namespace kdb
