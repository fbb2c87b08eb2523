"""Regression compare of two saved runs: a join on KEY_COLUMNS, a Mann-Whitney U test on the raw timing
samples plus a minimum effect on the medians, "ambiguous" when clocks/throttling differ, and an HTML diff.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kdbench.backends import registry
from kdbench.errors import DamagedRun
from kdbench.report import environment, is_finished
from kdbench.results import KEY_COLUMNS, Record, atomic_write_text, load_meta, load_run_records

VERDICTS = ("fail", "dropped", "slower", "faster", "ambiguous", "same", "skipped", "missing", "new")
GATING_VERDICTS = ("dropped", "slower")   # fail a compare in a gating row ("fail" fails it in any row)
CLOCK_TOLERANCE = 0.05              # sm clock medians further apart than 5 % -> ambiguous
# What a row's status says was done: checked and passing > measured only > not run. A fall between two runs
# ("dropped") is a regression of its own: a check that stops running or stops passing must not read "same".
_STATUS_LEVEL = {"pass": 2, "info": 1, "skipped": 0}


@dataclass(frozen=True)
class CompareResult:
    rows: list[dict[str, Any]]          # one per key in either run: keys, verdict, medians, p, note
    verdict_counts: dict[str, int]
    exit_code: int                      # 0 ok, 1 a checked row got slower or any row failed
    notes: list[str] = field(default_factory=list)   # run-level remarks (partial runs, machine change)
    alpha: float = 0.002
    min_effect: float = 0.05
    base_dir: str = ""
    new_dir: str = ""
    closed: list[str] = field(default_factory=list)  # why the new run cannot pass (fail closed): exit 1


def rankdata(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based; ties share their mean rank) and the size of every tie group."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)                         # rank of the last member of each group
    mean_rank = upper - (counts - 1) / 2.0
    return mean_rank[inverse], counts


def mann_whitney_u(x, y) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test, normal approximation with tie correction and continuity correction
    (the same as scipy's method='asymptotic'). Returns (U of x, p value)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u() needs samples on both sides")
    ranks, ties = rankdata(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)
    n = n1 + n2
    tie_term = float((ties ** 3 - ties).sum()) / (n * (n - 1)) if n > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    if sigma == 0:                                    # every value identical: no evidence of a shift
        return u1, 1.0
    delta = u1 - n1 * n2 / 2.0
    z = (abs(delta) - 0.5) / sigma if abs(delta) >= 0.5 else 0.0
    return u1, math.erfc(z / math.sqrt(2.0))


def min_p_value(n1: int, n2: int) -> float:
    """The smallest p the test can return for these sizes (complete separation, no ties): below it the
    test cannot reach alpha however large the change, so the verdict must be 'ambiguous'."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return mann_whitney_u(np.arange(n1), np.arange(n1, n1 + n2))[1]


def _throttle(rec: Record) -> str:
    return ",".join(sorted(t for t in rec.throttle.split(",") if t))


def _ambiguity(base: Record, new: Record, alpha: float) -> str:
    """Why a timing comparison cannot be trusted, or '' when it can."""
    nb, nn = len(base.samples_s), len(new.samples_s)
    if min_p_value(nb, nn) > alpha:
        return f"too few samples ({nb} vs {nn}) for p < {alpha:g}"
    cb, cn = base.sm_clock_mhz, new.sm_clock_mhz
    if math.isfinite(cb) and math.isfinite(cn) and cb > 0 and abs(cn / cb - 1) > CLOCK_TOLERANCE:
        return f"SM clock {cb:.0f} vs {cn:.0f} MHz differs by more than {CLOCK_TOLERANCE:.0%}"
    if _throttle(base) != _throttle(new):
        return f"throttle state differs ({_throttle(base) or 'none'} vs {_throttle(new) or 'none'})"
    return ""


