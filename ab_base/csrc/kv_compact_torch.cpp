// kv_compact torch entry point: checks (dtype, device, layout, shape, in that order) and the in-place
// launch on the current stream. No host synchronization (CUDA-graph capturable).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kv_compact.h"
#include "check_format.h"
#include "torch_ops.h"

namespace kdb {

void kv_compact(at::Tensor cache, const at::Tensor& past_lens, const at::Tensor& accepted,
                const at::Tensor& accept_len) {
  TORCH_CHECK(cache.scalar_type() == at::kBFloat16 || cache.scalar_type() == at::kFloat,
              "cache must be bfloat16 or float32, got ", kdb::fmt(cache.scalar_type()));
  TORCH_CHECK(past_lens.scalar_type() == at::kInt, "past_lens must be int32, got ", kdb::fmt(past_lens.scalar_type()));
  TORCH_CHECK(accepted.scalar_type() == at::kInt, "accepted must be int32, got ", kdb::fmt(accepted.scalar_type()));
  TORCH_CHECK(accept_len.scalar_type() == at::kInt, "accept_len must be int32, got ", kdb::fmt(accept_len.scalar_type()));
  TORCH_CHECK(cache.is_cuda(), "cache must be a CUDA tensor, got device ", kdb::fmt(cache.device()));
  for (const auto* t : {&past_lens, &accepted, &accept_len})
    TORCH_CHECK(t->device() == cache.device(), "past_lens, accepted and accept_len must be on ", kdb::fmt(cache.device()),
                ", got ", kdb::fmt(t->device()));
  TORCH_CHECK(cache.is_contiguous(), "cache must be contiguous");
  TORCH_CHECK(past_lens.is_contiguous() && accepted.is_contiguous() && accept_len.is_contiguous(),
              "past_lens, accepted and accept_len must be contiguous");
  TORCH_CHECK(cache.dim() == 4, "cache must be [layers, B, S, D], got shape ", kdb::fmt(cache.sizes()));
  const int64_t B = cache.size(1);
  TORCH_CHECK(past_lens.dim() == 1 && past_lens.size(0) == B, "past_lens must be [B] with B = ", kdb::fmt(B), ", got shape ",
              kdb::fmt(past_lens.sizes()));
  TORCH_CHECK(accepted.dim() == 2 && accepted.size(0) == B, "accepted must be [B, A] with B = ", kdb::fmt(B),
              ", got shape ", kdb::fmt(accepted.sizes()));
  TORCH_CHECK(accept_len.dim() == 1 && accept_len.size(0) == B, "accept_len must be [B] with B = ", kdb::fmt(B),
              ", got shape ", kdb::fmt(accept_len.sizes()));
  TORCH_CHECK(cache.size(0) <= INT32_MAX && cache.size(2) <= INT32_MAX && cache.size(3) <= INT32_MAX,
              "cache dimensions must each be < 2^31, got ", kdb::fmt(cache.sizes()));
  const c10::cuda::CUDAGuard guard(cache.device());
  KvCompactArgs a;
  a.cache = cache.data_ptr();
  a.element_bytes = int(cache.element_size());
  a.layers = int(cache.size(0)), a.batch = int(B), a.seq = int(cache.size(2)), a.dim = int(cache.size(3));
  a.past_lens = past_lens.data_ptr<int32_t>();
  a.accepted = accepted.data_ptr<int32_t>();
  a.accept_len = accept_len.data_ptr<int32_t>();
  a.width = int(accepted.size(1));
  const cudaError_t err = kv_compact_launch(a, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "kv_compact: CUDA error: ", kdb::fmt(cudaGetErrorString(err)));
}

}  // namespace kdb
