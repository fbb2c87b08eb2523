"""tree_verify_mla v4 (seesaw) with its L2 prefetch depth forced (KDB_TVM_PREFETCH: KV tiles of 64 rows the unit's
M-tile-0 CTA asks L2 for beyond its two-stage TMA ring; 0 = none, the s15 kernel), on the grid shapes furthest from
their floor that stream KV at a high rate per FLOP (H 8-16, 32K context) and on compute-bound controls (plans/0004
"Session 16"). One process, every depth of a shape in ABBA rounds (timing.rounds: L2 flushed, CUDA events, 4 rounds,
median of 12); a prefetch is a hint, so every depth's last timed outputs must equal depth 0's bit for bit. Floor =
max(bytes / copy rate, FLOPs / bf16 rate) as the family counts them. Inputs: seed 7, random trees of the family.
Writes OUT/tvm_prefetch_ab.json after every shape. Usage: python3 THIS OUT_DIR"""
import json
import os
import sys

import numpy as np
import torch

from kdbench import timing
from kdbench.backends import cuda_ext
from kdbench.families.tree_verify_mla import SCALE, _tree_visibility
from kdbench.references.tree_verify_mla import pack_anc_bits

DEPTHS = (0, 2, 4)
SHAPES = [(64, 8, 9, 32768), (32, 8, 16, 32768), (1, 8, 16, 32768), (8, 8, 16, 32768), (32, 16, 16, 32768),
          (32, 64, 64, 32768), (32, 16, 256, 32768), (16, 64, 65, 8192), (32, 64, 64, 1024)]


def floor_s(b, h, t, past, ceil) -> float:
    kv_rows = b * (past + t)
    byts = kv_rows * 576 * 2 + b * t * h * (576 * 2 + 512 * 2 + 4)
    return max(byts / ceil.copy_bytes_per_s, 2176 * h * t * kv_rows / ceil.bf16_flops_per_s)


def at_depth(d: int, fn):
    def call():
        os.environ["KDB_TVM_PREFETCH"] = str(d)   # read by launch_seesaw at every launch
        return fn()
    return call


def shape_row(b, h, t, past, ceil, g, rng) -> dict:
    q = torch.randn(b, t, h, 576, generator=g, device="cuda").bfloat16()
    kv = torch.randn(b, past + t, 576, generator=g, device="cuda").bfloat16()
    lens = torch.full((b,), past, dtype=torch.int32, device="cuda")
    anc = torch.from_numpy(pack_anc_bits(_tree_visibility(t, "random", rng)).view(np.int64)).to("cuda") \
        .expand(b, t, -1).contiguous()
    fn = lambda: cuda_ext.tree_verify_mla(q, kv, lens, anc, SCALE, "seesaw")       # noqa: E731
    res = timing.rounds({f"pf{d}": timing.Contender(at_depth(d, fn), "cuda") for d in DEPTHS}, warmup=2, repeat=12,
                        keep_outputs=True)
    os.environ["KDB_TVM_PREFETCH"] = "0"
    want = fn()
    fl = floor_s(b, h, t, past, ceil)
    row = {"batch": b, "heads": h, "nodes": t, "past_len": past, "floor_s": fl}
    for name, r in res.items():
        if isinstance(r, Exception):
            row[name] = {"error": repr(r)}
            continue
        row[name] = {"median_s": r.median_s, "p20_s": r.p20_s, "p80_s": r.p80_s, "pct_floor": 100 * fl / r.median_s,
                     "bits_equal": all(torch.equal(x, y) for x, y in zip(r.outputs[-1], want))}
    print(f"B{b} H{h} T{t} ctx{past} (floor {fl * 1e3:.3f} ms): " + " | ".join(
        f"{n} {row[n]['median_s'] * 1e3:.3f} ms ({row[n]['pct_floor']:.1f} %)" for n in res if "median_s" in row[n])
        + f" | bits equal {all(row[n].get('bits_equal', False) for n in res)}", flush=True)
    return row


if __name__ == "__main__":
    ceil = timing.ceilings("cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    rng = np.random.default_rng(7)
    rows = []
    for shape in SHAPES:
        rows.append(shape_row(*shape, ceil, g, rng))
        torch.cuda.empty_cache()
        with open(f"{sys.argv[1]}/tvm_prefetch_ab.json", "w") as fh:
            json.dump({"depths": DEPTHS, "rows": rows}, fh, indent=1)
