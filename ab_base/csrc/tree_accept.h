// Raw launchers of the tree_accept family (no torch): the greedy tree walk for a whole batch, and the
// per-node inverse-CDF sampling that the sampled rule runs before the same walk.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kdb {

constexpr int kAcceptMaxNodes = 12288;           // N: the walk keeps 4 ints per node in shared memory
constexpr int kSampleMaxVocab = 6144 * 512;      // V: one float64 per 512-token chunk in 48 KB

// Greedy walk, one block per request: from the root, move to the child whose token equals the target's
// token at the current node, while one exists and fewer than `width` rows are accepted.
struct AcceptGreedyArgs {
  const int64_t* tokens;         // [B, N]
  const int32_t* first_child;    // [B, N], -1 = none
  const int32_t* next_sibling;   // [B, N], -1 = none
  const int32_t* n_nodes;        // [B]; rows >= n_nodes[b] are padding (clamped to [1, N])
  const int64_t* target_tokens;  // [B, N]
  int batch, nodes, width;       // B, N, max_depth + 1 (>= 1)
  int32_t* accepted;             // [B, width] out: rows root first, -1 padding
  int32_t* accept_len;           // [B] out
  int64_t* bonus;                // [B] out: target token at the last accepted row
};
cudaError_t tree_accept_greedy_launch(const AcceptGreedyArgs& a, cudaStream_t stream);

// Sampling, one block per row of probabilities: c = running float64 sum of the row, t = u * c[V-1];
// writes the smallest j with p[j] > 0 and t < c[j] (the reference rule; a zero-probability token is
// never drawn). If rounding leaves no such j, the last positive token; -1 if the row has none.
struct SampleArgs {
  const float* probs;     // [rows, V] unnormalised, >= 0
  const double* uniforms; // [rows] in [0, 1)
  int64_t rows;
  int vocab;
  int64_t* sampled;       // [rows] out
};
cudaError_t tree_accept_sample_launch(const SampleArgs& a, cudaStream_t stream);

}  // namespace kdb
