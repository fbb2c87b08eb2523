"""One launch each of the kernels whose targets are missed (plans/0004, issues 15 and 16), for Nsight Compute:
tree_verify_mla (ping-pong, the default until 2026-12-01 s6) at B16 H64 T65 ctx8K (compute-bound) and the two T = 9 long-context
shapes; the tree_build vocabulary pass, merge and builder at B 32 / budget 256, B 1 / budget 64 and B 8 / budget 64 (V 163840);
kv_compact at the bench shapes B 64 / 128 (61 layers); the Triton MoE experts of kimi-k2-slice-2's shape at 1, 8 and
520 rows (128 experts, below). Every input is random (seeded); nothing is timed here: ncu replays each kernel for its counters.
Usage: ncu --clock-control none --kernel-name regex:'...' ... python3 reports/h200/ncu_kernels.py [GROUP...]
(groups: verify build kv moe; default all). reports/h200/ncu_summary.py turns ncu's CSV into the plan's table."""
import sys

import numpy as np
import torch

from kdbench import config, families
from kdbench.backends import cuda_ext
from kdbench.config import derive_seed
from kdbench.families.tree_verify_mla import SCALE
from kdbench.references.tree_verify_mla import pack_anc_bits

VERIFY = ((16, 64, 65, 8192), (64, 8, 9, 32768), (32, 64, 9, 16384))   # (batch, heads, nodes, past)
BUILD = ((32, 256), (1, 64), (8, 64))                                 # (batch, budget); depth 15 rows each
MOE_ROWS = (1, 8, 520)
# The model's 384 experts are 33.8 GB of weights, which ncu's kernel replay would save and restore per pass;
# 128 experts (11.3 GB) keep the touched counts at 1 / 8 rows (8, ~44) and each expert tile's work the same;
# at 520 rows all 128 are touched with ~33 rows each (the model: ~236 with ~18).
MOE_EXPERTS = 128


def verify(g: torch.Generator) -> None:
    for b, h, t, past in VERIFY:
        q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
        kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
        anc = torch.from_numpy(pack_anc_bits(np.tril(np.ones((t, t), dtype=bool))).view(np.int64)).cuda()
        lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
        cuda_ext.tree_verify_mla(q, kv, lens, anc.expand(b, t, -1).contiguous(), SCALE, "pingpong")
        print(f"verify B{b} H{h} T{t} ctx{past}", flush=True)
        del q, kv


def build(g: torch.Generator) -> None:
    for b, budget in BUILD:
        logits = (3 * torch.randn(b, 15, 163840, generator=g, device="cuda")).bfloat16()
        budgets = torch.full((b,), budget, dtype=torch.int32, device="cuda")
        roots = torch.randint(0, 163840, (b,), generator=g, device="cuda")
        lens = torch.full((b,), 100, dtype=torch.int32, device="cuda")
        cuda_ext.tree_build(logits, budgets, roots, lens, budget)
        print(f"build B{b} budget {budget}", flush=True)


def kv() -> None:
    fam = families.get("kv_compact")
    for case in config.select(config.load("scenarios/kernels/kv_compact.yaml").cases, ["bench"]):
        if case.shape.batch >= 64:
            fam.timed("cuda", fam.make_inputs(case, derive_seed(case.seed, "trial", 0)), case, "cuda")()
            print(f"kv_compact {case.name}", flush=True)


def moe(g: torch.Generator) -> None:
    from kdbench.model import moe as tmoe
    from kdbench.model import moe_triton
    from kdbench.references.model_config import get_preset
    cfg = get_preset("kimi-k2-slice-2")
    e, mi, d = MOE_EXPERTS, cfg.moe_intermediate, cfg.hidden
    w1, w3 = (torch.randn(e, mi, d, generator=g, device="cuda").bfloat16() * d ** -0.5 for _ in range(2))
    w2 = torch.randn(e, d, mi, generator=g, device="cuda").bfloat16() * mi ** -0.5
    gate = torch.randn(e, d, generator=g, device="cuda").bfloat16() * d ** -0.5
    bias = torch.zeros(e, device="cuda")
    for n in MOE_ROWS:
        x = torch.randn(n, d, generator=g, device="cuda").bfloat16()
        idx, wts = tmoe.route(x, gate, bias, cfg)
        moe_triton.experts(x, idx, wts, w1, w2, w3)
        print(f"moe rows {n}: {int(torch.unique(idx).numel())} experts", flush=True)


if __name__ == "__main__":
    groups = sys.argv[1:] or ["verify", "build", "kv", "moe"]
    gen = torch.Generator(device="cuda").manual_seed(3)
    for grp in groups:
        {"verify": lambda: verify(gen), "build": lambda: build(gen), "kv": kv, "moe": lambda: moe(gen)}[grp]()
    torch.cuda.synchronize()
    print("ncu_kernels: done")
