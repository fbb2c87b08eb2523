"""kv_compact (cuda) at the scenario's bench shapes B 64 and B 128, on the very inputs of the committed
scenario rows (same case, same seed: `make_inputs(case, derive_seed(seed, "trial", 0))`), checked against the
reference and timed like the kernel kind (warm-up 2, 10 samples, L2 flushed, launch shield). Lets a kernel
change be compared with reports/h200/2026-11-30 row for row. Usage: python3 time_kv_compact.py OUT_DIR"""
import json
import os
import sys

from kdbench import config, families, timing
from kdbench.config import derive_seed

out, rows = sys.argv[1], []
os.makedirs(out, exist_ok=True)
fam = families.get("kv_compact")
ceil = timing.ceilings("cuda")
cases = config.select(config.load("scenarios/kernels/kv_compact.yaml").cases, ["bench"])
for case in cases:
    if case.shape.batch < 64:
        continue
    inputs = fam.make_inputs(case, derive_seed(case.seed, "trial", 0))
    res = fam.check(fam.run("cuda", inputs, case, "cuda"), fam.reference(inputs, case), case.tolerance)
    t = timing.measure(fam.timed("cuda", inputs, case, "cuda"), warmup=case.timing.warmup,
                       repeat=case.timing.repeat, device="cuda", flush_l2=case.timing.flush_l2)
    floor = fam.bytes_moved(case, inputs) / ceil.copy_bytes_per_s
    rows.append({"case": case.name, "passed": res.passed, "median_s": t.median_s, "samples_s": t.samples_s,
                 "floor_s": floor, "pct_of_floor_rate": 100 * floor / t.median_s})
    print(f"{case.name}: check {'pass' if res.passed else 'FAIL ' + res.worst}; {t.median_s * 1e6:.1f} us, "
          f"floor {floor * 1e6:.1f} us = {100 * floor / t.median_s:.1f} %", flush=True)
with open(f"{out}/kv_compact_timing.json", "w") as fh:
    json.dump({"ceilings": ceil.__dict__, "rows": rows}, fh, indent=1)
