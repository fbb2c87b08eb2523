"""Long-term drift against a stored baseline: the A/A spread per row (noise between machines, stored with the
baseline as spread.json and used as that row's minimum effect) and a change-point view over a folder of
nightly runs (plans/0014-same-machine-ab.md §3).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from kdbench.errors import UserError
from kdbench.regress import gates
from kdbench.results import KEY_COLUMNS, atomic_write_text, load_meta, load_records

SPREAD_FILE = "spread.json"


def key_text(key: tuple) -> str:
    return "|".join(str(k) for k in key)


def _medians(run_dir: Path) -> dict[tuple, float]:
    """Median time per key of the rows that passed or were measured (timed rows only)."""
    return {r.key(): r.time_median_s for r in load_records(run_dir)
            if r.status in ("pass", "info") and r.n_samples and r.time_median_s > 0}


def aa_spread(run_dirs: list[Path]) -> dict[tuple, float]:
    """Per key timed in every run: max(median) / min(median) - 1 over the runs (>= 2 runs of the same code,
    ideally on different machines of one kind: the between-machine noise a stored baseline cannot shed)."""
    if len(run_dirs) < 2:
        raise UserError(f"--calibrate: got {len(run_dirs)} run(s), expected at least 2 runs of the same code")
    per_run = [_medians(Path(d)) for d in run_dirs]
    common = set(per_run[0]).intersection(*per_run[1:])
    if not common:
        raise UserError(f"--calibrate: no timed row is in every run ({', '.join(str(d) for d in run_dirs)}); "
                        "expected runs of the same scenarios on one kind of device")
    return {k: max(m[k] for m in per_run) / min(m[k] for m in per_run) - 1.0 for k in common}


def write_spread(baseline_dir: Path, run_dirs: list[Path]) -> Path:
    spread = aa_spread(run_dirs)
    payload = {"key_columns": list(KEY_COLUMNS), "runs": [str(d) for d in run_dirs],
               "rule": "max(median) / min(median) - 1 over the runs; compare uses max(min_effect, spread)",
               "rows": {key_text(k): v for k, v in sorted(spread.items())}}
    Path(baseline_dir).mkdir(parents=True, exist_ok=True)
    out = Path(baseline_dir) / SPREAD_FILE
    atomic_write_text(out, json.dumps(payload, indent=2))
    return out


def load_spread(baseline_dir: Path) -> dict[tuple, float]:
    """spread.json of a baseline as {key: spread}; {} when the baseline has none."""
    path = Path(baseline_dir) / SPREAD_FILE
    if not path.exists():
        return {}
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        rows, columns = payload["rows"], payload.get("key_columns", list(KEY_COLUMNS))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise UserError(f"{path}: not a spread file (expected a JSON object with 'rows')") from None
    # a file written before a key column was added (phase, 2026-12-01) names its own columns: the missing ones
    # are "" in its rows, so its keys still join today's records instead of silently matching none
    return {tuple(dict(zip(columns, k.split("|"))).get(c, "") for c in KEY_COLUMNS): float(v)
            for k, v in rows.items()}


# ------------------------------------------------------------------------------------------ change points

@dataclass(frozen=True)
class ChangePoint:
    key: tuple
    runs: list[str]                   # run directory names in time order
    medians: list[float]              # seconds, one per run
    split: int                        # first run of the new level
    shift: float                      # median(after) / median(before) - 1
    flagged: bool                     # the shift is >= the threshold and persists (see best_split)


def best_split(medians: list[float], threshold: float, min_segment: int = 2) -> tuple[int, float, bool]:
    """Two-sample split search: the split k maximising |log(median(m[k:]) / median(m[:k]))| with at least
    min_segment runs on each side. Flagged when |shift| >= threshold and every run after the split lies beyond
    the before-level by at least half the threshold in the shift's direction (a level change that held, not
    one slow night). Returns (k, shift, flagged); (0, 0, False) when the history is too short."""
    best = (0, 0.0, False)
    for k in range(min_segment, len(medians) - min_segment + 1):
        before, after = statistics.median(medians[:k]), statistics.median(medians[k:])
        shift = after / before - 1.0
        if abs(math.log1p(shift)) > abs(math.log1p(best[1])):
            held = all((m / before - 1.0) * math.copysign(1, shift) >= threshold / 2 for m in medians[k:])
            best = (k, shift, abs(shift) >= threshold and held)
    return best


def history(folder: Path, threshold: float = 0.05, spread: dict[tuple, float] | None = None,
            gating_only: bool = True) -> list[ChangePoint]:
    """One ChangePoint per timed row over the finished runs in `folder` (ordered by meta started_at); a row's
    threshold is max(threshold, its A/A spread)."""
    runs = [d for d in Path(folder).iterdir() if (d / "records.jsonl").exists()] if Path(folder).is_dir() else []
    runs = sorted((d for d in runs if load_meta(d).get("status") == "finished"),
                  key=lambda d: (load_meta(d).get("started_at", ""), d.name))
    if len(runs) < 4:
        raise UserError(f"{folder}: {len(runs)} finished run(s), expected at least 4 for a change-point view")
    per_run = [_medians(d) for d in runs]
    keys = [k for k in dict.fromkeys(k for m in per_run for k in m)
            if all(k in m for m in per_run) and (not gating_only or gates(k[1], k[4]))]
    out = []
    for k in keys:
        medians = [m[k] for m in per_run]
        split, shift, flagged = best_split(medians, max(threshold, (spread or {}).get(k, 0.0)))
        out.append(ChangePoint(k, [d.name for d in runs], medians, split, shift, flagged))
    return out


def history_lines(points: list[ChangePoint]) -> list[str]:
    """Flagged rows first, then the largest shifts."""
    lines = []
    for p in sorted(points, key=lambda p: (not p.flagged, -abs(p.shift))):
        where = f"from run {p.runs[p.split]}" if p.split else "history too short"
        lines.append(f"{'CHANGE' if p.flagged else 'steady'}  {p.shift:+7.1%}  {where}  {key_text(p.key)}  "
                     f"medians {', '.join(f'{m * 1e6:.3g}' for m in p.medians)} us")
    return lines
