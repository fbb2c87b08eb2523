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

// How the grid covers the B x ceil(T H / 64) units (request, M-tile of 64 rows) (plans/0004, Session 8): every unit
// in num_splits KV splits (1: whole, no partials), or the seesaw's tail plan: units [0, tail_start) whole (as many
// full waves as fit) and each later unit, the last and partial wave's, in tail_pieces KV pieces whose partials the
// combine merges, so that wave does 1 / tail_pieces of a unit's work instead of all of it.
struct TvmPlan {
  int num_splits = 1;
  int tail_start = 0;
  int tail_pieces = 0;  // 0: no tail plan
};

struct TreeVerifyMlaArgs {
  const __nv_bfloat16* q;   // [B, T, H, 576] contiguous
  const __nv_bfloat16* kv;  // [B, S, 576] contiguous; rows >= past_len + T are never read (the seesaw's tail box
                            // ends at past_len + T; rows before 0 or past S arrive as TMA's zeros)
  const int32_t* past_lens; // [B]
  const uint64_t* anc;      // [B, T, W]; bit j%64 of word j/64: node j is ancestor-or-self; all zero = padding
  __nv_bfloat16* o_lat;     // [B, T, H, 512] output
  float* lse;               // [B, T, H] output, natural log; -inf for padding nodes
  float* workspace;         // tree_verify_mla_workspace_floats(shape, plan) floats, or null if 0
  TreeVerifyMlaShape shape;
  double scale;             // softmax scale applied to q . k
  TvmPlan plan;             // from tree_verify_mla_plan(shape, num_sms, path), for this path
  TvmPath path;
};

// Dynamic shared memory one CTA of the attention kernel needs (bytes).
int tree_verify_mla_smem_bytes();
// The grid plan for `path` on a GPU of num_sms SMs: KV splits per request so that the units fill the GPU (1 when
// the batch already does), or, seesaw only, the tail plan where the cost model prefers it. KDB_TVM_TAIL=0 in the
// environment turns the tail plan off (the benches' A/B switch).
TvmPlan tree_verify_mla_plan(const TreeVerifyMlaShape& shape, int num_sms, TvmPath path);
// fp32 scratch for partials: num_splits x B x T x H x (512 + 1), or tail_pieces x 64 x tail units x (512 + 1); 0 when
// the plan has neither.
size_t tree_verify_mla_workspace_floats(const TreeVerifyMlaShape& shape, const TvmPlan& plan);
// Enqueues the kernel(s) on `stream`; never synchronizes. Returns the launch error, if any.
cudaError_t tree_verify_mla_launch(const TreeVerifyMlaArgs& args, cudaStream_t stream);

}  // namespace kdb