def _levels(base: Record, new: Record) -> tuple[float, float, str]:
    """(base, new, what they are): the medians of the samples, or for two rows pooled from A/B rounds
    (kdbench.ab) each side's lowest round 20th percentile (preemption only adds time, so the low quantile is
    the cleanest estimate of the code's cost)."""
    levels = [r.extra.get("ab_level_s") for r in (base, new)]
    if all(isinstance(v, (int, float)) and v > 0 for v in levels):
        return float(levels[0]), float(levels[1]), "; levels: lowest A/B round p20"
    return float(np.median(base.samples_s)), float(np.median(new.samples_s)), ""


def _round_spread(rec: Record) -> float:
    """max / min - 1 of a pooled A/B row's round p20s (kdbench.ab); 0 without two rounds."""
    lows = [v for v in rec.extra.get("ab_round_p20_s") or [] if isinstance(v, (int, float)) and v > 0]
    return max(lows) / min(lows) - 1.0 if len(lows) > 1 else 0.0


def _noisy_rounds(base: Record, new: Record, change: float, min_effect: float) -> str:
    """Why a change of at least the minimum effect cannot be told from noise: one side's own A/B rounds disagree
    by as much (the samples of a round share its disturbance, so the pooled test alone over-trusts them)."""
    spread = max(_round_spread(base), _round_spread(new))
    if math.isfinite(change) and min_effect <= abs(change) <= spread:
        return (f"the rounds of one side disagree by {spread:.0%}, as much as the {change:+.0%} between the sides: "
                "a noisy machine (more --rounds, or a quieter one)")
    return ""


def _timing_verdict(base: Record, new: Record, alpha: float, min_effect: float) -> dict[str, Any]:
    b_med, n_med, basis = _levels(base, new)
    change = n_med / b_med - 1.0 if b_med > 0 else math.nan
    _, p = mann_whitney_u(base.samples_s, new.samples_s)
    out = {"base_median_s": b_med, "new_median_s": n_med, "change_pct": 100 * change, "p_value": p}
    why = _ambiguity(base, new, alpha) or _noisy_rounds(base, new, change, min_effect)
    if why:
        return {**out, "verdict": "ambiguous", "note": why}
    if p < alpha and abs(change) >= min_effect:
        gate = "" if gates(new.kind, new.backend) or change < 0 else f"; {new.backend} is context, does not gate"
        return {**out, "verdict": "slower" if change > 0 else "faster",
                "note": f"p = {p:.2g} < {alpha:g} and |change| >= {min_effect:.0%}{gate}{basis}"}
    if p < alpha:
        note = f"significant (p = {p:.2g}) but smaller than the {min_effect:.0%} minimum effect"
    elif abs(change) >= min_effect:
        note = f"median moved {100 * change:+.1f}% but p = {p:.2g} >= {alpha:g}"
    else:
        note = ""
    return {**out, "verdict": "same", "note": note + basis if note else basis.lstrip("; ")}


gates = registry.gates   # our kernels and every engine row gate; baselines, peers and the reference are context


def _status_drop(base: Record, new: Record) -> str:
    """Why the new row does less than the baseline's (pass -> info: its check no longer passes or no longer
    runs; pass or info -> skipped: it no longer runs), or '' when it does not."""
    was, now = _STATUS_LEVEL.get(base.status), _STATUS_LEVEL.get(new.status)
    if was is None or now is None or now >= was:
        return ""
    what = "its check no longer passes or no longer runs" if now else "it no longer runs"
    return f"status {base.status} -> {new.status}: {what}" + (f" ({new.reason})" if new.reason else "")


def _dropped(base: Record, new: Record, why: str, alpha: float, min_effect: float) -> dict[str, Any]:
    """The 'dropped' verdict, with the timing columns filled when both sides still have samples."""
    if not (base.samples_s and new.samples_s):
        return {"verdict": "dropped", "note": why}
    timed = _timing_verdict(base, new, alpha, min_effect)
    return {**timed, "verdict": "dropped", "note": f"{why}; timing {timed['verdict']}"}


