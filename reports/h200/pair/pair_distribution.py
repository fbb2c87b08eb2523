"""T > 0 losslessness by distribution on the trained pair (issue 11 item 6), the full size for the H200:
ddtree (budget 64) against plain sampling at T = 0.8 and 1.0 over >= 20k generated tokens per arm (token and
lag-1 pair marginals, TV vs the permutation threshold), then the same check with each planted verify bug,
which must fail. Writes one JSON file. Usage: python3 reports/h200/pair/pair_distribution.py --device cuda --out F."""
import argparse
import json
import time
from dataclasses import asdict

import torch

from kdbench import distcheck, pair
from kdbench.corpus import CATEGORIES
from kdbench.engine.stages import Policy
from kdbench.prompts import token_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=8, help="per category")
    ap.add_argument("--copies", type=int, default=14)
    ap.add_argument("--new", type=int, default=64)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    target = pair.load_target(a.device, dtype)
    drafter = pair.load_drafter(target)
    prompts = [p for c in CATEGORIES for p in token_prompts(c, a.prompts, 64)]
    groups = [i for i in range(len(prompts)) for _ in range(a.copies)]
    policy, out = Policy(kind="ddtree", budget=64), {"policy": "ddtree(B=64)", "dtype": str(dtype), "rows": []}
    for temp in (0.8, 1.0):
        t0 = time.perf_counter()
        plain = distcheck.sample(target, None, prompts, a.copies, a.new, Policy(kind="ar"), temp, seed=1)
        for bug in [None] + sorted(distcheck.PLANTED):
            with torch.no_grad():
                spec = distcheck.sample(target, drafter, prompts, a.copies, a.new, policy, temp, seed=2, bug=bug)
            v = distcheck.compare(plain, spec, groups, target.cfg.vocab_size)
            row = {"temperature": temp, "planted_bug": bug, "same": v.same, **asdict(v),
                   "expected": "same" if bug is None else "caught", "ok": v.same == (bug is None),
                   "seconds": time.perf_counter() - t0}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
