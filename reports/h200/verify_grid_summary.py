"""Issue 15's grid targets from saved tree_verify_mla runs (plans/0004): per shape, ours (backend `cuda`) against the
FlashInfer cascade and prefix-only rows of the same run, and the two counts the issue names:
  - >= 1.25x the cascade: cascade median / ours median (every shape);
  - >= 80 % of the floor rate: pct_of_floor_rate = 100 x floor_s / median, on compute-bound shapes (FLOPs / matmul
    ceiling > bytes / copy ceiling, both ceilings as the run measured them) with floor_s >= 0.2 ms.
Usage: python3 reports/h200/verify_grid_summary.py RECORDS.jsonl... [--before RECORDS.jsonl...] [--table]
--before: an earlier run of the same cases; shapes in both get ours-now / ours-before.
"""
from __future__ import annotations

import argparse
import json
import statistics


def load(paths: list[str]) -> dict[str, dict[str, dict]]:
    """{case: {backend: record}} over passing rows; a later file's row replaces an earlier one's."""
    out: dict[str, dict[str, dict]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["status"] == "pass":
                    out.setdefault(r["case"], {})[r["backend"]] = r
    return out


def shape_row(case: str, rows: dict[str, dict]) -> dict | None:
    ours, casc = rows.get("cuda"), rows.get("flashinfer_cascade")
    if ours is None or casc is None:
        return None
    ceil = ours["extra"]["ceilings"]
    compute = ours["flops"] / ceil["matmul_flops_per_s"] > ours["bytes_moved"] / ceil["copy_bytes_per_s"]
    pre = rows.get("flashinfer_prefix")
    return {"case": case, "shape": json.loads(ours["shape"]), "ours_ms": 1e3 * ours["time_median_s"],
            "floor_ms": 1e3 * ours["floor_s"], "pct": ours["pct_of_floor_rate"], "compute": compute,
            "vs_cascade": casc["time_median_s"] / ours["time_median_s"],
            "vs_prefix": pre["time_median_s"] / ours["time_median_s"] if pre else None,
            "need_pct_for_125": 125.0 * ours["floor_s"] / casc["time_median_s"], "clock": ours["sm_clock_mhz"]}


def summarize(shapes: list[dict]) -> list[str]:
    if not shapes:
        return ["no shape has both a passing `cuda` row and a passing `flashinfer_cascade` row"]
    met = [s for s in shapes if s["vs_cascade"] >= 1.25]
    heavy = [s for s in shapes if s["compute"] and s["floor_ms"] >= 0.2]
    at80 = [s for s in heavy if s["pct"] >= 80.0]
    lines = [f"shapes {len(shapes)}: faster than the cascade on {sum(s['vs_cascade'] > 1 for s in shapes)}, "
             f">= 1.25x on {len(met)}, missed on {len(shapes) - len(met)} "
             f"(min {min(s['vs_cascade'] for s in shapes):.2f}x, median {statistics.median(s['vs_cascade'] for s in shapes):.2f}x)"]
    if heavy:
        lines.append(f"compute-bound with floor >= 0.2 ms: {len(heavy)}; >= 80 % of the floor rate on {len(at80)} "
                     f"(median {statistics.median(s['pct'] for s in heavy):.1f} %, max {max(s['pct'] for s in heavy):.1f} %)")
    miss = [s for s in shapes if s["vs_cascade"] < 1.25]
    if miss:
        lines.append("1.25x misses would need % of floor: " + ", ".join(f"{s['need_pct_for_125']:.0f}" for s in miss))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+")
    ap.add_argument("--before", nargs="*", default=[])
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    now = [r for c, rows in load(a.records).items() if (r := shape_row(c, rows))]
    before = {r["case"]: r for c, rows in load(a.before).items() if (r := shape_row(c, rows))}
    print("\n".join(summarize(now)))
    both = [s for s in now if s["case"] in before]
    if both:
        ratios = [s["ours_ms"] / before[s["case"]]["ours_ms"] for s in both]
        print(f"ours now / before on {len(both)} shapes: median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}")
        print("before, same shapes: " + " | ".join(summarize([before[s["case"]] for s in both])))
    if a.table:
        print("| case | floor ms | ours ms | % floor | vs cascade | vs prefix | before ms |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for s in sorted(now, key=lambda s: s["case"]):
            b = before.get(s["case"])
            pre = f"{s['vs_prefix']:.2f}x" if s["vs_prefix"] is not None else "-"
            was = f"{b['ours_ms']:.3f}" if b else "-"
            print(f"| {s['case']} | {s['floor_ms']:.3f} | {s['ours_ms']:.3f} | {s['pct']:.1f} | {s['vs_cascade']:.2f}x | "
                  f"{pre} | {was} |")

if __name__ == "__main__":
    main()
