// Torch glue for tree_verify_mla: checks dtype, device, layout, shape (in that order, naming the argument),
// allocates o_lat / lse (and split-KV scratch), then calls the raw launcher on the current CUDA stream.
// c10 headers, not ATen/cuda/CUDAContext.h: the latter pulls cuSPARSE/cuBLAS headers that a minimal CUDA
// toolkit lacks; c10::cuda::getCurrentCUDAStream is the function at::cuda::getCurrentCUDAStream names.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <utility>  // std::pair

#include "check_format.h"
#include "torch_ops.h"
#include "tree_verify_mla.h"

namespace kdb {
namespace {

void check_dtypes(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& past_lens, const at::Tensor& anc) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16, "tree_verify_mla: q must be bfloat16, got ", kdb::fmt(q.scalar_type()));
  TORCH_CHECK(kv.scalar_type() == at::kBFloat16, "tree_verify_mla: kv must be bfloat16, got ", kdb::fmt(kv.scalar_type()));
  TORCH_CHECK(past_lens.scalar_type() == at::kInt, "tree_verify_mla: past_lens must be int32, got ",
              kdb::fmt(past_lens.scalar_type()));
  TORCH_CHECK(anc.scalar_type() == at::kLong, "tree_verify_mla: anc must be int64 (uint64 bit patterns), got ",
              kdb::fmt(anc.scalar_type()));
}

void check_devices(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& past_lens, const at::Tensor& anc) {
  TORCH_CHECK(q.is_cuda(), "tree_verify_mla: q must be a CUDA tensor, got ", kdb::fmt(q.device()));
  TORCH_CHECK(kv.device() == q.device(), "tree_verify_mla: kv must be on ", kdb::fmt(q.device()), ", got ", kdb::fmt(kv.device()));
  TORCH_CHECK(past_lens.device() == q.device(), "tree_verify_mla: past_lens must be on ", kdb::fmt(q.device()), ", got ",
              kdb::fmt(past_lens.device()));
  TORCH_CHECK(anc.device() == q.device(), "tree_verify_mla: anc must be on ", kdb::fmt(q.device()), ", got ", kdb::fmt(anc.device()));
}

void check_layouts(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& past_lens, const at::Tensor& anc) {
  TORCH_CHECK(q.is_contiguous(), "tree_verify_mla: q must be contiguous [B, T, H, 576]");
  TORCH_CHECK(kv.is_contiguous(), "tree_verify_mla: kv must be contiguous [B, S, 576]");
  TORCH_CHECK(past_lens.is_contiguous(), "tree_verify_mla: past_lens must be contiguous");
  TORCH_CHECK(anc.is_contiguous(), "tree_verify_mla: anc must be contiguous [B, T, W]");
  // cp.async copies 16-byte chunks; rows are 1152 B, so only the base pointers can break alignment.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0, "tree_verify_mla: q must be 16-byte aligned");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0, "tree_verify_mla: kv must be 16-byte aligned");
}

// The sizes both ops accept (tree_verify_mla reads them off its tensors, tree_verify_mla_plan takes them as
// arguments, so it reports plans only for shapes the op runs): the grid's z for the batch, int rows, int cache rows.
TreeVerifyMlaShape checked_shape(const char* op, int64_t batch, int64_t nodes, int64_t heads, int64_t cache_len) {
  TORCH_CHECK(nodes >= 1 && heads >= 1, op, ": q needs T >= 1 and H >= 1, got T ", kdb::fmt(nodes), ", H ", kdb::fmt(heads));
  TORCH_CHECK(batch <= 65535, op, ": batch must be <= 65535 (grid z), got ", kdb::fmt(batch));
  TORCH_CHECK(nodes * heads <= (int64_t{1} << 30), op, ": T * H must be <= 2^30, got ", kdb::fmt(nodes * heads));
  TORCH_CHECK(cache_len >= nodes && cache_len <= (int64_t{1} << 30), op, ": kv length S must be in [T = ", kdb::fmt(nodes),
              ", 2^30], got ", kdb::fmt(cache_len));
  return TreeVerifyMlaShape{static_cast<int>(batch), static_cast<int>(nodes), static_cast<int>(heads),
                            static_cast<int>(cache_len), static_cast<int>((nodes + 63) / 64)};
}

TreeVerifyMlaShape check_shapes(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& past_lens,
                                const at::Tensor& anc, double scale) {
  TORCH_CHECK(q.dim() == 4 && q.size(3) == kTvmDimQK, "tree_verify_mla: q must be [B, T, H, ", kdb::fmt(kTvmDimQK),
              "], got ", kdb::fmt(q.sizes()));
  const int64_t batch = q.size(0), nodes = q.size(1);
  TORCH_CHECK(kv.dim() == 3 && kv.size(0) == batch && kv.size(2) == kTvmDimQK, "tree_verify_mla: kv must be [",
              kdb::fmt(batch), ", S, ", kdb::fmt(kTvmDimQK), "], got ", kdb::fmt(kv.sizes()));
  const TreeVerifyMlaShape shape = checked_shape("tree_verify_mla", batch, nodes, q.size(2), kv.size(1));
  TORCH_CHECK(past_lens.dim() == 1 && past_lens.size(0) == batch, "tree_verify_mla: past_lens must be [", kdb::fmt(batch),
              "], got ", kdb::fmt(past_lens.sizes()));
  TORCH_CHECK(anc.dim() == 3 && anc.size(0) == batch && anc.size(1) == nodes && anc.size(2) == shape.words,
              "tree_verify_mla: anc must be [", kdb::fmt(batch), ", ", kdb::fmt(nodes), ", ", kdb::fmt(shape.words), "], got ",
              kdb::fmt(anc.sizes()));
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "tree_verify_mla: scale must be finite and > 0, got ", kdb::fmt(scale));
  return shape;
}

