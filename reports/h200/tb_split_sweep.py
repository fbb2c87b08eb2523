"""tree_build's vocabulary pass at batch 1 and 8 (L 15, V 163840, bf16) with the split count forced (tree_build_topk's
`splits`; 0 = the plan's own choice): which split count the plan should take where the build misses its target most
(plans/0004 "Session 14"). One process, every split count of a shape timed in ABBA rounds (timing.rounds: L2 flushed,
CUDA events, median of 16), outputs of each count's last timed call checked against the plan's (tokens equal, log-probs
within 1e-5) and the plan's tokens against the float64 reference. Writes OUT/tb_split_sweep.json after every shape.
Usage: python3 THIS OUT_DIR"""
import json
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.references.tree_build import topk_logprobs

L, V = 15, 163840
SPLITS = (0, 4, 5, 8, 10, 20, 40)    # 40 chunks of 4096 logits: 40 splits = one chunk each


def shape_row(b: int, k: int) -> dict:
    logits = torch.randn(b, L, V, device="cuda").mul_(3).bfloat16()
    contenders = {f"splits_{s}": timing.Contender(lambda s=s: cuda_ext.tree_build_topk(logits, k, s), "cuda")
                  for s in SPLITS}
    res = timing.rounds(contenders, warmup=2, repeat=16, keep_outputs=True)
    plan_lp, plan_tok, _ = cuda_ext.tree_build_topk(logits, k, 0)
    ref_lp, ref_tok = topk_logprobs(logits[0].float().cpu().numpy(), k)
    row = {"batch": b, "k": k, "vocab": V,
           "plan_tokens_exact": bool(np.array_equal(plan_tok[0].cpu().numpy(), ref_tok))}
    for name, t in res.items():
        lp, tok, _ = t.outputs[-1]
        row[name] = {"median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s,
                     "tokens_equal": bool(torch.equal(tok, plan_tok)),
                     "max_lp_diff": float((lp - plan_lp).abs().max())}
    best = min(res, key=lambda n: res[n].median_s)
    print(f"B{b} k {k}: " + " | ".join(f"{n.removeprefix('splits_')} {res[n].median_s * 1e6:6.1f} us"
                                       for n in res) + f" | best {best}; plan exact {row['plan_tokens_exact']}; "
          f"equal {all(row[n]['tokens_equal'] and row[n]['max_lp_diff'] < 1e-5 for n in res)}", flush=True)
    return row


if __name__ == "__main__":
    rows = []
    for b in (1, 8):
        for k in (16, 64, 256):
            rows.append(shape_row(b, k))
            with open(f"{sys.argv[1]}/tb_split_sweep.json", "w") as fh:
                json.dump({"splits": SPLITS, "rows": rows}, fh, indent=1)
