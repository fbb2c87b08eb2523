"""The top of the run report: a verdict per kind (what needs a reviewer's attention, beyond failed checks),
the header facts (commits, dates, GPU, clock state, throttled rows), the merged runs and the contents.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kdbench.intervals import speedup_interval, speedup_unsure
from kdbench.report_tables import grouped, low_high, median, missing, policy_label, shape_of
from kdbench.results import Record

KIND_ORDER = ("kernel", "acceptance", "e2e", "topology")
PREDICTION_TOLERANCE = 0.25          # predicted / measured speedup further apart than this needs attention
CLOCK_STEADY = 0.02                  # SM clock medians within 2 % over the rows read as steady


def _where(recs: list[Record]) -> str:
    names = list(dict.fromkeys(f"{r.case} {policy_label(r) or r.backend} ({r.backend}, {r.dtype})" for r in recs))
    return "; ".join(names[:4]) + (f"; … {len(names) - 4} more" if len(names) > 4 else "")


def _greedy_drafted(r: Record) -> bool:
    shape = shape_of(r)
    return shape.get("temperature", 0.0) == 0 and policy_label(r) not in ("", "ar")


def _generation_items(recs: list[Record]) -> list[str]:
    """e2e speedup below 1 or above it with an interval reaching below 1, predicted vs measured speedup apart by
    more than 25 %, greedy runs not lossless."""
    items = []
    slow = [r for r in recs if not missing(r.speedup_vs_ar) and r.speedup_vs_ar < 1]
    if slow:
        lo, hi = low_high(r.speedup_vs_ar for r in slow)
        items.append(f"{len(slow)} row(s) slower than AR (speedup {lo:.2f}–{hi:.2f}×): {_where(slow)}")
    unsure = [r for r in recs if speedup_unsure(r)]
    if unsure:
        lo, hi = low_high(speedup_interval(r)[0] for r in unsure)
        items.append(f"{len(unsure)} row(s) faster than AR whose speedup's 95% interval over batches reaches below 1 "
                     f"(lower ends {lo:.2f}–{hi:.2f}×): {_where(unsure)}")
    off = [r for r in recs if not missing(r.predicted_speedup) and not missing(r.speedup_vs_ar)
           and r.speedup_vs_ar > 0 and abs(r.predicted_speedup / r.speedup_vs_ar - 1) > PREDICTION_TOLERANCE]
    if off:
        worst = max(off, key=lambda r: abs(r.predicted_speedup / r.speedup_vs_ar - 1))
        items.append(f"{len(off)} row(s) whose predicted speedup is more than {PREDICTION_TOLERANCE:.0%} off the "
                     f"measured one (worst: predicted {worst.predicted_speedup:.2f}× vs measured "
                     f"{worst.speedup_vs_ar:.2f}×): {_where(off)}")
    lossy = [r for r in recs if _greedy_drafted(r) and r.status != "skipped" and not r.lossless.startswith("yes")]
    if lossy:
        kinds = Counter((r.lossless or "not checked").split(" (")[0] for r in lossy)
        items.append(f"{len(lossy)} greedy row(s) not lossless ({', '.join(f'{k}: {n}' for k, n in kinds.items())})"
                     f": {_where(lossy)}")
    return items


def kind_verdicts(records: list[Record]) -> list[dict[str, Any]]:
    """One entry per kind present: {kind, rows, attention (bool), issues}; issues name what needs attention."""
    groups = grouped(records, lambda r: r.kind)
    out = []
    for kind in sorted(groups, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else 99, k)):
        recs = groups[kind]
        statuses = Counter(r.status for r in recs)
        items = [f"{statuses[s]} row(s) {s}" for s in ("fail", "error", "ambiguous") if statuses[s]]
        if kind in ("acceptance", "e2e"):
            items += _generation_items(recs)
        out.append({"kind": kind, "rows": len(recs), "attention": bool(items), "issues": items,
                    "summary": ", ".join(f"{n} {s}" for s, n in statuses.most_common())})
    return out


# ------------------------------------------------------------------------------------------ header facts

def parts(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs merged into this one (meta['parts'], written by reports/h200/merge_runs.py), else this run."""
    found = [p for p in meta.get("parts") or [] if isinstance(p, dict)]
    if found:
        return found
    git = (meta.get("fingerprint") or {}).get("git") or {}
    return [{"commit": meta.get("commit") or git.get("sha", ""), "started_at": meta.get("started_at", ""),
             "status": meta.get("status", ""), "n_records": meta.get("n_records", ""),
             "command": meta.get("command", "")}]


def _clock_state(records: list[Record]) -> str:
    clocks = [r.sm_clock_mhz for r in records if not missing(r.sm_clock_mhz)]
    if not clocks:
        return "no SM clock recorded (no NVML)"
    lo, hi = min(clocks), max(clocks)
    steady = hi <= lo * (1 + CLOCK_STEADY)
    state = "steady (as if locked)" if steady else "not locked: it moved between rows"
    return f"SM clock {median(clocks):.0f} MHz median over rows, {lo:.0f}–{hi:.0f} MHz: {state}"


def header(meta: dict[str, Any], records: list[Record]) -> dict[str, Any]:
    fp = meta.get("fingerprint") or {}
    git = fp.get("git") or {}
    commits = Counter(str(p.get("commit") or "?") for p in parts(meta))
    gpus = Counter(g.get("name", "?") for g in fp.get("gpus") or [])
    throttled = [r for r in records if r.throttle.strip(", ")]
    reasons = Counter(t.strip() for r in throttled for t in r.throttle.split(",") if t.strip())
    return {
        "commits": ", ".join(f"{c} ({n} run{'s' if n > 1 else ''})" if len(commits) > 1 else c
                             for c, n in commits.most_common()),
        "dirty": bool(git.get("dirty")),
        "dates": " – ".join(d for d in (meta.get("started_at", ""), meta.get("finished_at", "")) if d),
        "gpu": ", ".join(f"{n}× {name}" for name, n in gpus.items()) or meta.get("device_name") or "none",
        "clock": _clock_state(records),
        "throttled": len(throttled),
        "throttle_reasons": ", ".join(f"{k} ({n})" for k, n in reasons.most_common()),
    }


def toc(sections: list[dict[str, Any]], scenarios: bool = True) -> list[tuple[str, str]]:
    """(anchor, title) for the contents; the section dicts get their 'anchor' here."""
    fixed = [("verdicts", "Verdicts"), ("summary", "Summary")]
    for i, s in enumerate(sections):
        s["anchor"] = f"s{i}-" + re.sub(r"[^a-z0-9]+", "-", s["title"].lower()).strip("-")
    tail = [("conventions", "Conventions"), ("environment", "Environment")]
    return fixed + [(s["anchor"], s["title"]) for s in sections] + tail + (
        [("scenarios", "Scenario files")] if scenarios else [])


def whole_sentences(text: str, clipped_at: int = 150) -> str:
    """A long reason that was stored clipped mid-word ends at its last complete sentence, then '…'."""
    text = text or ""
    if len(text) < clipped_at or text.rstrip().endswith((".", ")", "]", "…")):
        return text
    cut = text.rfind(". ")
    return text[:cut + 1] + " …" if cut > 0 else text.rsplit(" ", 1)[0] + " …"

