"""Step time eager vs CUDA graph and the verify forward's share of the step, on kimi-k2-slice-2 (real widths,
2 layers), batch 8, DDTree budget 64, the block drafter (untrained, random; timing does not depend on its
quality), backend cuda. Writes OUT/graph_timing.json. Usage: python3 reports/h200/graph_timing.py OUT_DIR"""
import json
import sys

import numpy as np
import torch

from kdbench.engine.engine import target_from_preset
from kdbench.engine.graph import time_step_eager_vs_graph
from kdbench.engine.stages import Policy
from kdbench.model.drafter import BlockDrafter

out = sys.argv[1]
model = target_from_preset("kimi-k2-slice-2", seed=1, device="cuda", dtype=torch.bfloat16)
drafter = BlockDrafter.random(model, seed=2)
rng = np.random.default_rng(3)
prompts = [[int(t) for t in rng.integers(0, model.cfg.vocab_size, 128)] for _ in range(8)]
res = time_step_eager_vs_graph(model, drafter, prompts, Policy(kind="ddtree", budget=64), n_steps=10)
med = {k: float(np.median(v)) for k, v in res.items() if k.endswith("_s") and isinstance(v, list)}
summary = {"model": "kimi-k2-slice-2", "batch": 8, "budget": 64, "drafter": drafter.name, "median_s": med,
           "verify_share": res["verify_share"], "outside_verify_s": res["outside_verify_s"],
           "graph_speedup": med["eager_step_s"] / med["graph_step_s"], "raw": res}
with open(f"{out}/graph_timing.json", "w") as fh:
    json.dump(summary, fh, indent=1, default=float)
print(json.dumps({k: v for k, v in summary.items() if k != "raw"}, indent=1, default=float))
