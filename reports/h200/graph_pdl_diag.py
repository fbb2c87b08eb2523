"""Why whole builds inside a CUDA graph ran slower than eager ones at budgets >= 32 (s5 call B, time_tree_build_grid's
graph_build): per build, eager and inside a graph of 8 builds on 8 logits copies, each with the merge and the builder
launched as programmatic dependents (KDB_PDL=1) and without (0, set before the capture), and the vocabulary pass alone
the same way; batch 1 and 8, budgets 16 / 64 / 256, V 163840, L 15, bf16. The whole-build graphs' outputs are checked
against an eager build (the vocabulary-pass graphs' are not). Writes OUT/graph_pdl_diag.json. Usage: python3 THIS OUT_DIR"""
import json
import os
import sys

import torch

from kdbench import timing
from kdbench.backends import cuda_ext

R, L, V = 8, 15, 163840
out, rows = sys.argv[1], []


def in_graph(fn, copies):
    fn(copies[0])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [fn(c) for c in copies]
    t = timing.measure(g.replay, warmup=2, repeat=11, device="cuda")
    return t.median_s / R, outs


for b in (1, 8):
    logits = torch.randn(b, L, V, device="cuda").mul_(3).bfloat16()
    copies = [logits.clone() for _ in range(R)]
    roots = torch.zeros(b, dtype=torch.int64, device="cuda")
    past = torch.full((b,), 100, dtype=torch.int32, device="cuda")
    for budget in (16, 64, 256):
        budgets = torch.full((b,), budget, dtype=torch.int32, device="cuda")
        build = lambda x: cuda_ext.tree_build(x, budgets, roots, past, budget)   # noqa: E731
        vocab = lambda x: cuda_ext.tree_build_topk(x, budget)                    # noqa: E731
        row = {"batch": b, "budget": budget}
        for pdl in ("1", "0"):
            os.environ["KDB_PDL"] = pdl
            want = build(logits)
            for name, fn in (("build", build), ("vocab", vocab)):
                row[f"{name}_eager_pdl{pdl}_s"] = timing.measure(lambda: fn(logits), warmup=2, repeat=11,
                                                                 device="cuda").median_s
                row[f"{name}_graph_pdl{pdl}_s"], outs = in_graph(fn, copies)
                if name == "build":
                    row[f"graph_pdl{pdl}_equal"] = all(torch.equal(x, y) for o in outs for x, y in zip(o, want))
        rows.append(row)
        print(" ".join(f"{k}={v*1e6:.1f}us" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        with open(f"{out}/graph_pdl_diag.json", "w") as fh:
            json.dump(rows, fh, indent=1)
