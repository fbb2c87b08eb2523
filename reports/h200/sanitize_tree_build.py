"""The tree_build kernels alone (vocabulary pass unsplit, split + merge, sampled, builder) on small odd inputs, for
compute-sanitizer (memcheck, racecheck) within a short GPU call; sanitize_kernels.py runs every family.
Usage: compute-sanitizer --tool memcheck python3 reports/h200/sanitize_tree_build.py"""
import torch

from kdbench.backends import cuda_ext

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
for dtype in (torch.bfloat16, torch.float32):
    # unsplit; split with a short tail; split at k 16 (first_bound and merge_bound on every split)
    for b, v, budget in ((3, 1001, 65), (1, 9001, 65), (1, 20483, 1024), (1, 40961, 16)):
        # normal logits, then 9-value ties (the tied cut group is wider than K + K/2: the prunes' id-bit passes)
        normal = torch.randn(b, 15, v, generator=g, device=dev).mul_(3)
        ties = torch.randint(-4, 5, (b, 15, v), generator=g, device=dev).float().mul_(0.5)
        for logits in (normal.to(dtype), ties.to(dtype)):
            budgets = torch.full((b,), budget, dtype=torch.int32, device=dev)
            roots = torch.arange(b, dtype=torch.int64, device=dev)
            past = torch.full((b,), 63, dtype=torch.int32, device=dev)
            cuda_ext.tree_build(logits, budgets, roots, past, budget)
            cuda_ext.tree_build_topk(logits, min(budget, v), 3)
# the sampled estimate (k > 64 on >= 8 vector chunks per split) and its second stream, and k 64: 2 rows of V 163840,
# unsplit and 3 splits; the decoy rows put the unsplit sample's logits (bf16: the first 64 of every 2560, in 128-byte
# segments) above all others, so the unsplit rows stream a second time (the 3-split samples mostly miss the decoys)
for dtype in (torch.bfloat16, torch.float32):
    normal = torch.randn(1, 2, 163840, generator=g, device=dev).mul_(3)
    decoy = torch.randn(1, 2, 163840, generator=g, device=dev)
    # segment s (64 logits at 2560 s) at 10 + s / 16, a bf16 value of its own: fewer than k logits are >= the estimate
    decoy.view(1, 2, 64, 2560)[..., :64] = 10.0 + torch.arange(64, device=dev).view(64, 1) / 16
    ties = torch.randint(-4, 5, (1, 2, 163840), generator=g, device=dev).float().mul_(0.5)
    for logits in (normal.to(dtype), decoy.to(dtype), ties.to(dtype)):
        for splits in (1, 3):
            # k 1024, 300 and 256: the fixed-threshold stream (s22; its second stream on the decoys, fewer than k
            # logits >= the estimate, and on the ties, more than kCap) and the end's radix sort (s23; 300: two keys a
            # thread, padded); k 64: the unsampled kernel on bf16 vectors
            for k in (1024, 300, 256, 64):
                cuda_ext.tree_build_topk(logits, k, splits)
torch.cuda.synchronize()
print("sanitize_tree_build: all kernels ran")
