"""Re-model a committed live check (replay_live_check.py's JSON) with the current cost model and fit, on the
CPU: the step time and tokens/s each row's (batch, budget, replayed tau) gets now, beside what the model said
at measurement time and what was measured. Usage:
  python3 reports/h200/replay_live_repredict.py LIVE.json MEASURED.jsonl OUT.md"""
import json
import sys

import numpy as np

from kdbench import bestbudget as bb
from kdbench import costfit
from kdbench import costmodel as cm
from kdbench.references.model_config import get_preset


def main(live_path: str, measured: str, out: str) -> None:
    live = json.load(open(live_path))
    ms = [m for m in costfit.load(measured) if m.model == live["model"]]
    eff, curve = costfit.fit_model(ms, live["model"])
    cs = bb.CostSetting(get_preset(live["model"]), live["prompt_len"] + live["rounds"] // 2, eff, curve)
    lines = [f"# {live['model']}: live check re-modeled with the current fit ({len(costfit.forwards(ms))} forwards "
             f"of {measured})", "", "| batch | budget | step ms measured | modeled then | error | modeled now | error |"
             " tokens/s measured | modeled now | error | best budget now |", "|" + " ---: |" * 10]
    errs = []
    for b in sorted({r["batch"] for r in live["rows"]}):
        rows = [r for r in live["rows"] if r["batch"] == b]
        now = {r["budget"]: cm.spec_step(cs, b, r["budget"]) for r in rows}
        best = max(rows, key=lambda r: r["tau_replayed"] / now[r["budget"]].seconds)["budget"]
        for r in rows:
            t = now[r["budget"]].seconds
            tps = b * r["tau_replayed"] / t
            errs.append(abs(t / r["step_measured_s"] - 1))
            lines.append(f"| {b} | {r['budget']} | {r['step_measured_s'] * 1e3:.2f} | {r['step_predicted_s'] * 1e3:.2f} | "
                         f"{r['step_error'] * 100:+.1f} % | {t * 1e3:.2f} | {(t / r['step_measured_s'] - 1) * 100:+.1f} % | "
                         f"{r['tokens_per_s_measured']:.0f} | {tps:.0f} | {(tps / r['tokens_per_s_measured'] - 1) * 100:+.1f} % "
                         f"| {best} |")
    lines.append(f"\nStep-time error now: median {np.median(errs) * 100:.1f} %, worst {max(errs) * 100:.1f} % "
                 f"({len(errs)} live rows). tokens/s modeled now = batch x replayed tau / modeled step.")
    open(out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:4])
