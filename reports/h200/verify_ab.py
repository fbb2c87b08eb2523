"""tree_verify_mla: the MMA paths against each other on the benchmark anchor shapes, same process, same inputs
(CUDA events, L2 flushed, median of 10), with the floor from the family's formulas and the measured ceilings;
each path on a chain tree and on a random tree of the same T (the mask's cost). A quick A/B before the grid.
Writes OUT/verify_ab.json. Usage: python3 verify_ab.py OUT_DIR [IMPL ...] (default: wgmma pingpong)"""
import json
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.families.tree_verify_mla import SCALE, _tree_visibility
from kdbench.references.tree_verify_mla import pack_anc_bits

SHAPES = [(16, 64, 65, 8192), (1, 64, 65, 8192), (32, 8, 17, 32768), (8, 128, 257, 8192), (64, 8, 9, 32768),
          (4, 64, 1025, 2048), (64, 16, 65, 4096), (32, 64, 9, 16384), (8, 128, 256, 8192), (8, 64, 64, 32768)]
out, impls = sys.argv[1], sys.argv[2:] or ["wgmma", "pingpong"]
rows = []
ceil = timing.ceilings("cuda")
g = torch.Generator(device="cuda").manual_seed(7)
rng = np.random.default_rng(7)


def anc_of(vis: np.ndarray, b: int) -> torch.Tensor:
    return torch.from_numpy(pack_anc_bits(vis).view(np.int64)).to("cuda").expand(b, vis.shape[0], -1).contiguous()


for b, h, t, past in SHAPES:
    q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
    kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
    lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
    trees = {kind: anc_of(_tree_visibility(t, kind, rng), b) for kind in ("chain", "random")}   # the family's trees
    flops = 2176.0 * h * t * b * (past + t)
    nbytes = b * (past + t) * 576 * 2 + b * t * h * (576 * 2 + 512 * 2 + 4)
    floor = max(nbytes / ceil.copy_bytes_per_s, flops / ceil.bf16_flops_per_s)
    row = dict(batch=b, heads=h, nodes=t, past_len=past, floor_s=floor)
    ref = None
    for impl in impls:
        for tree, anc in trees.items():
            m = timing.measure(lambda: cuda_ext.tree_verify_mla(q, kv, lens, anc, SCALE, impl), warmup=2,
                               repeat=10, device="cuda", flush_l2=True)
            row[f"{impl}_{tree}_median_s"] = m.median_s
        o, lse = cuda_ext.tree_verify_mla(q, kv, lens, trees["random"], SCALE, impl)
        if ref is None:
            ref = (o.float(), lse)
        row[f"{impl}_max_abs_o_diff"] = float((o.float() - ref[0]).abs().max())
        row[f"{impl}_max_abs_lse_diff"] = float((lse - ref[1]).abs().max())
    rows.append(row)
    cells = " | ".join(f"{i} chain {row[f'{i}_chain_median_s']*1e3:.3f} ms ({100*floor/row[f'{i}_chain_median_s']:.1f}%) "
                       f"tree {row[f'{i}_random_median_s']*1e3:.3f} (mask "
                       f"{100*(row[f'{i}_random_median_s']/row[f'{i}_chain_median_s']-1):+.1f}%) "
                       f"diff o {row[f'{i}_max_abs_o_diff']:.1e}" for i in impls)
    print(f"B{b} H{h} T{t} ctx{past}: floor {floor*1e3:.3f} ms | {cells}", flush=True)
    del q, kv
with open(f"{out}/verify_ab.json", "w") as fh:
    json.dump({"ceilings": ceil.__dict__, "impls": impls, "rows": rows}, fh, indent=1)
