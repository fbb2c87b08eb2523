"""Per-case tolerances read back from the scenario texts a run saved in meta.json (so old runs show them too),
and the one-line account of a failed check: case, backend, metric against its tolerance.
"""
from __future__ import annotations

import math
from typing import Any

import yaml

from kdbench.results import Record

FIELDS = ("rtol", "atol", "rel_l2", "max_outside_pct")


def case_tolerances(meta: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """{(scenario name, case name before any '[sweep]'): tolerance mapping} from meta['scenarios'] texts.
    A text that no longer parses gives nothing (the report then shows no tolerance for it)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for s in meta.get("scenarios") or []:
        try:
            data = yaml.safe_load(s.get("text", "")) or {}
        except yaml.YAMLError:
            continue
        for case in data.get("cases") or [] if isinstance(data, dict) else []:
            if isinstance(case, dict) and isinstance(case.get("tolerance"), dict):
                out[(str(data.get("name", s.get("name", ""))), str(case.get("name")))] = case["tolerance"]
    return out


def tolerance_of(scenario: str, case: str, tolerances: dict) -> dict[str, float] | None:
    """A case's tolerance; sweeps do not change it, so 'name[k=v]' reads that of 'name'."""
    return tolerances.get((scenario, case.split("[", 1)[0]))


def describe(tol: dict[str, float] | None) -> str:
    """'exact' for rtol = atol = 0, else 'rtol 1e-4, atol 1e-5, rel_l2 5e-5'."""
    if not tol:
        return ""
    if not tol.get("rtol") and not tol.get("atol") and tol.get("rel_l2") is None:
        return "exact"
    return ", ".join(f"{k} {tol[k]:g}" for k in FIELDS if tol.get(k) is not None)


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not math.isnan(x) else math.nan


def failed_check(rec: Record, tol: dict[str, float] | None) -> str:
    """Why a fail/error row failed, naming the metric against its tolerance where the row recorded it."""
    where = f"{rec.scenario}/{rec.case} [{rec.backend}]"
    if rec.status == "error":
        return f"ERROR {where}: {rec.reason}"
    parts = []
    if rec.n_nan:
        parts.append(f"{rec.n_nan} NaN/inf where the reference has none")
    tol = tol or {}
    rel_l2, limit = _num(rec.rel_l2), tol.get("rel_l2")
    if limit is not None and rel_l2 > float(limit):
        parts.append(f"rel_l2 {rel_l2:.3g} > {float(limit):g}")
    outside, allowed = _num(rec.pct_outside), float(tol.get("max_outside_pct", 0.0))
    if outside > allowed:
        parts.append(f"{outside:.3g}% of elements outside rtol {tol.get('rtol', 0):g} / atol {tol.get('atol', 0):g}"
                     f" > {allowed:g}% allowed (max abs {_num(rec.max_abs):.3g}, max rel {_num(rec.max_rel):.3g})")
    detail = "; ".join(parts) or rec.reason or rec.worst or "failed"
    return f"FAIL {where} ({rec.dtype}): {detail}; worst {rec.worst}" if rec.worst else f"FAIL {where}: {detail}"


def failed_checks(records: list[Record], meta: dict[str, Any]) -> list[str]:
    tolerances = case_tolerances(meta)
    return [failed_check(r, tolerance_of(r.scenario, r.case, tolerances))
            for r in records if r.status in ("fail", "error")]
