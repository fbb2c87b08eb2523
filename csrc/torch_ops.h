// Torch-facing entry points of the CUDA extension (kdbench_cuda), one group per kernel family.
// Each is defined in csrc/<family>_torch.cpp, which checks the tensors (dtype, device, layout, shape,
// in that order, naming the argument) and calls the raw launcher declared in csrc/<family>.h.
// Every launch goes to the current torch CUDA stream and never synchronizes the host (CUDA-graph safe).
#pragma once
#include <torch/extension.h>
#include <vector>

namespace kdb {

// tree_build: draft_logits [B, L, V] f32|bf16, budgets [B] i32, root_tokens [B] i64, past_lens [B] i32.
// Returns {tokens [B,N] i64, parents [B,N] i32, depths [B,N] i32, positions [B,N] i64,
//          anc [B,N,W] i64 (uint64 bit patterns), first_child [B,N] i32, next_sibling [B,N] i32,
//          n_nodes [B] i32, top_lp [B,L,K] f32, top_tok [B,L,K] i64, scores [B,N] f64}
// with N = max_budget + 1, W = ceil(N / 64), K = min(max_budget, V).
std::vector<at::Tensor> tree_build(const at::Tensor& draft_logits, const at::Tensor& budgets,
                                   const at::Tensor& root_tokens, const at::Tensor& past_lens,
                                   int64_t max_budget);
// The vocabulary pass alone: {top_lp [B,L,K] f32, top_tok [B,L,K] i64, lse [B,L] f32}. splits: blocks per
// row (0 = chosen for the device; tests force values to check that every split gives the same result).
std::vector<at::Tensor> tree_build_topk(const at::Tensor& draft_logits, int64_t k, int64_t splits);

// tree_verify_mla: q [B,T,H,576] bf16, kv [B,S,576] bf16 (tree rows at past_len..past_len+T-1),
// past_lens [B] i32, anc [B,T,W] i64, scale = softmax scale. Returns {o_lat [B,T,H,512] bf16, lse [B,T,H] f32}.
// impl: "auto" (the seesaw, v4, on sm_90, else mma.sync), "seesaw", "pingpong", "wgmma" (sm_90 only) or "mma".
std::vector<at::Tensor> tree_verify_mla(const at::Tensor& q, const at::Tensor& kv,
                                        const at::Tensor& past_lens, const at::Tensor& anc,
                                        double scale, const std::string& impl);
// The grid plan tree_verify_mla takes on the current device for this shape and impl: {num_splits, tail_start,
// tail_pieces} (csrc/tree_verify_mla.h, TvmPlan), so tests can tell which plan a case exercised.
std::vector<int64_t> tree_verify_mla_plan(int64_t batch, int64_t nodes, int64_t heads, int64_t cache_len,
                                          const std::string& impl);

// tree_accept: tokens [B,N] i64, first_child/next_sibling [B,N] i32, n_nodes [B] i32.
// Returns {accepted [B, max_depth+1] i32 (-1 pad, root first), accept_len [B] i32, bonus [B] i64}.
std::vector<at::Tensor> tree_accept_greedy(const at::Tensor& tokens, const at::Tensor& first_child,
                                           const at::Tensor& next_sibling, const at::Tensor& n_nodes,
                                           const at::Tensor& target_tokens, int64_t max_depth);
// Sampled: target_probs [B,N,V] f32, uniforms [B,N] f64; also returns the sampled token per node [B,N] i64.
std::vector<at::Tensor> tree_accept_sampled(const at::Tensor& tokens, const at::Tensor& first_child,
                                            const at::Tensor& next_sibling, const at::Tensor& n_nodes,
                                            const at::Tensor& target_probs, const at::Tensor& uniforms,
                                            int64_t max_depth);

// kv_compact (in place): cache [layers, B, S, D] bf16|f32, past_lens [B] i32,
// accepted [B, A] i32 (root first, -1 pad), accept_len [B] i32.
void kv_compact(at::Tensor cache, const at::Tensor& past_lens, const at::Tensor& accepted,
                const at::Tensor& accept_len);

}  // namespace kdb
