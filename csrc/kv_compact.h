// Raw launcher of the kv_compact family (no torch): in-place move of the accepted tree rows of every
// layer's cache to the committed positions, all layers and requests in one launch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kdb {

// For k < accept_len[b]: cache[l, b, past + k, :] = cache[l, b, past + accepted[b, k], :], past = past_lens[b].
// Needs accepted[b, :len] strictly increasing from 0 (so accepted[k] >= k): each thread then copies its
// column slice in ascending k, and no row is written before every read of it. len = min(accept_len, width).
// A slot is skipped when already in place (accepted[k] == k), negative, or when past < 0 or row past + k or
// past + accepted[k] lies outside the cache (skipped rather than touched).
struct KvCompactArgs {
  void* cache;               // [layers, B, S, D] contiguous
  int element_bytes;         // 2 (bf16) or 4 (f32)
  int layers, batch, seq, dim;
  const int32_t* past_lens;  // [B]
  const int32_t* accepted;   // [B, width]
  const int32_t* accept_len; // [B]
  int width;
};
cudaError_t kv_compact_launch(const KvCompactArgs& a, cudaStream_t stream);

// Whether slot k of a request moves, by the rules above: len = min(accept_len, width), src = accepted[k], seq = S.
// Both kernels (kv_compact_kernel.h, kv_compact_bulk.h) decide with it.
__host__ __device__ inline bool kv_slot_moves(int k, int len, int src, int past, int seq) {
  return k < len && src != k && src >= 0 && past >= 0 && src < seq - past && k < seq - past;
}

#ifdef __CUDACC__
// Slot k's source, accepted[k] of a request's row acc (k itself at and beyond the width, a slot kv_slot_moves
// never moves). Both kernels read their slots with it.
__device__ __forceinline__ int kv_slot_source(const int32_t* acc, int width, int k) {
  return k < width ? __ldg(acc + k) : k;
}
#endif

}  // namespace kdb
