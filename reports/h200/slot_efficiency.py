"""Slot efficiency of saved e2e records that predate the field (kinds/e2e.slot_efficiency), from what they hold:
live request-steps = sum of accept_len_hist, all request-steps = n_samples (one sample per step) x batch,
committed = sum of k x hist[k], delivered = tokens_per_s x sum(samples_s). Prints measured / predicted beside it.
Usage: python reports/h200/slot_efficiency.py RUN_DIR"""
import json
import sys

from kdbench.results import load_records


def main(run_dir: str) -> None:
    print("| case | policy | live slot fraction | delivered / committed | slot efficiency | measured / predicted |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in load_records(run_dir):
        hist = r.extra.get("accept_len_hist")
        if r.policy == "ar" or not hist or not r.predicted_speedup:
            continue
        batch = json.loads(r.shape)["batch"]
        live, committed = sum(hist.values()), sum(int(k) * v for k, v in hist.items())
        frac, kept = live / (r.n_samples * batch), r.tokens_per_s * sum(r.samples_s) / committed
        print(f"| {r.case} | {r.policy} | {frac:.3f} | {kept:.3f} | {frac * kept:.3f} | "
              f"{r.speedup_vs_ar / r.predicted_speedup:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])
