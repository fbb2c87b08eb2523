"""The question a user brings to an e2e run: at this batch size, which policy and budget is fastest, is it faster than
AR, and can it be told apart from the runner-up? One row per setting (the case's shape without its policy fields:
model, batch, drafter, MoE dispatch, batch-invariant mode, lengths, ...; backend, dtype, graph mode): the speculative
row with the highest measured speedup, its 95 % interval over batches (kinds/e2e.speedup_uncertainty), a verdict
against AR, and the other rows of the setting whose interval overlaps the best one's (not distinguishable at this
sample: plans/0016-tau-intervals.md).
"""
from __future__ import annotations

import json
import math
from typing import Any

from kdbench.intervals import overlaps, speedup_interval
from kdbench.report_tables import graph_mode, grouped, policy_label, shape_of
from kdbench.results import Record

POLICY_FIELDS = ("policy", "budget", "max_width", "branching")   # what the table compares within a setting


def verdict(speedup: float, ci: tuple[float, float] | None) -> str:
    """'faster than AR' only when the interval clears 1; 'slower than AR' when it stays below; else not told apart."""
    if ci is None:
        return f"point estimate {speedup:.2f}x, no interval"
    if ci[0] > 1:
        return "faster than AR"
    if ci[1] < 1:
        return "slower than AR"
    return "not told apart from AR"


def _setting(r: Record) -> tuple:
    shape = {k: v for k, v in shape_of(r).items() if k not in POLICY_FIELDS}
    return (str(shape.get("model", "")), int(shape.get("batch", 1)), json.dumps(shape, sort_keys=True, default=str),
            r.backend, r.dtype, graph_mode(r).split(":")[0])


def _ties(group: list[Record], best: Record, ci: tuple[float, float] | None) -> str:
    if ci is None:
        return "unknown (no interval)"
    return ", ".join(policy_label(r) for r in group if r is not best and overlaps(ci, speedup_interval(r)))


def best_by_batch(records: list[Record]) -> list[dict[str, Any]]:
    """Rows sorted by model, batch and setting; each names the best row (policy and case), its speedup and
    interval, the verdict, and the policies of its setting it cannot be told apart from."""
    spec = [r for r in records if r.kind == "e2e" and r.status in ("pass", "info") and policy_label(r) != "ar"
            and r.speedup_vs_ar is not None and math.isfinite(r.speedup_vs_ar)]
    out = []
    for (model, batch, _, backend, dtype, mode), group in sorted(grouped(spec, _setting).items()):
        best = max(group, key=lambda r: r.speedup_vs_ar)
        ci = speedup_interval(best)
        out.append({"model": model, "batch": batch, "backend": backend, "dtype": dtype, "mode": mode,
                    "best": policy_label(best), "case": best.case, "speedup": best.speedup_vs_ar, "ci": ci,
                    "batches": best.extra.get("speedup_batches"), "verdict": verdict(best.speedup_vs_ar, ci),
                    "ties": _ties(group, best, ci), "rows": len(group)})
    return out
