"""tree_build with the vocabulary stream's L2 prefetch depth forced (KDB_TB_PREFETCH: vector chunks of 4096 logits
requested from L2 ahead of the register loads; 0 = none, the s15 kernel), L 15, V 163840, bf16: does asking L2 for
the next chunks hide the DRAM latency that keeps the unsplit rows (batch >= 32) at ~1.35x their floor even without
admission (plans/0004 "Session 16")? One process, every depth of a shape in ABBA rounds (timing.rounds: L2 flushed,
CUDA events, median of 16); the vocabulary pass at every depth, the whole build (budget = k) at depths 0 and 4. A
prefetch is a hint, so every depth's last timed outputs must equal depth 0's bit for bit; depth 0's tokens of request
0 are checked against the float64 reference. Writes OUT/tb_prefetch_sweep.json after every shape.
Usage: python3 THIS OUT_DIR"""
import json
import os
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.references.tree_build import topk_logprobs

L, V = 15, 163840
DEPTHS = (0, 2, 4, 8)
BUILD_DEPTHS = (0, 4)
SHAPES = ((32, 16), (32, 256), (64, 16), (64, 256), (8, 64), (8, 256), (1, 16), (1, 64), (1, 256))


def at_depth(d: int, fn):
    def call():
        os.environ["KDB_TB_PREFETCH"] = str(d)   # read by tree_build_topk_plan at every launch
        return fn()
    return call


def shape_row(b: int, k: int, ceil) -> dict:
    logits = torch.randn(b, L, V, device="cuda").mul_(3).bfloat16()
    budgets = torch.full((b,), k, dtype=torch.int32, device="cuda")
    roots = torch.zeros(b, dtype=torch.int64, device="cuda")
    past = torch.full((b,), 100, dtype=torch.int32, device="cuda")
    vocab = lambda: cuda_ext.tree_build_topk(logits, k, 0)                          # noqa: E731
    build = lambda: cuda_ext.tree_build(logits, budgets, roots, past, k)            # noqa: E731
    contenders = {f"vocab_pf{d}": timing.Contender(at_depth(d, vocab), "cuda") for d in DEPTHS}
    contenders |= {f"build_pf{d}": timing.Contender(at_depth(d, build), "cuda") for d in BUILD_DEPTHS}
    res = timing.rounds(contenders, warmup=2, repeat=16, keep_outputs=True)
    os.environ["KDB_TB_PREFETCH"] = "0"
    want = {"vocab": vocab(), "build": build()}
    _, ref_tok = topk_logprobs(logits[0].float().cpu().numpy(), k)
    floor_s = b * L * V * 2 / ceil.copy_bytes_per_s
    row = {"batch": b, "k": k, "vocab": V, "floor_s": floor_s,
           "depth0_tokens_exact": bool(np.array_equal(want["vocab"][1][0].cpu().numpy(), ref_tok))}
    for name, t in res.items():
        if isinstance(t, Exception):
            row[name] = {"error": repr(t)}
            continue
        got = t.outputs[-1]
        ref = want[name.split("_")[0]]
        row[name] = {"median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s,
                     "bits_equal": all(torch.equal(x, y) for x, y in zip(got, ref))}
    print(f"B{b} k {k} (floor {floor_s * 1e6:.1f} us): " + " | ".join(
        f"{n} {row[n]['median_s'] * 1e6:6.1f} us" for n in res if "median_s" in row[n])
        + f" | depth-0 tokens exact {row['depth0_tokens_exact']}; bits equal "
        f"{all(row[n].get('bits_equal', False) for n in res)}", flush=True)
    return row


if __name__ == "__main__":
    ceil = timing.ceilings("cuda")
    rows = []
    for b, k in SHAPES:
        rows.append(shape_row(b, k, ceil))
        with open(f"{sys.argv[1]}/tb_prefetch_sweep.json", "w") as fh:
            json.dump({"depths": DEPTHS, "build_depths": BUILD_DEPTHS, "copy_bytes_per_s": ceil.copy_bytes_per_s,
                       "rows": rows}, fh, indent=1)
