// tree_accept torch entry points: checks (dtype, device, layout, shape, in that order), output allocation
// and launches on the current stream. No host synchronization (CUDA-graph capturable).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "check_format.h"
#include "torch_ops.h"
#include "tree_accept.h"

namespace kdb {
namespace {

struct Named {
  const at::Tensor& t;
  const char* name;
  at::ScalarType dtype;
};

// The tree arrays shared by both modes: tokens [B, N] i64, first_child / next_sibling [B, N] i32, n_nodes [B] i32.
void check_tree(std::initializer_list<Named> args, const at::Tensor& tokens) {
  for (const Named& a : args)
    TORCH_CHECK(a.t.scalar_type() == a.dtype, kdb::fmt(a.name), " must be ", kdb::fmt(a.dtype), ", got ", kdb::fmt(a.t.scalar_type()));
  TORCH_CHECK(tokens.is_cuda(), "tokens must be a CUDA tensor, got device ", kdb::fmt(tokens.device()));
  for (const Named& a : args)
    TORCH_CHECK(a.t.device() == tokens.device(), kdb::fmt(a.name), " must be on ", kdb::fmt(tokens.device()), ", got ", kdb::fmt(a.t.device()));
  for (const Named& a : args) TORCH_CHECK(a.t.is_contiguous(), kdb::fmt(a.name), " must be contiguous");
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) >= 1, "tokens must be [B, N] with N >= 1, got shape ",
              kdb::fmt(tokens.sizes()));
  TORCH_CHECK(tokens.size(1) <= kAcceptMaxNodes, "tokens: N must be <= ", kdb::fmt(kAcceptMaxNodes), ", got ", kdb::fmt(tokens.size(1)));
}

void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef want) {
  TORCH_CHECK(t.sizes() == want, kdb::fmt(name), " must have shape ", kdb::fmt(want), ", got ", kdb::fmt(t.sizes()));
}

AcceptGreedyArgs greedy_args(const at::Tensor& tokens, const at::Tensor& first_child, const at::Tensor& next_sibling,
                             const at::Tensor& n_nodes, const at::Tensor& target, std::vector<at::Tensor>& out) {
  AcceptGreedyArgs a;
  a.tokens = tokens.data_ptr<int64_t>();
  a.first_child = first_child.data_ptr<int32_t>(), a.next_sibling = next_sibling.data_ptr<int32_t>();
  a.n_nodes = n_nodes.data_ptr<int32_t>(), a.target_tokens = target.data_ptr<int64_t>();
  a.batch = int(tokens.size(0)), a.nodes = int(tokens.size(1)), a.width = int(out[0].size(1));
  a.accepted = out[0].data_ptr<int32_t>(), a.accept_len = out[1].data_ptr<int32_t>();
  a.bonus = out[2].data_ptr<int64_t>();
  return a;
}

std::vector<at::Tensor> alloc_result(const at::Tensor& tokens, int64_t max_depth) {
  TORCH_CHECK(max_depth >= 0 && max_depth < INT32_MAX, "max_depth must be >= 0, got ", kdb::fmt(max_depth));
  const int64_t B = tokens.size(0);
  const auto opt = tokens.options();
  return {at::empty({B, max_depth + 1}, opt.dtype(at::kInt)), at::empty({B}, opt.dtype(at::kInt)),
          at::empty({B}, opt.dtype(at::kLong))};
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, kdb::fmt(what), ": CUDA error: ", kdb::fmt(cudaGetErrorString(err)));
}

}  // namespace

std::vector<at::Tensor> tree_accept_greedy(const at::Tensor& tokens, const at::Tensor& first_child,
                                           const at::Tensor& next_sibling, const at::Tensor& n_nodes,
                                           const at::Tensor& target_tokens, int64_t max_depth) {
  check_tree({{tokens, "tokens", at::kLong}, {first_child, "first_child", at::kInt},
              {next_sibling, "next_sibling", at::kInt}, {n_nodes, "n_nodes", at::kInt},
              {target_tokens, "target_tokens", at::kLong}}, tokens);
  const int64_t B = tokens.size(0), N = tokens.size(1);
  check_shape(first_child, "first_child", {B, N});
  check_shape(next_sibling, "next_sibling", {B, N});
  check_shape(n_nodes, "n_nodes", {B});
  check_shape(target_tokens, "target_tokens", {B, N});
  const c10::cuda::CUDAGuard guard(tokens.device());
  std::vector<at::Tensor> out = alloc_result(tokens, max_depth);
  const AcceptGreedyArgs a = greedy_args(tokens, first_child, next_sibling, n_nodes, target_tokens, out);
  check_launch(tree_accept_greedy_launch(a, c10::cuda::getCurrentCUDAStream()), "tree_accept_greedy");
  return out;
}

std::vector<at::Tensor> tree_accept_sampled(const at::Tensor& tokens, const at::Tensor& first_child,
                                            const at::Tensor& next_sibling, const at::Tensor& n_nodes,
                                            const at::Tensor& target_probs, const at::Tensor& uniforms,
                                            int64_t max_depth) {
  check_tree({{tokens, "tokens", at::kLong}, {first_child, "first_child", at::kInt},
              {next_sibling, "next_sibling", at::kInt}, {n_nodes, "n_nodes", at::kInt},
              {target_probs, "target_probs", at::kFloat}, {uniforms, "uniforms", at::kDouble}}, tokens);
  const int64_t B = tokens.size(0), N = tokens.size(1);
  check_shape(first_child, "first_child", {B, N});
  check_shape(next_sibling, "next_sibling", {B, N});
  check_shape(n_nodes, "n_nodes", {B});
  TORCH_CHECK(target_probs.dim() == 3 && target_probs.size(0) == B && target_probs.size(1) == N,
              "target_probs must be [B, N, V] with B = ", kdb::fmt(B), ", N = ", kdb::fmt(N), ", got shape ", kdb::fmt(target_probs.sizes()));
  const int64_t V = target_probs.size(2);
  TORCH_CHECK(V >= 1 && V <= kSampleMaxVocab, "target_probs: V must be in [1, ", kdb::fmt(kSampleMaxVocab), "], got ", kdb::fmt(V));
  check_shape(uniforms, "uniforms", {B, N});
  const c10::cuda::CUDAGuard guard(tokens.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor sampled = at::empty({B, N}, tokens.options().dtype(at::kLong));
  SampleArgs s{target_probs.data_ptr<float>(), uniforms.data_ptr<double>(), B * N, int(V), sampled.data_ptr<int64_t>()};
  check_launch(tree_accept_sample_launch(s, stream), "tree_accept_sampled (sampling)");
  std::vector<at::Tensor> out = alloc_result(tokens, max_depth);
  const AcceptGreedyArgs a = greedy_args(tokens, first_child, next_sibling, n_nodes, sampled, out);
  check_launch(tree_accept_greedy_launch(a, stream), "tree_accept_sampled (walk)");
  out.push_back(sampled);
  return out;
}

}  // namespace kdb