def _row_verdict(base: Record | None, new: Record | None, alpha: float, min_effect: float) -> dict[str, Any]:
    if new is None:
        return {"verdict": "missing", "note": "in the baseline, not in the new run"}
    if new.status in ("fail", "error"):
        return {"verdict": "fail", "note": f"{new.status}: {new.reason or new.worst}"}
    if base is None:
        return {"verdict": "new", "note": "not in the baseline"}
    drop = _status_drop(base, new)
    if drop:
        return _dropped(base, new, drop, alpha, min_effect)
    if new.status == "skipped" or base.status == "skipped":
        return {"verdict": "skipped", "note": new.reason or base.reason}
    if base.samples_s and new.samples_s:
        return _timing_verdict(base, new, alpha, min_effect)
    return {"verdict": "same", "note": "no timing samples; status unchanged"
            if base.status == new.status else f"status {base.status} -> {new.status}"}


def _row(key: tuple, base: Record | None, new: Record | None, alpha: float, min_effect: float) -> dict:
    row: dict[str, Any] = dict(zip(KEY_COLUMNS, key))
    row.update(base_status=base.status if base else "", new_status=new.status if new else "",
               base_median_s=math.nan, new_median_s=math.nan, change_pct=math.nan, p_value=math.nan,
               base_sm_clock_mhz=base.sm_clock_mhz if base else math.nan,
               new_sm_clock_mhz=new.sm_clock_mhz if new else math.nan,
               base_throttle=_throttle(base) if base else "", new_throttle=_throttle(new) if new else "",
               repro=(new or base).repro, min_effect=min_effect)
    row.update(_row_verdict(base, new, alpha, min_effect))
    return row


def _run_notes(base_dir: Path, new_dir: Path) -> list[str]:
    notes = []
    bm, nm = load_meta(base_dir), load_meta(new_dir)
    for label, meta in (("baseline", bm), ("new run", nm)):
        if not is_finished(meta):
            notes.append(f"the {label} is a partial run (no 'finished' flag in meta.json)")
    bs, ns = (m.get("fingerprint", {}).get("gpu_slug") for m in (bm, nm))
    if bs and ns and bs != ns:
        notes.append(f"different machines: baseline {bs}, new {ns}")
    bk, nk = (m.get("fingerprint", {}).get("kernel_knobs") for m in (bm, nm))
    if bk is not None and nk is not None and bk != nk:
        notes.append(f"different kernel knobs (other plans or launches): baseline {bk or 'none'}, new {nk or 'none'}")
    return notes


def _scenario_names(run_dir: Path, meta: dict, records: list[Record]) -> set[str]:
    listed = meta.get("scenarios")
    if listed is None:
        return {r.scenario for r in records}
    if not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
        raise DamagedRun(f"{run_dir / 'meta.json'}: scenarios: got {type(listed).__name__}, expected a list of "
                         "mappings; the run is damaged")
    return {str(s.get("name")) for s in listed}


def fail_closed_reasons(base_dir: Path, new_dir: Path, base: list[Record], new: list[Record]) -> list[str]:
    """Why the new run cannot be trusted to pass: missing, partial, empty, or a different scenario set. A
    nightly whose run died early must fail, not pass with 'missing N'."""
    if not (new_dir / "meta.json").exists() and not (new_dir / "records.jsonl").exists():
        return [f"the new run {new_dir} does not exist or holds no run (no meta.json, no records.jsonl)"]
    meta, reasons = load_meta(new_dir), []
    if not is_finished(meta):
        reasons.append(f"the new run is partial (meta.json status {meta.get('status', 'missing')!r}, "
                       "not 'finished')")
    if not new:
        reasons.append("the new run holds no records")
    bs, ns = _scenario_names(base_dir, load_meta(base_dir), base), _scenario_names(new_dir, meta, new)
    if bs != ns:
        reasons.append(f"the new run ran other scenarios ({', '.join(sorted(ns)) or 'none'}) than the baseline "
                       f"({', '.join(sorted(bs)) or 'none'})")
    return reasons


