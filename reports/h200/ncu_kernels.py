"""One launch each of the kernels worth profiling, for Nsight Compute (ncu reads the counters on the H200):
the vocabulary pass at B 32 / K 256 / V 163840 and tree_verify_mla (wgmma, then mma.sync) at B 16 / H 64 /
T 65 / ctx 8192. Usage: ncu --clock-control none -k regex:'topk|tree_verify_mla_kernel' python3 ncu_kernels.py"""
import numpy as np
import torch

from kdbench.backends import cuda_ext
from kdbench.families.tree_verify_mla import SCALE
from kdbench.references.tree_verify_mla import pack_anc_bits

g = torch.Generator(device="cuda").manual_seed(3)
logits = (3 * torch.randn(32, 15, 163840, generator=g, device="cuda")).bfloat16()
cuda_ext.tree_build_topk(logits, 256)
b, h, t, past = 16, 64, 65, 8192
q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
anc = torch.from_numpy(pack_anc_bits(np.tril(np.ones((t, t), dtype=bool))).view(np.int64)).cuda()
lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
for impl in ("wgmma", "mma"):
    cuda_ext.tree_verify_mla(q, kv, lens, anc.expand(b, t, -1).contiguous(), SCALE, impl)
torch.cuda.synchronize()
print("ncu_kernels: done")
