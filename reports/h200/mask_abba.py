"""tree_verify_mla v4: the tree mask's cost in alternating rounds (chain, random, random, chain, ...), with the SM clock
read after each block, on the shapes where verify_ab.py's one-order rounds disagreed (s9 call D: B8 H64 T64 ctx32K
+7.3 .. +13.6 % in three rounds, v3 -3.2 .. -3.7 %). Same inputs and trees as verify_ab.py (seed 7, the family's
trees). Prints one line per block and the median of the per-round ratios. Usage: python3 mask_abba.py OUT_DIR"""
import json
import sys

import numpy as np
import pynvml
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.families.tree_verify_mla import SCALE, _tree_visibility
from kdbench.references.tree_verify_mla import pack_anc_bits

SHAPES = [(8, 64, 64, 32768), (8, 128, 257, 8192), (16, 64, 65, 8192)]
ROUNDS, REPEAT = 8, 6
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
g = torch.Generator(device="cuda").manual_seed(7)
rng = np.random.default_rng(7)
rows = []
for b, h, t, past in SHAPES:
    q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
    kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
    lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
    trees = {k: torch.from_numpy(pack_anc_bits(_tree_visibility(t, k, rng)).view(np.int64)).to("cuda")
             .expand(b, t, -1).contiguous() for k in ("chain", "random")}
    ratios = []
    for r in range(ROUNDS):
        med = {}
        for kind in (("chain", "random") if r % 2 == 0 else ("random", "chain")):
            m = timing.measure(lambda: cuda_ext.tree_verify_mla(q, kv, lens, trees[kind], SCALE, "seesaw"), warmup=1,
                               repeat=REPEAT, device="cuda", flush_l2=True)
            clock = pynvml.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM)
            med[kind] = m.median_s
            rows.append(dict(batch=b, heads=h, nodes=t, past_len=past, round=r, tree=kind, median_s=m.median_s,
                             samples_s=m.samples_s, sm_clock_mhz=clock))
            print(f"B{b} H{h} T{t} ctx{past} round {r} {kind:6s} {m.median_s * 1e3:.3f} ms "
                  f"(p20 {m.p20_s * 1e3:.3f}, p80 {m.p80_s * 1e3:.3f}) SM {clock} MHz", flush=True)
        ratios.append(med["random"] / med["chain"] - 1)
    print(f"B{b} H{h} T{t} ctx{past}: mask cost per round {' '.join(f'{100 * x:+.1f}%' for x in ratios)}; "
          f"median {100 * float(np.median(ratios)):+.1f}%", flush=True)
    del q, kv
with open(f"{sys.argv[1]}/mask_abba.json", "w") as fh:
    json.dump(rows, fh, indent=1)