def compare(base_dir, new_dir, *, alpha: float = 0.002, min_effect: float = 0.05,
            allow_partial: bool = False, row_min_effect: dict[tuple, float] | None = None) -> CompareResult:
    """Join two run directories on KEY_COLUMNS and give every key a verdict (see VERDICTS). Fails closed
    (exit 1, reasons in `closed`) on a missing, partial, empty or mismatched new run unless allow_partial.
    row_min_effect: per key, a larger minimum effect (the A/A spread stored with a baseline, drift.py)."""
    base_dir, new_dir = Path(base_dir), Path(new_dir)
    base_loaded, new_loaded = load_run_records(base_dir), load_run_records(new_dir)
    base = {r.key(): r for r in base_loaded.records}
    new = {r.key(): r for r in new_loaded.records}
    closed = fail_closed_reasons(base_dir, new_dir, base_loaded.records, new_loaded.records)
    torn = [f"the {label}'s records.jsonl ends in a torn line (a write cut short); it was dropped"
            for label, loaded in (("baseline", base_loaded), ("new run", new_loaded)) if loaded.torn_last_line]
    keys = list(new) + [k for k in base if k not in new]
    floors = row_min_effect or {}
    rows = [_row(k, base.get(k), new.get(k), alpha, max(min_effect, floors.get(k, 0.0))) for k in keys]
    counts = {v: 0 for v in VERDICTS}
    for row in rows:
        counts[row["verdict"]] += 1
    gating = [r for r in rows if fails(r)]
    exit_code = 1 if gating or (closed and not allow_partial) else 0
    notes = torn + _run_notes(base_dir, new_dir) + (
        [f"allowed by --allow-partial: {r}" for r in closed] if allow_partial
        else [f"fails closed (exit 1): {r}" for r in closed])
    return CompareResult(rows, counts, exit_code, notes, alpha, min_effect, str(base_dir), str(new_dir),
                         [] if allow_partial else closed)


def fails(row: dict[str, Any]) -> bool:
    """Whether this compare row fails the compare: any 'fail', or 'dropped' / 'slower' in a gating row."""
    return row["verdict"] == "fail" or (row["verdict"] in GATING_VERDICTS and gates(row["kind"], row["backend"]))


def is_gating(row: dict[str, Any]) -> bool:
    """Whether a compare row's verdict can fail the compare (regress.gates on its kind and backend)."""
    return row["verdict"] == "fail" or gates(row["kind"], row["backend"])


def headline(result: CompareResult) -> str:
    """Verdict counts of the gating rows, then those of the context rows apart (they never fail a compare)."""
    def counts(rows):
        c = {v: 0 for v in VERDICTS}
        for r in rows:
            c[r["verdict"]] += 1
        return ", ".join(f"{k} {n}" for k, n in c.items() if n) or "none"
    gating = [r for r in result.rows if is_gating(r)]
    context = [r for r in result.rows if not is_gating(r)]
    return f"gating rows: {counts(gating)}; context rows (do not gate): {counts(context)}"


def render_compare(result: CompareResult, out_html, *, base_label: str = "", new_label: str = "") -> Path:
    """Write the diff report (one self-contained, autoescaped HTML file); labels default to the run dirs."""
    base_label = base_label or result.base_dir or "baseline"
    new_label = new_label or result.new_dir or "new"
    order = {v: i for i, v in enumerate(VERDICTS)}
    rows = sorted(result.rows, key=lambda r: order[r["verdict"]])
    html = environment().get_template("compare.html.j2").render(
        title=f"kdbench compare: {new_label} vs {base_label}", result=result, rows=rows, verdicts=VERDICTS,
        base_label=base_label, new_label=new_label, key_columns=KEY_COLUMNS, headline=headline(result),
        gating=[r for r in rows if is_gating(r)], context=[r for r in rows if not is_gating(r)],
        clock_tolerance_pct=100 * CLOCK_TOLERANCE)
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, html)
    return out
