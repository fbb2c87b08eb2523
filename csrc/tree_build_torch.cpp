// tree_build torch entry points: checks (dtype, device, layout, shape, in that order), output allocation,
// launches on the current stream. No host synchronization (CUDA-graph capturable).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "check_format.h"
#include "torch_ops.h"
#include "tree_build.h"

namespace kdb {
namespace {

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, kdb::fmt(what), ": CUDA error: ", kdb::fmt(cudaGetErrorString(err)));
}

void check_logits(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "draft_logits must be float32 or bfloat16, got ", kdb::fmt(x.scalar_type()));
  TORCH_CHECK(x.is_cuda(), "draft_logits must be a CUDA tensor, got device ", kdb::fmt(x.device()));
  TORCH_CHECK(x.is_contiguous(), "draft_logits must be contiguous");
  TORCH_CHECK(x.dim() == 3, "draft_logits must be [B, L, V], got shape ", kdb::fmt(x.sizes()));
  TORCH_CHECK(x.size(2) >= 1 && x.size(2) <= INT32_MAX, "draft_logits: V must be in [1, 2^31), got ", kdb::fmt(x.size(2)));
}

// A per-request vector [B] of dtype `dt` on the logits' device.
void check_vec(const at::Tensor& t, const char* name, at::ScalarType dt, const at::Tensor& like) {
  TORCH_CHECK(t.scalar_type() == dt, kdb::fmt(name), " must be ", kdb::fmt(dt), ", got ", kdb::fmt(t.scalar_type()));
  TORCH_CHECK(t.device() == like.device(), kdb::fmt(name), " must be on ", kdb::fmt(like.device()), ", got ", kdb::fmt(t.device()));
  TORCH_CHECK(t.is_contiguous(), kdb::fmt(name), " must be contiguous");
  TORCH_CHECK(t.dim() == 1 && t.size(0) == like.size(0), kdb::fmt(name), " must be [B] with B = ", kdb::fmt(like.size(0)),
              ", got shape ", kdb::fmt(t.sizes()));
}

// Arguments of the vocabulary pass, planned for this device; split rows get their work buffers here (the
// caching allocator: no host sync, CUDA-graph safe). `work` keeps them alive until the launch is queued.
TopkArgs topk_args(const at::Tensor& logits, int64_t k, at::Tensor& top_lp, at::Tensor& top_tok, float* lse,
                   int64_t splits, std::vector<at::Tensor>& work) {
  TopkArgs a;
  a.logits = logits.data_ptr();
  a.dtype = logits.scalar_type() == at::kFloat ? LogitDtype::kF32 : LogitDtype::kBF16;
  a.rows = logits.size(0) * logits.size(1);
  a.vocab = static_cast<int>(logits.size(2));
  a.k = static_cast<int>(k);
  a.top_lp = top_lp.data_ptr<float>();
  a.top_tok = top_tok.data_ptr<int64_t>();
  a.lse = lse;
  check_launch(tree_build_topk_plan(a, int(std::min<int64_t>(splits, INT32_MAX)), logits.get_device()),
               "tree_build (plan)");
  if (a.splits > 1) {
    const auto opt = logits.options();
    work.push_back(at::empty({a.rows, a.splits, k}, opt.dtype(at::kLong)));
    work.push_back(at::empty({a.rows, a.splits, 2}, opt.dtype(at::kFloat)));
    a.part_keys = reinterpret_cast<uint64_t*>(work[0].data_ptr<int64_t>());
    a.part_ms = work[1].data_ptr<float>();
  }
  return a;
}

}  // namespace

std::vector<at::Tensor> tree_build_topk(const at::Tensor& draft_logits, int64_t k, int64_t splits) {
  check_logits(draft_logits);
  const int64_t B = draft_logits.size(0), L = draft_logits.size(1), V = draft_logits.size(2);
  TORCH_CHECK(k >= 1 && k <= std::min<int64_t>(V, kTreeBuildMaxK), "k must be in [1, min(V, ", kdb::fmt(kTreeBuildMaxK),
              ")] = [1, ", kdb::fmt(std::min<int64_t>(V, kTreeBuildMaxK)), "], got ", kdb::fmt(k));
  const c10::cuda::CUDAGuard guard(draft_logits.device());
  const auto f32 = draft_logits.options().dtype(at::kFloat);
  at::Tensor top_lp = at::empty({B, L, k}, f32);
  at::Tensor top_tok = at::empty({B, L, k}, draft_logits.options().dtype(at::kLong));
  at::Tensor lse = at::empty({B, L}, f32);
  TORCH_CHECK(splits >= 0, "splits must be >= 0 (0 = automatic), got ", kdb::fmt(splits));
  std::vector<at::Tensor> work;
  const TopkArgs a = topk_args(draft_logits, k, top_lp, top_tok, lse.data_ptr<float>(), splits, work);
  check_launch(tree_build_topk_launch(a, c10::cuda::getCurrentCUDAStream()), "tree_build_topk");
  return {top_lp, top_tok, lse};
}

