"""Nsight Compute's raw page (`ncu --import R.ncu-rep --csv --page raw`) -> one markdown row per kernel launch:
duration, SM / memory / DRAM throughput (% of peak, elapsed), the DRAM rate, L2 hit rate, achieved
occupancy, registers, the tensor pipe's active % and the three largest warp-stall reasons (cycles per issued
instruction). The columns are found by name pattern because ncu versions differ in which they write.
Usage: python3 reports/h200/ncu_summary.py RAW.csv [--label TEXT] >> OUT.md"""
import argparse
import re

import pandas as pd

COLUMNS = (   # (header, metric pattern, scale)
    ("us", r"^gpu__time_duration\.sum$", 1e-3),                       # normalised to ns below
    ("SM %", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
    ("mem %", r"^gpu__compute_memory_throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
    ("DRAM %", r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
    ("DRAM GB/s", r"^dram__bytes\.sum\.per_second$", 1e-9),               # normalised to byte/s
    ("L2 hit %", r"^lts__t_sector_hit_rate\.pct$", 1),
    ("occupancy %", r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$", 1),
    ("regs", r"^launch__registers_per_thread$", 1),
    ("tensor %", r"^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_active$", 1),
)
STALL = re.compile(r"^smsp__average_warp(?:_latency|s)_issue_stalled_(\w+?)(?:_per_issue_active)?\.ratio$")


def number(v) -> float | None:
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def load(path: str) -> pd.DataFrame:
    """Rows = launches; the raw page's second line holds units (ns, %, byte...), dropped after reading."""
    df = pd.read_csv(path, dtype=str)
    if not pd.isna(df.iloc[0].get("Kernel Name")):     # no units row
        return df
    units = df.iloc[0]
    df = df.iloc[1:].reset_index(drop=True)
    for col in df.columns:     # normalise byte/time units so the scales above hold
        unit = str(units[col])
        factor = {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9,
                  "Tbyte/s": 1e12, "us": 1e3, "ms": 1e6, "usecond": 1e3, "msecond": 1e6}.get(unit)
        if factor:
            df[col] = [str(number(v) * factor) if number(v) is not None else v for v in df[col]]
    return df


def row(rec: pd.Series, cols: list[str]) -> str:
    cells = [str(rec.get("Kernel Name", "?"))[:48], f"{rec.get('Grid Size', '')} x {rec.get('Block Size', '')}"]
    for _, pattern, scale in COLUMNS:
        match = [c for c in cols if re.match(pattern, c)]
        v = number(rec[match[0]]) if match else None
        cells.append("-" if v is None else f"{v * scale:.1f}" if scale != 1 or v < 1000 else f"{v:.0f}")
    stalls = sorted(((number(rec[c]) or 0.0, STALL.match(c).group(1)) for c in cols if STALL.match(c)), reverse=True)
    cells.append(", ".join(f"{name} {v:.1f}" for v, name in stalls[:3]) or "-")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw_csv")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    df = load(a.raw_csv)
    cols = list(df.columns)
    head = ["kernel", "grid x block"] + [h for h, _, _ in COLUMNS] + ["top stalls (cycles/issue)"]
    print(f"\n{a.label}\n" if a.label else "")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for _, rec in df.iterrows():
        print(row(rec, cols))


if __name__ == "__main__":
    main()
