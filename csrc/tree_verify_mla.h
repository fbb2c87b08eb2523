// Raw launcher for tree_verify_mla: absorbed MLA attention of T tree nodes x H heads over a latent cache,
// prefix fully visible, tree rows masked by ancestor bits. No torch here: callers pass raw device pointers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

namespace kdb {

constexpr int kTvmDimQK = 576;  // q / kv row: [q_lat | q_pe] = [c_kv | k_pe] = 512 + 64
constexpr int kTvmDimV = 512;   // V = the first 512 columns of each kv row (c_kv)

struct TreeVerifyMlaShape {
  int batch;      // B
  int nodes;      // T tree nodes per request (1..1025 tested)
  int heads;      // H query heads (any >= 1)
  int cache_len;  // S allocated kv rows per request; caller promises past_lens[b] + T <= S
  int words;      // W = ceil(T / 64) ancestor words per node
};

// Which MMA path runs: the sm_90a seesaw with TMA loads (v4, the default on H100/H200), the sm_90a warpgroup-MMA
// ping-pong (v3), the sm_90a lock-step wgmma (v2), or mma.sync (sm_80+ instructions, v1).
enum class TvmPath { kMma = 0, kWgmma = 1, kPingPong = 2, kSeesaw = 3 };

struct TreeVerifyMlaArgs {
  const __nv_bfloat16* q;   // [B, T, H, 576] contiguous
  const __nv_bfloat16* kv;  // [B, S, 576] contiguous; rows >= past_len + T never reach the outputs (the seesaw's
                            // TMA boxes read up to 63 of them, within the tensor, and zero their V columns)
  const int32_t* past_lens; // [B]
  const uint64_t* anc;      // [B, T, W]; bit j%64 of word j/64: node j is ancestor-or-self; all zero = padding
  __nv_bfloat16* o_lat;     // [B, T, H, 512] output
  float* lse;               // [B, T, H] output, natural log; -inf for padding nodes
  float* workspace;         // tree_verify_mla_workspace_floats(shape, num_splits) floats, or null if 0
  TreeVerifyMlaShape shape;
  double scale;             // softmax scale applied to q . k
  int num_splits;           // from tree_verify_mla_num_splits
  TvmPath path;
};

// Dynamic shared memory one CTA of the attention kernel needs (bytes).
int tree_verify_mla_smem_bytes();
// KV splits per request so that B x row-tiles x splits fills the GPU (1 when the batch already does).
int tree_verify_mla_num_splits(const TreeVerifyMlaShape& shape, int num_sms);
// fp32 scratch for split partials: num_splits x B x T x H x (512 + 1); 0 when num_splits == 1.
size_t tree_verify_mla_workspace_floats(const TreeVerifyMlaShape& shape, int num_splits);
// Enqueues the kernel(s) on `stream`; never synchronizes. Returns the launch error, if any.
cudaError_t tree_verify_mla_launch(const TreeVerifyMlaArgs& args, cudaStream_t stream);

}  // namespace kdb
