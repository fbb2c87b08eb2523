"""Run every kdbench_cuda kernel once on small, odd-sized inputs, for compute-sanitizer (memcheck,
racecheck). Usage: compute-sanitizer --tool memcheck python3 reports/h200/sanitize_kernels.py"""
import torch

from kdbench.backends import cuda_ext
from kdbench.references import tree_build as ref

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
# tree_build: budgets 1 / 7 / 65 (two mask words), V not a multiple of the block, bf16 and fp32 logits
for dtype in (torch.bfloat16, torch.float32):
    logits = torch.randn(3, 15, 1001, generator=g, device=dev).to(dtype)
    budgets = torch.tensor([1, 7, 65], dtype=torch.int32, device=dev)
    roots = torch.tensor([5, 6, 7], dtype=torch.int64, device=dev)
    past = torch.tensor([1, 63, 4097], dtype=torch.int32, device=dev)
    tree = cuda_ext.tree_build(logits, budgets, roots, past, 65)
    cuda_ext.tree_build_topk(logits, 65)
    # V split across blocks and merged (forced splits; batch 1 picks them itself): a short last split
    split_logits = torch.randn(1, 3, 9001, generator=g, device=dev).to(dtype)
    cuda_ext.tree_build_topk(split_logits, 65, 3)
    cuda_ext.tree_build(split_logits, budgets[:1], roots[:1], past[:1], 65)
# tree_accept greedy and sampled on that tree
target = torch.randint(0, 1001, tree.tokens.shape, generator=g, device=dev)
cuda_ext.tree_accept_greedy(tree.tokens, tree.first_child, tree.next_sibling, tree.n_nodes, target, 15)
probs = torch.softmax(torch.randn(3, 66, 1001, generator=g, device=dev), -1)
u = torch.rand(3, 66, dtype=torch.float64, generator=g, device=dev)
res = cuda_ext.tree_accept_sampled(tree.tokens, tree.first_child, tree.next_sibling, tree.n_nodes, probs, u, 15)
# kv_compact, bf16 and fp32 caches
for dtype in (torch.bfloat16, torch.float32):
    cache = torch.randn(2, 3, 4097 + 66, 576, generator=g, device=dev).to(dtype)
    cuda_ext.kv_compact(cache, past, res.accepted, res.accept_len)
# tree_verify_mla: no split (many row tiles) and split-KV (batch 1, few rows), ragged, padding row, NaN slots
for b, h, t, past_len in ((2, 16, 65, 300), (1, 8, 17, 4097), (3, 8, 9, 191)):
    kv = torch.randn(b, past_len + t + 7, 576, generator=g, device=dev).to(torch.bfloat16)
    kv[:, past_len + t:] = float("nan")
    q = torch.randn(b, t, h, 576, generator=g, device=dev).to(torch.bfloat16)
    vis = torch.ones(t, t, dtype=torch.bool).tril()
    vis[-1] = False                                     # a padding row
    import numpy as np
    anc = torch.from_numpy(ref._pack_bits(vis.numpy(), (t + 63) // 64).view(np.int64)).to(dev)
    for impl in ("mma", "wgmma", "pingpong", "seesaw") if torch.cuda.get_device_capability() == (9, 0) else ("mma",):
        cuda_ext.tree_verify_mla(q, kv, torch.full((b,), past_len, dtype=torch.int32, device=dev),
                                 anc.expand(b, t, -1).contiguous(), 0.1309, impl)
torch.cuda.synchronize()
print("sanitize_kernels: all kernels ran")
