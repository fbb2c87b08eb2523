"""The question a user brings to an e2e run: at this batch size, which policy and budget is fastest, is it faster than
AR, and can it be told apart from the runner-up? One row per (model, batch, backend, dtype, graph mode): the
speculative row with the highest measured speedup, its 95 % interval over batches (kinds/e2e.speedup_uncertainty),
a verdict against AR, and the other rows whose interval overlaps the best one's (not distinguishable at this
sample: plans/0016-tau-intervals.md).
"""
from __future__ import annotations

from typing import Any

from kdbench.report_tables import graph_mode, grouped, missing, policy_label, shape_of, speedup_interval
from kdbench.results import Record


def verdict(speedup: float, ci: tuple[float, float] | None) -> str:
    """'faster than AR' only when the interval clears 1; 'slower than AR' when it stays below; else not shown."""
    if ci is None:
        return "faster than AR (no interval)" if speedup >= 1 else "slower than AR (no interval)"
    if ci[0] > 1:
        return "faster than AR"
    if ci[1] < 1:
        return "slower than AR"
    return "not told apart from AR"


def _overlaps(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def best_by_batch(records: list[Record]) -> list[dict[str, Any]]:
    """Rows sorted by model and batch; each names the best row, its speedup and interval, the verdict, and the
    labels of the rows it cannot be told from ('' when its interval is alone, or unknown without intervals)."""
    spec = [r for r in records if r.kind == "e2e" and r.status in ("pass", "info") and policy_label(r) != "ar"
            and not missing(r.speedup_vs_ar)]
    out = []
    key = lambda r: (str(shape_of(r).get("model", "")), int(shape_of(r).get("batch", 1)), r.backend,  # noqa: E731
                     r.dtype, graph_mode(r).split(":")[0])
    for (model, batch, backend, dtype, mode), group in sorted(grouped(spec, key).items()):
        best = max(group, key=lambda r: r.speedup_vs_ar)
        ci = speedup_interval(best)
        ties = [policy_label(r) for r in group if r is not best and _overlaps(ci, speedup_interval(r))]
        out.append({"model": model, "batch": batch, "backend": backend, "dtype": dtype, "mode": mode,
                    "best": policy_label(best), "speedup": best.speedup_vs_ar, "ci": ci,
                    "batches": best.extra.get("speedup_batches"), "verdict": verdict(best.speedup_vs_ar, ci),
                    "ties": ", ".join(ties), "rows": len(group)})
    return out
