"""The tree_build vocabulary pass alone (fused top-K + logsumexp, `tree_build_topk`) against its memory floor
and against torch.topk + logsumexp, checked against the reference's topk_logprobs on two rows per case.
Writes OUT/vocab_pass.json. Usage: python3 reports/h200/time_vocab_pass.py OUT_DIR"""
import json
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.references.tree_build import topk_logprobs

out, rows = sys.argv[1], []
ceil = timing.ceilings("cuda")
for b, k, v in [(32, 256, 163840), (64, 1024, 163840), (1, 64, 163840), (32, 256, 32000)]:
    logits = torch.randn(b, 15, v, device="cuda", dtype=torch.float32).mul_(3).bfloat16()
    fused = timing.measure(lambda: cuda_ext.tree_build_topk(logits, k), warmup=3, repeat=20, device="cuda")

    def torch_path():
        x = logits.float()
        top = torch.topk(x, k, dim=-1)
        return top.values - torch.logsumexp(x, dim=-1, keepdim=True), top.indices

    base = timing.measure(torch_path, warmup=3, repeat=20, device="cuda")
    top_lp, top_tok, _ = cuda_ext.tree_build_topk(logits, k)
    ref_lp, ref_tok = topk_logprobs(logits[0].float().cpu().numpy(), k)
    exact_tokens = bool(np.array_equal(top_tok[0].cpu().numpy(), ref_tok))
    lp_err = float(np.abs(top_lp[0].cpu().numpy() - ref_lp).max())
    floor = logits.numel() * 2 / ceil.copy_bytes_per_s          # bf16 logits read once
    rows.append(dict(batch=b, k=k, vocab=v, fused_median_s=fused.median_s, torch_median_s=base.median_s,
                     floor_s=floor, x_floor=fused.median_s / floor, tokens_exact=exact_tokens,
                     max_abs_lp_err=lp_err, fused_samples_s=fused.samples_s, torch_samples_s=base.samples_s))
    print(f"B{b} K{k} V{v}: fused {fused.median_s*1e6:.1f} us = {fused.median_s/floor:.2f}x floor "
          f"({floor*1e6:.1f} us); torch {base.median_s*1e6:.1f} us; tokens exact {exact_tokens}, lp err {lp_err:.2e}")
with open(f"{out}/vocab_pass.json", "w") as fh:
    json.dump({"ceilings": ceil.__dict__, "rows": rows}, fh, indent=1)
