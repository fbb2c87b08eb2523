"""tree_build on the GPU: the vocabulary pass alone and the whole build on the grid batch 1/8/32/64 x budget
16/64/256/1024 x V 32000/163840 (L 15, bf16 logits), CUDA events after warm-up (median, p20, p80), the read-once
memory floor beside each, torch topk + logsumexp as the vocabulary baseline, tokens of request 0 checked against
the reference, and the whole build's outputs of the last timed call (PDL on and off) equal to an untimed one. Since round 4 the
merge and the builder launch as programmatic dependents (PDL); each shape also times them with KDB_PDL=0 (plain
stream order), alternating with the default in ABBA rounds in this process; batch 1 and 8 also per build inside a CUDA
graph of 8 builds on 8 logits copies (graph_build). Writes OUT/tree_build_grid.json
after every shape. Usage: python3 THIS OUT_DIR"""
import json
import os
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.references.tree_build import topk_logprobs

L = 15
out, rows = sys.argv[1], []
ceil = timing.ceilings("cuda")


def summary(t):
    return {"median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s}


def torch_vocab(x, k):
    xf = x.float()
    top = torch.topk(xf, k, dim=-1)
    return top.values - torch.logsumexp(xf, dim=-1, keepdim=True), top.indices


def with_pdl(on, fn):
    """fn with KDB_PDL set for its launches (read by kdb::launch_pdl at every launch)."""
    def call():
        os.environ["KDB_PDL"] = "1" if on else "0"
        return fn()
    return call


def pdl_contenders(logits, k, budgets, roots, past, budget):
    vocab = lambda: cuda_ext.tree_build_topk(logits, k)                              # noqa: E731
    build = lambda: cuda_ext.tree_build(logits, budgets, roots, past, budget)        # noqa: E731
    return {name: timing.Contender(with_pdl(on, fn), "cuda") for name, on, fn in (
        ("vocab_pass", True, vocab), ("vocab_pass_no_pdl", False, vocab),
        ("whole_build", True, build), ("whole_build_no_pdl", False, build))}


GRAPH_REPLICAS = 8


def graph_build(logits, budgets, roots, past, budget):
    """Per build inside one CUDA graph of GRAPH_REPLICAS whole builds, each on its own copy of the logits (cold
    after the flush), as the engine replays its step: the host launch cost is not paid per build there."""
    os.environ["KDB_PDL"] = "1"   # the default (the ABBA rounds before may have left it off)
    copies = [logits.clone() for _ in range(GRAPH_REPLICAS)]
    cuda_ext.tree_build(copies[0], budgets, roots, past, budget)   # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [cuda_ext.tree_build(c, budgets, roots, past, budget) for c in copies]
    t = timing.measure(g.replay, warmup=2, repeat=11, device="cuda")
    direct = cuda_ext.tree_build(logits, budgets, roots, past, budget)
    same = all(torch.equal(x, y) for o in outs for x, y in zip(o, direct))
    return {"replicas": GRAPH_REPLICAS, "per_build_median_s": t.median_s / GRAPH_REPLICAS,
            "per_build_p20_s": t.p20_s / GRAPH_REPLICAS, "per_build_p80_s": t.p80_s / GRAPH_REPLICAS,
            "outputs_equal": same}


for v in (163840, 32000):        # the headline shapes first: a call cut short still has them
    for b in (1, 32, 8, 64):
        logits = torch.randn(b, L, v, device="cuda").mul_(3).bfloat16()
        roots = torch.zeros(b, dtype=torch.int64, device="cuda")
        past = torch.full((b,), 100, dtype=torch.int32, device="cuda")
        for budget in (16, 64, 256, 1024):
            k = min(budget, v)
            budgets = torch.full((b,), budget, dtype=torch.int32, device="cuda")
            res = timing.rounds(pdl_contenders(logits, k, budgets, roots, past, budget), warmup=2, repeat=12,
                                keep_outputs=True)
            vp, wb = res["vocab_pass"], res["whole_build"]
            want = cuda_ext.tree_build(logits, budgets, roots, past, budget)
            same = all(torch.equal(x, y) for name in ("whole_build", "whole_build_no_pdl")
                       for x, y in zip(res[name].outputs[-1], want))
            tv = timing.measure(lambda: torch_vocab(logits, k), warmup=1, repeat=5, device="cuda")
            top_lp, top_tok, _ = cuda_ext.tree_build_topk(logits, k)
            ref_lp, ref_tok = topk_logprobs(logits[0].float().cpu().numpy(), k)
            floor = logits.numel() * 2 / ceil.copy_bytes_per_s        # bf16 logits read once
            row = dict(batch=b, budget=budget, vocab=v, floor_s=floor, vocab_pass=summary(vp),
                       whole_build=summary(wb), torch_vocab=summary(tv), timed_outputs_equal=same,
                       vocab_pass_no_pdl=summary(res["vocab_pass_no_pdl"]),
                       whole_build_no_pdl=summary(res["whole_build_no_pdl"]),
                       vocab_x_floor=vp.median_s / floor, build_target_s=3 * floor + 10e-6,
                       tokens_exact=bool(np.array_equal(top_tok[0].cpu().numpy(), ref_tok)),
                       max_abs_lp_err=float(np.abs(top_lp[0].cpu().numpy() - ref_lp).max()))
            if b in (1, 8) and v == 163840:
                row["whole_build_graph"] = graph_build(logits, budgets, roots, past, budget)
            rows.append(row)
            print(f"B{b:>2} budget {budget:>4} V{v}: floor {floor*1e6:6.1f} us | vocab {vp.median_s*1e6:7.1f} us "
                  f"({vp.median_s/floor:5.1f}x) | build {wb.median_s*1e6:7.1f} us (target {row['build_target_s']*1e6:.1f}) "
                  f"| no PDL {res['vocab_pass_no_pdl'].median_s*1e6:7.1f} / {res['whole_build_no_pdl'].median_s*1e6:7.1f} us "
                  f"| torch vocab {tv.median_s*1e6:7.1f} us | exact {row['tokens_exact']} timed {same} "
                  f"err {row['max_abs_lp_err']:.1e}",
                  flush=True)
            if "whole_build_graph" in row:   # (before s5 call C this line came before its row's line)
                print(f"  graph of {GRAPH_REPLICAS}: {row['whole_build_graph']['per_build_median_s']*1e6:7.1f} us per "
                      f"build, outputs equal {row['whole_build_graph']['outputs_equal']}", flush=True)
            with open(f"{out}/tree_build_grid.json", "w") as fh:
                json.dump({"ceilings": ceil.__dict__, "rows": rows}, fh, indent=1)
