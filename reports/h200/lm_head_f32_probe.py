"""Would the lm_head GEMM writing float32 logits itself pay, and would it keep AR and verify rows equal? The
target's logits are `(hidden @ W^T).float()` today: at verify batch 8 x 65 the `.float()` is one 242 us copy of
[520, 163840] bf16 (s12 call E's listing). `torch.mm(..., out_dtype=float32)` (the router gate's form, plans/0015)
skips both the bf16 rounding and the copy, but changes the logits' values (no bf16 rounding) and may pick other
cuBLAS kernels per M. This probe, not a shipped path, measures at kimi-k2's lm_head (hidden 7168, V 163840, bf16):
- per call, as CUDA graphs of 5 calls, ABBA over 4 rounds: bf16 GEMM + .float() against the float32-output GEMM,
  at M = 1, 8, 65, 520 rows;
- how far each is from the float64 product of the same bf16 values (max abs over the largest |logit|);
- row invariance: whether row 0 of an M-row call equals the 1-row call bit for bit, for both forms (greedy
  speculative decoding compares a verify row's argmax with AR's: a row that differs with M is a possible flip);
- argmax agreement between the two forms over the M = 520 rows.
Writes OUT/lm_head_f32_probe.json. Usage (GPU machine, repo root): python3 reports/h200/lm_head_f32_probe.py OUT_DIR"""
from __future__ import annotations

import json
import statistics
import sys

import torch

from kdbench import timing

HIDDEN, VOCAB, ROWS, ROUNDS, INNER = 7168, 163840, (1, 8, 65, 520), 4, 5
REF_ROWS = 65   # rows checked against float64 (a [520, V] float64 product would be 0.7 GB)


def forms(x, w):
    return {"bf16 GEMM + .float()": lambda: (x @ w.T).float(),
            "float32-output GEMM": lambda: torch.mm(x, w.T, out_dtype=torch.float32)}


def timed(x, w) -> dict:
    fs = forms(x, w)
    us = {k: [] for k in fs}
    for order in timing.round_orders(list(fs), ROUNDS):
        for k in order:
            us[k] += [1e6 * t for t in timing.graph_replays_s(fs[k], 10, INNER)]
    return {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)} for k, v in us.items()}


def main(out: str) -> None:
    g = torch.Generator(device="cuda").manual_seed(13)
    w = (torch.randn(VOCAB, HIDDEN, generator=g, device="cuda") * HIDDEN ** -0.5).bfloat16()
    xs = torch.randn(max(ROWS), HIDDEN, generator=g, device="cuda").bfloat16()
    ref = xs[:REF_ROWS].double() @ w.double().T
    res, one = {}, {k: f() for k, f in forms(xs[:1], w).items()}
    for m in ROWS:
        x = xs[:m]
        got = {k: f() for k, f in forms(x, w).items()}
        row, n = {"time": timed(x, w)}, min(m, REF_ROWS)
        for k, v in got.items():
            row[k] = {"err_over_max": float((v[:n].double() - ref[:n]).abs().max() / ref[:n].abs().max()),
                      "row0_equals_1_row_call": bool(torch.equal(v[:1], one[k]))}
        if m == max(ROWS):
            a, b = (got[k].argmax(-1) for k in got)
            row["argmax_agree"] = float((a == b).float().mean())
        res[m] = row
        print(m, json.dumps(row))
    with open(f"{out}/lm_head_f32_probe.json", "w") as fh:
        json.dump({"hidden": HIDDEN, "vocab": VOCAB, "rows": res, "gpu": torch.cuda.get_device_name()}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
