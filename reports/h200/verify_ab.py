"""tree_verify_mla: the wgmma path against the mma.sync path on a few benchmark shapes, same process, same
inputs (CUDA events, L2 flushed, median of 10), with the floor from the family's formulas and the measured
ceilings. A quick A/B before the full grid. Writes OUT/verify_ab.json. Usage: python3 verify_ab.py OUT_DIR"""
import json
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.families.tree_verify_mla import SCALE
from kdbench.references.tree_verify_mla import pack_anc_bits

out, rows = sys.argv[1], []
ceil = timing.ceilings("cuda")
g = torch.Generator(device="cuda").manual_seed(7)
for b, h, t, past in [(8, 128, 256, 8192), (16, 64, 65, 8192), (8, 64, 64, 32768), (32, 8, 17, 32768),
                      (1, 64, 65, 8192), (8, 16, 16, 1024)]:
    q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
    kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
    lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
    chain = np.tril(np.ones((t, t), dtype=bool))               # a chain: each node sees all earlier nodes
    anc_t = torch.from_numpy(pack_anc_bits(chain).view(np.int64)).to("cuda").expand(b, t, -1).contiguous()
    flops = 2176.0 * h * t * b * (past + t)
    nbytes = b * (past + t) * 576 * 2 + b * t * h * (576 * 2 + 512 * 2 + 4)
    floor = max(nbytes / ceil.copy_bytes_per_s, flops / ceil.bf16_flops_per_s)
    res = {}
    for impl in ("mma", "wgmma"):
        m = timing.measure(lambda: cuda_ext.tree_verify_mla(q, kv, lens, anc_t, SCALE, impl), warmup=2,
                           repeat=10, device="cuda", flush_l2=True)
        res[impl] = m
    o_m, l_m = cuda_ext.tree_verify_mla(q, kv, lens, anc_t, SCALE, "mma")
    o_w, l_w = cuda_ext.tree_verify_mla(q, kv, lens, anc_t, SCALE, "wgmma")
    diff_o = float((o_m.float() - o_w.float()).abs().max())
    diff_l = float((l_m - l_w).abs().max())
    row = dict(batch=b, heads=h, nodes=t, past_len=past, floor_s=floor, max_abs_o_diff=diff_o,
               max_abs_lse_diff=diff_l, **{f"{k}_median_s": v.median_s for k, v in res.items()},
               **{f"{k}_samples_s": v.samples_s for k, v in res.items()})
    rows.append(row)
    print(f"B{b} H{h} T{t} ctx{past}: floor {floor*1e3:.3f} ms | mma {res['mma'].median_s*1e3:.3f} ms "
          f"({100*floor/res['mma'].median_s:.1f}%) | wgmma {res['wgmma'].median_s*1e3:.3f} ms "
          f"({100*floor/res['wgmma'].median_s:.1f}%) | diff o {diff_o:.2e} lse {diff_l:.2e}", flush=True)
with open(f"{out}/verify_ab.json", "w") as fh:
    json.dump({"ceilings": ceil.__dict__, "rows": rows}, fh, indent=1)
