"""tree_build on the GPU: the vocabulary pass alone and the whole build on the grid batch 1/8/32/64 x budget
16/64/256/1024 x V 32000/163840 (L 15, bf16 logits), CUDA events after warm-up (median, p20, p80), the read-once
memory floor beside each, torch topk + logsumexp as the vocabulary baseline, tokens of request 0 checked against
the reference, and the whole build's outputs of the last timed call of every contender equal to an untimed one.
Since round 5 (plans/0004) split bf16 rows of <= 128 rows take the one-launch register path (csrc/tree_build_reg.h);
where it applies each shape also times the admission path (KDB_TB_REG=0), and at batch 32 / 64 the register path
forced (KDB_TB_REG=2), alternating with the default in ABBA rounds in this process; batch 1 and 8 also per build
inside a CUDA graph of 8 builds on 8 logits copies (graph_build), for both paths. Writes OUT/tree_build_grid.json
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


def with_knob(value, fn):
    """fn with KDB_TB_REG set for its launches (None: unset, the default plan; read by the plan at every call)."""
    def call():
        if value is None:
            os.environ.pop("KDB_TB_REG", None)
        else:
            os.environ["KDB_TB_REG"] = value
        return fn()
    return call


def reg_applies(rows, v, k, forced_any=False):
    """Mirror of tree_build.cu's reg_wanted for bf16 logits in 16-byte vectors."""
    splits = -(-(-(-v // 4096)) // 2)
    return (forced_any or rows <= 128) and v % 8 == 0 and v <= 1 << 18 and k <= 256 and splits > 1 and splits * k <= 6144


def knob_contenders(logits, k, budgets, roots, past, budget):
    """The default plan, and beside it the admission path where the register path is the default (B <= 8) or the
    register path forced where it is not (B >= 32)."""
    vocab = lambda: cuda_ext.tree_build_topk(logits, k)                              # noqa: E731
    build = lambda: cuda_ext.tree_build(logits, budgets, roots, past, budget)        # noqa: E731
    rows, v = logits.shape[0] * logits.shape[1], logits.shape[2]
    other = ("admission", "0") if reg_applies(rows, v, k) else (("reg_forced", "2") if reg_applies(rows, v, k, True)
                                                                 else None)
    knobs = [("", None)] + ([("_" + other[0], other[1])] if other else [])
    out = {}
    for suffix, value in knobs:
        out["vocab_pass" + suffix] = timing.Contender(with_knob(value, vocab), "cuda")
        out["whole_build" + suffix] = timing.Contender(with_knob(value, build), "cuda")
    return out


GRAPH_REPLICAS = 8


def graph_build(logits, budgets, roots, past, budget, knob=None):
    """Per build inside one CUDA graph of GRAPH_REPLICAS whole builds, each on its own copy of the logits (cold
    after the flush), as the engine replays its step: the host launch cost is not paid per build there. The plan
    (KDB_TB_REG = knob) is fixed at capture."""
    with_knob(knob, lambda: None)()
    copies = [logits.clone() for _ in range(GRAPH_REPLICAS)]
    cuda_ext.tree_build(copies[0], budgets, roots, past, budget)   # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [cuda_ext.tree_build(c, budgets, roots, past, budget) for c in copies]
    t = timing.measure(g.replay, warmup=2, repeat=11, device="cuda")
    direct = cuda_ext.tree_build(logits, budgets, roots, past, budget)
    same = all(torch.equal(x, y) for o in outs for x, y in zip(o, direct))
    with_knob(None, lambda: None)()
    return {"replicas": GRAPH_REPLICAS, "knob": knob, "per_build_median_s": t.median_s / GRAPH_REPLICAS,
            "per_build_p20_s": t.p20_s / GRAPH_REPLICAS, "per_build_p80_s": t.p80_s / GRAPH_REPLICAS,
            "outputs_equal": same}


def shape_row(b, v, budget, logits, roots, past):
    k = min(budget, v)
    budgets = torch.full((b,), budget, dtype=torch.int32, device="cuda")
    res = timing.rounds(knob_contenders(logits, k, budgets, roots, past, budget), warmup=2, repeat=12,
                        keep_outputs=True)
    with_knob(None, lambda: None)()
    vp, wb = res["vocab_pass"], res["whole_build"]
    want = cuda_ext.tree_build(logits, budgets, roots, past, budget)
    same = all(torch.equal(x, y) for name in res if name.startswith("whole_build")
               for x, y in zip(res[name].outputs[-1], want))
    tv = timing.measure(lambda: torch_vocab(logits, k), warmup=1, repeat=5, device="cuda")
    top_lp, top_tok, _ = cuda_ext.tree_build_topk(logits, k)
    ref_lp, ref_tok = topk_logprobs(logits[0].float().cpu().numpy(), k)
    floor = logits.numel() * 2 / ceil.copy_bytes_per_s        # bf16 logits read once
    row = dict(batch=b, budget=budget, vocab=v, floor_s=floor, torch_vocab=summary(tv), timed_outputs_equal=same,
               vocab_x_floor=vp.median_s / floor, build_target_s=3 * floor + 10e-6,
               reg_default=reg_applies(b * L, v, k),
               tokens_exact=bool(np.array_equal(top_tok[0].cpu().numpy(), ref_tok)),
               max_abs_lp_err=float(np.abs(top_lp[0].cpu().numpy() - ref_lp).max()))
    row.update({name: summary(t) for name, t in res.items()})
    others = " | ".join(f"{n} {t.median_s*1e6:7.1f} us" for n, t in res.items() if n not in ("vocab_pass", "whole_build"))
    print(f"B{b:>2} budget {budget:>4} V{v} (reg {row['reg_default']}): floor {floor*1e6:6.1f} us | vocab "
          f"{vp.median_s*1e6:7.1f} us ({vp.median_s/floor:5.1f}x) | build {wb.median_s*1e6:7.1f} us (target "
          f"{row['build_target_s']*1e6:.1f}) | {others or '-'} | torch vocab {tv.median_s*1e6:7.1f} us | exact "
          f"{row['tokens_exact']} timed {same} err {row['max_abs_lp_err']:.1e}", flush=True)
    if b in (1, 8) and v == 163840:
        row["whole_build_graph"] = graph_build(logits, budgets, roots, past, budget)
        if row["reg_default"]:
            row["whole_build_graph_admission"] = graph_build(logits, budgets, roots, past, budget, "0")
        print("  graph of %d: %s" % (GRAPH_REPLICAS, " | ".join(
            f"{n} {row[n]['per_build_median_s']*1e6:7.1f} us per build, equal {row[n]['outputs_equal']}"
            for n in ("whole_build_graph", "whole_build_graph_admission") if n in row)), flush=True)
    return row


for v in (163840, 32000):        # the headline shapes first: a call cut short still has them
    for b in (1, 8, 32, 64):
        logits = torch.randn(b, L, v, device="cuda").mul_(3).bfloat16()
        roots = torch.zeros(b, dtype=torch.int64, device="cuda")
        past = torch.full((b,), 100, dtype=torch.int32, device="cuda")
        for budget in (16, 64, 256, 1024):
            rows.append(shape_row(b, v, budget, logits, roots, past))
            with open(f"{out}/tree_build_grid.json", "w") as fh:
                json.dump({"ceilings": ceil.__dict__, "rows": rows}, fh, indent=1)
