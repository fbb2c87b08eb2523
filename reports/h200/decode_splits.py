"""Is tree_verify_mla's split cost model right on decode shapes? The AR decode step of kimi-k2-slice-2 spends ~16 us
per layer in the kernel and its combine for 64 query rows over ~1K keys (s11's forward profile), where the cost model
(csrc/tree_verify_mla_plan.h, kSplitOverheadTiles = 2) picks one split per KV tile. This times the op at the floor
scenario's shapes (H 64, past 1024, cache allocated to past + rows, as engine/floor.py) for forced split counts
(KDB_TVM_SPLITS) against the model's own choice, each as a CUDA graph of one call, rounds in alternating order
(the order reverses every round), median per setting; outputs of every setting are checked against the model's
plan's (one bf16 rounding of the combine apart at most). Writes OUT/decode_splits.json.
Usage (GPU machine, repo root): python3 reports/h200/decode_splits.py OUT_DIR"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.backends.chain_device import chain_anc

SHAPES = ((1, 1), (8, 1), (32, 1), (1, 65), (8, 65))   # (batch, rows): AR and verify of the e2e floor cases
SPLITS = (0, 1, 2, 4, 8, 17)                            # 0: the cost model's plan
H, PAST, ROUNDS, REPS = 64, 1024, 4, 20


def graph_us(fn) -> list[float]:
    return [1e6 * t for t in timing.graph_replays_s(fn, REPS)]


def with_splits(n: int, fn):
    os.environ["KDB_TVM_SPLITS"] = str(n)
    try:
        return fn()
    finally:
        os.environ.pop("KDB_TVM_SPLITS", None)


def case(batch: int, rows: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(batch * 100 + rows)
    S = PAST + rows
    q = (torch.randn(batch, rows, H, 576, generator=g, device="cuda") * 0.5).bfloat16()
    kv = (torch.randn(batch, S, 576, generator=g, device="cuda") * 0.5).bfloat16()
    lens = torch.full((batch,), PAST, dtype=torch.int32, device="cuda")
    anc = chain_anc(rows, batch, "cuda") if rows > 1 else torch.ones(batch, 1, 1, dtype=torch.int64, device="cuda")
    call = lambda: cuda_ext.tree_verify_mla(q, kv, lens, anc, 0.1)  # noqa: E731
    ref = call()[0].float()
    rec = {"batch": batch, "rows": rows, "heads": H, "past": PAST, "cache_len": S, "us": {}, "plans": {}, "max_rel": {}}
    for n in SPLITS:
        rec["plans"][n] = with_splits(n, lambda: cuda_ext.load().tree_verify_mla_plan(batch, rows, H, S, "auto"))
        got = with_splits(n, call)[0].float()
        rec["max_rel"][n] = float((got - ref).abs().max() / ref.abs().max())
    samples = {n: [] for n in SPLITS}
    for order in timing.round_orders(list(SPLITS), ROUNDS):
        for n in order:
            samples[n] += with_splits(n, lambda: graph_us(call))
    rec["us"] = {n: statistics.median(v) for n, v in samples.items()}
    rec["samples_us"] = samples
    print(f"B{batch} rows {rows}: " + "  ".join(f"{'auto' if n == 0 else n}:{rec['us'][n]:.1f} us "
                                                f"(plan {rec['plans'][n][0]})" for n in SPLITS), flush=True)
    return rec


def main(out_dir: str) -> None:
    out = [case(b, r) for b, r in SHAPES]
    bad = [(c["batch"], c["rows"], n, e) for c in out for n, e in c["max_rel"].items() if e > 1e-2]
    with open(f"{out_dir}/decode_splits.json", "w") as f:
        json.dump(out, f, indent=1)
    print("outputs agree across split counts" if not bad else f"MISMATCH: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main(sys.argv[1])