// "auto" takes v4, the seesaw with TMA loads, where it exists (compute capability 9.0: the extension is built for
// sm_90a there), else mma.sync; "pingpong" is v3 and "wgmma" the v2 lock-step path, both kept for A/B.
TvmPath pick_path(const std::string& impl, int dev) {
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const bool sm90 = major == 9 && minor == 0;
  TORCH_CHECK(impl == "auto" || impl == "seesaw" || impl == "pingpong" || impl == "wgmma" || impl == "mma",
              "tree_verify_mla: impl must be 'auto', 'seesaw', 'pingpong', 'wgmma' or 'mma', got '", kdb::fmt(impl), "'");
  TORCH_CHECK(impl == "auto" || impl == "mma" || sm90, "tree_verify_mla: impl '", kdb::fmt(impl),
              "' needs compute capability 9.0 (H100/H200), got ", kdb::fmt(major), ".", kdb::fmt(minor));
  if (impl == "mma" || (impl == "auto" && !sm90)) return TvmPath::kMma;
  if (impl == "pingpong") return TvmPath::kPingPong;
  return impl == "wgmma" ? TvmPath::kWgmma : TvmPath::kSeesaw;
}

// The path and grid plan the op runs for this shape and impl on device dev (tree_verify_mla_plan reports this one).
std::pair<TvmPath, TvmPlan> path_and_plan(const TreeVerifyMlaShape& shape, const std::string& impl, int dev) {
  int num_sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  const TvmPath path = pick_path(impl, dev);
  return {path, tree_verify_mla_plan(shape, num_sms, path)};
}

}  // namespace

std::vector<at::Tensor> tree_verify_mla(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& past_lens,
                                        const at::Tensor& anc, double scale, const std::string& impl) {
  check_dtypes(q, kv, past_lens, anc);
  check_devices(q, kv, past_lens, anc);
  check_layouts(q, kv, past_lens, anc);
  const TreeVerifyMlaShape shape = check_shapes(q, kv, past_lens, anc, scale);

  const c10::cuda::CUDAGuard guard(q.device());
  const int dev = q.get_device();
  int smem_optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TORCH_CHECK(smem_optin >= tree_verify_mla_smem_bytes(), "tree_verify_mla: the kernel needs ",
              kdb::fmt(tree_verify_mla_smem_bytes()), " B of shared memory per block; device ", kdb::fmt(dev), " allows ", kdb::fmt(smem_optin),
              " (built for H100/H200-class GPUs, 227 KB)");
  auto o_lat = at::empty({shape.batch, shape.nodes, shape.heads, kTvmDimV}, q.options());
  auto lse = at::empty({shape.batch, shape.nodes, shape.heads}, q.options().dtype(at::kFloat));
  const auto [path, plan] = path_and_plan(shape, impl, dev);
  const size_t ws_floats = tree_verify_mla_workspace_floats(shape, plan);
  at::Tensor workspace;
  if (ws_floats > 0) workspace = at::empty({static_cast<int64_t>(ws_floats)}, q.options().dtype(at::kFloat));

  TreeVerifyMlaArgs args{};
  args.q = reinterpret_cast<const __nv_bfloat16*>(q.data_ptr<at::BFloat16>());
  args.kv = reinterpret_cast<const __nv_bfloat16*>(kv.data_ptr<at::BFloat16>());
  args.past_lens = past_lens.data_ptr<int32_t>();
  args.anc = reinterpret_cast<const uint64_t*>(anc.data_ptr<int64_t>());
  args.o_lat = reinterpret_cast<__nv_bfloat16*>(o_lat.data_ptr<at::BFloat16>());
  args.lse = lse.data_ptr<float>();
  args.workspace = ws_floats > 0 ? workspace.data_ptr<float>() : nullptr;
  args.shape = shape;
  args.scale = scale;
  args.plan = plan;
  args.path = path;
  const cudaError_t err = tree_verify_mla_launch(args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "tree_verify_mla: launch failed: ", kdb::fmt(cudaGetErrorString(err)));
  return {o_lat, lse};
}

std::vector<int64_t> tree_verify_mla_plan(int64_t batch, int64_t nodes, int64_t heads, int64_t cache_len,
                                          const std::string& impl) {
  TORCH_CHECK(batch >= 1, "tree_verify_mla_plan: batch must be >= 1, got ", kdb::fmt(batch));
  const TreeVerifyMlaShape shape = checked_shape("tree_verify_mla_plan", batch, nodes, heads, cache_len);
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  const TvmPlan plan = path_and_plan(shape, impl, dev).second;
  return {plan.num_splits, plan.tail_start, plan.tail_pieces};
}

}  // namespace kdb
