"""Assemble the committed H200 findings run from the records the device calls brought back, re-derive the
roofline columns of tree_verify_mla rows with the current formula (actual ragged past lengths: the inputs
are regenerated from each case's recorded seed), and render the report.

Usage: python reports/h200/assemble.py reports/h200/2026-11-29
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

from kdbench import config, families, report
from kdbench.config import derive_seed
from kdbench.results import RunWriter, load_records

run = Path(sys.argv[1])
metas = [json.loads((run / f).read_text()) for f in ("meta_verify.json", "meta_part2.json", "meta_engine.json")]
cases = {c.name: c for c in config.load("scenarios/kernels/tree_verify_mla.yaml").cases}
records = load_records(run)
fam = families.get("tree_verify_mla")
for rec in records:
    if rec.family == "tree_verify_mla" and rec.scenario == "tree_verify_mla" and rec.case in cases:
        case = cases[rec.case]
        inputs = fam.make_inputs(case, derive_seed(case.seed, "trial", case.trials - 1))  # the timed inputs
        ceil = rec.extra["ceilings"]
        rec.bytes_moved, rec.flops = fam.bytes_moved(case, inputs), fam.flops(case, inputs)
        rec.floor_s = max(rec.bytes_moved / ceil["copy_bytes_per_s"], rec.flops / ceil["matmul_flops_per_s"])
        rec.pct_of_floor_rate = 100.0 * rec.floor_s / rec.time_median_s
for name in ("records.jsonl", "results.csv"):
    (run / name).unlink(missing_ok=True)
writer = RunWriter(run)
for rec in records:
    writer.add(rec)
meta = dict(metas[0])
meta.update({
    "status": "partial",
    "notes": ("Assembled from three device calls on one H200 (commit 25be075). tree_verify_mla.yaml stopped at "
              "case 45 of 69 when the call's time limit ended it; the remaining benchmark shapes were run as "
              "filtered runs (bench-batch, bench-small-heads, H128/T256/8K), with tree_build (budget 256, "
              "V 163840), tree_accept (budget 64) and kv_compact (bench) and the engine scenarios. Roofline "
              "columns of tree_verify_mla rows re-derived by reports/h200/assemble.py."),
    "commands": [m["command"] + (f" --filter {m['filter']!r}" if m.get("filter") else "") for m in metas],
    "commit": "25be075",
    "scenarios": [s for m in metas for s in m["scenarios"]],
})
writer.write_meta(meta)
print(report.render(run))
