// Raw launchers of the tree_build family (no torch): the fused vocabulary pass (log-softmax top-K) and the
// per-request best-first builder (paper Algorithm 1 on the GPU). Callers pass device pointers and a stream.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kdb {

enum class LogitDtype : int { kF32 = 0, kBF16 = 1 };

constexpr int kTreeBuildMaxK = 1024;     // top-K width limit of the vocabulary pass (budget <= 1024)
constexpr int kTreeBuildMaxNodes = 1025;  // N = max_budget + 1
constexpr int kTreeBuildMaxDepth = 255;  // L: depth is packed into 8 bits of a heap entry

// Vocabulary pass: one block per (row, split) of V logits; split rows (few rows on many SMs) are merged by a
// second launch. Writes the row's top-k tokens ordered by logit descending, equal logits by smaller token id,
// with log-probs logit - lse (lse over all V tokens).
struct TopkArgs {
  const void* logits;  // [rows, V] float32 or bfloat16, contiguous
  LogitDtype dtype;
  int64_t rows;        // B * L
  int vocab;           // V >= 1
  int k;               // 1 <= k <= min(V, kTreeBuildMaxK)
  float* top_lp;       // [rows, k] out
  int64_t* top_tok;    // [rows, k] out
  float* lse;          // [rows] out, natural log; may be null
  int splits = 1;      // blocks per row (tree_build_topk_plan); > 1 needs the two work buffers
  int chunks_per_split = 0;
  uint64_t* part_keys = nullptr;  // [rows, splits, k] work: each split's sorted top keys
  float* part_ms = nullptr;       // [rows, splits, 2] work: each split's (max, sum of exp(x - max))
};
// Splits per row for these sizes on `device` (forced > 0: that many, capped at the number of 4096-logit
// chunks; used by tests); sets chunks_per_split. Call before launching; the caller allocates the work.
cudaError_t tree_build_topk_plan(TopkArgs& a, int forced, int device);
cudaError_t tree_build_topk_launch(const TopkArgs& a, cudaStream_t stream);

// Builder: one block per request; a shared-memory 4-ary heap popped by one thread in float64, then all
// threads emit the padded layouts. Budgets are clamped to [0, nodes - 1].
struct TreeBuildArgs {
  const float* top_lp;        // [B, L, K] from the vocabulary pass
  const int64_t* top_tok;     // [B, L, K]
  const int32_t* budgets;     // [B]
  const int64_t* root_tokens; // [B]
  const int32_t* past_lens;   // [B]
  int batch, depth, k, nodes; // B, L, K, N = max_budget + 1
  int words;                  // W = ceil(N / 64)
  int64_t* tokens;            // [B, N] out
  int32_t* parents;           // [B, N] out
  int32_t* depths;            // [B, N] out
  int64_t* positions;         // [B, N] out
  uint64_t* anc;              // [B, N, W] out
  int32_t* first_child;       // [B, N] out
  int32_t* next_sibling;      // [B, N] out
  int32_t* n_nodes;           // [B] out
  double* scores;             // [B, N] out
};
// Dynamic shared memory the builder needs; the caller checks it against the device's opt-in limit.
size_t tree_build_heap_smem_bytes(int depth, int k, int nodes);
cudaError_t tree_build_heap_launch(const TreeBuildArgs& a, cudaStream_t stream);

}  // namespace kdb