std::vector<at::Tensor> tree_build(const at::Tensor& draft_logits, const at::Tensor& budgets,
                                   const at::Tensor& root_tokens, const at::Tensor& past_lens,
                                   int64_t max_budget) {
  check_logits(draft_logits);
  check_vec(budgets, "budgets", at::kInt, draft_logits);
  check_vec(root_tokens, "root_tokens", at::kLong, draft_logits);
  check_vec(past_lens, "past_lens", at::kInt, draft_logits);
  const int64_t B = draft_logits.size(0), L = draft_logits.size(1), V = draft_logits.size(2);
  TORCH_CHECK(max_budget >= 0 && max_budget <= kTreeBuildMaxK, "max_budget must be in [0, ", kdb::fmt(kTreeBuildMaxK),
              "], got ", kdb::fmt(max_budget));
  TORCH_CHECK(L <= kTreeBuildMaxDepth, "draft_logits: L must be <= ", kdb::fmt(kTreeBuildMaxDepth), ", got ", kdb::fmt(L));
  const int64_t N = max_budget + 1, W = (N + 63) / 64, K = std::min(max_budget, V);
  const c10::cuda::CUDAGuard guard(draft_logits.device());
  const size_t smem = tree_build_heap_smem_bytes(int(L), int(K), int(N));
  int optin = 0;
  check_launch(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, draft_logits.get_device()),
               "tree_build (device attribute)");
  TORCH_CHECK(smem <= size_t(optin), "tree_build: L * K = ", kdb::fmt(L * K), " top log-probs need ", kdb::fmt(smem),
              " bytes of shared memory per block, the device allows ", kdb::fmt(optin));

  const auto opt = draft_logits.options();
  at::Tensor top_lp = at::empty({B, L, K}, opt.dtype(at::kFloat));
  at::Tensor top_tok = at::empty({B, L, K}, opt.dtype(at::kLong));
  at::Tensor tokens = at::empty({B, N}, opt.dtype(at::kLong)), positions = at::empty({B, N}, opt.dtype(at::kLong));
  at::Tensor parents = at::empty({B, N}, opt.dtype(at::kInt)), depths = at::empty({B, N}, opt.dtype(at::kInt));
  at::Tensor anc = at::empty({B, N, W}, opt.dtype(at::kLong));
  at::Tensor first_child = at::empty({B, N}, opt.dtype(at::kInt));
  at::Tensor next_sibling = at::empty({B, N}, opt.dtype(at::kInt));
  at::Tensor n_nodes = at::empty({B}, opt.dtype(at::kInt));
  at::Tensor scores = at::empty({B, N}, opt.dtype(at::kDouble));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (K > 0 && L > 0) {
    std::vector<at::Tensor> work;
    const TopkArgs a = topk_args(draft_logits, K, top_lp, top_tok, nullptr, 0, work);
    check_launch(tree_build_topk_launch(a, stream), "tree_build (vocabulary pass)");
  }
  TreeBuildArgs a;
  a.top_lp = top_lp.data_ptr<float>(), a.top_tok = top_tok.data_ptr<int64_t>();
  a.budgets = budgets.data_ptr<int32_t>(), a.root_tokens = root_tokens.data_ptr<int64_t>();
  a.past_lens = past_lens.data_ptr<int32_t>();
  a.batch = int(B), a.depth = int(L), a.k = int(K), a.nodes = int(N), a.words = int(W);
  a.tokens = tokens.data_ptr<int64_t>(), a.parents = parents.data_ptr<int32_t>();
  a.depths = depths.data_ptr<int32_t>(), a.positions = positions.data_ptr<int64_t>();
  a.anc = reinterpret_cast<uint64_t*>(anc.data_ptr<int64_t>());
  a.first_child = first_child.data_ptr<int32_t>(), a.next_sibling = next_sibling.data_ptr<int32_t>();
  a.n_nodes = n_nodes.data_ptr<int32_t>(), a.scores = scores.data_ptr<double>();
  check_launch(tree_build_heap_launch(a, stream), "tree_build (builder)");
  return {tokens, parents, depths, positions, anc, first_child, next_sibling, n_nodes, top_lp, top_tok, scores};
}

}  // namespace kdb
