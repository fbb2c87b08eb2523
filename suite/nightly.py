"""Nightly: run scenarios/nightly/*.yaml, compare with the stored baseline of this GPU kind
(reports/baselines/<gpu-slug>/, its A/A spread as per-row minimum effects), or with a base revision run on
the same machine (`against`, kdbench.ab); write report.html + compare.html; `update_baseline` accepts a run.
"""
from __future__ import annotations

import datetime as _dt
import shutil
import sys
from pathlib import Path

from kdbench import ab, drift, regress, report, tolerances
from kdbench.errors import UserError
from kdbench.results import load_meta, load_records

REPO_ROOT = Path(__file__).resolve().parents[1]
NIGHTLY_DIR = "scenarios/nightly"


def _resolve(path: str | Path) -> Path:
    """Relative paths from the working directory when they exist there, else from the repo root."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p


def scenario_paths(scenario_dir: str | Path = NIGHTLY_DIR) -> list[str]:
    paths = sorted(str(p) for p in _resolve(scenario_dir).glob("*.yaml"))
    if not paths:
        raise UserError(f"{scenario_dir}: no nightly scenario files (*.yaml)")
    return paths


def run_slug(run_dir: Path) -> str:
    """The GPU slug recorded in a run's fingerprint (the machine kind that baseline belongs to)."""
    fp = load_meta(run_dir).get("fingerprint") or {}
    if "gpu_slug" in fp:
        return fp["gpu_slug"]
    from kdbench.envinfo import gpu_slug
    return gpu_slug(fp)


def own_checks(run_dir: Path) -> list[str]:
    """One line per failed or errored check of the run (case, backend, metric vs tolerance), printed."""
    lines = tolerances.failed_checks(load_records(run_dir), load_meta(run_dir))
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    if lines:
        print(f"nightly: {len(lines)} of its own checks failed (above); exit 1", file=sys.stderr)
    return lines


def _baseline_compare(run_dir: Path, baseline_root, gate: bool) -> int:
    """Long-term drift against the stored baseline of this GPU kind, each row's minimum effect raised to its
    stored A/A spread. With gate False (an A/B run decided) it is reported only."""
    base = _resolve(baseline_root) / run_slug(run_dir)
    if not (base / "records.jsonl").exists():
        print(f"no baseline at {base}; after checking this run, accept it with "
              f"`kdbench nightly --update-baseline {run_dir}`", file=sys.stderr)
        return 0
    result = regress.compare(base, run_dir, row_min_effect=drift.load_spread(base))
    path = regress.render_compare(result, run_dir / "compare.html", base_label=f"baseline {base}")
    print(f"against the stored baseline{'' if gate else ' (drift; does not gate)'}: {regress.headline(result)}")
    print(f"compare: {path}")
    return result.exit_code if gate else 0


def run_nightly(out_dir: str | Path | None, baseline_root: str | Path = "reports/baselines", *,
                scenario_dir: str | Path = NIGHTLY_DIR, against: str | None = None, rounds: int = 2) -> int:
    """Run the nightly scenarios, render the report, compare. Exit code: 1 when a check of the run failed
    (each one printed) or the compare found a gating regression; else 0. Without `against` the compare is
    with the stored baseline; with it, ABBA rounds of the base revision and this code decide, and the stored
    baseline is shown as drift."""
    from kdbench.runner import run_scenarios   # the runner imports torch; keep `kdbench --help` light
    paths = scenario_paths(scenario_dir)
    if against:
        out = Path(out_dir or f"runs/nightly-ab-{stamp()}")
        code = compare_against(ab.AbPlan(against, tuple(paths), out, rounds=rounds))
        failed = own_checks(out / "new")
        return max(code, 1 if failed else 0, _baseline_compare(out / "new", baseline_root, gate=False))
    outcome = run_scenarios(paths, out_dir, device="auto", filter_expr=None)
    run_dir = Path(outcome.run_dir)
    print(f"report: {report.render(run_dir)}")
    failed = own_checks(run_dir)
    return max(outcome.exit_code, 1 if failed else 0, _baseline_compare(run_dir, baseline_root, gate=True))


def compare_against(plan: ab.AbPlan, *, alpha: float = 0.002, min_effect: float = 0.05) -> int:
    """Same-machine A/B: run the rounds, pool each side, compare base vs new; prints the headline."""
    base, new, label = ab.run_ab(plan)
    result = regress.compare(base, new, alpha=alpha, min_effect=min_effect)
    path = regress.render_compare(result, plan.out_dir / "compare.html", base_label=label,
                                  new_label="this tree")
    print(f"report: {report.render(new)}")
    print(f"A/B against {label}, {plan.rounds} ABBA round pair(s): {regress.headline(result)}")
    for row in result.rows:
        if regress.fails(row):
            what = row.get("policy") or row["family"]     # e2e rows: the policy; kernel rows: the family
            print(f"  {row['verdict'].upper()}: {row['case']} {what} [{row['backend']}] "
                  f"{row['change_pct']:+.1f}% ({row['note']})", file=sys.stderr)
    print(f"compare: {path}")
    return result.exit_code


def stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def update_baseline(run_dir: str | Path, baseline_root: str | Path = "reports/baselines") -> Path:
    """Copy a finished run's records.jsonl + meta.json to <baseline_root>/<gpu-slug>/ (an explicit step)."""
    run_dir = Path(run_dir)
    meta = load_meta(run_dir)
    if not report.is_finished(meta):
        raise UserError(f"{run_dir}: a partial run (meta.json status {meta.get('status', 'missing')!r}) "
                        "cannot become a baseline")
    if not (run_dir / "records.jsonl").exists():
        raise UserError(f"{run_dir}: no records.jsonl")
    failed = tolerances.failed_checks(load_records(run_dir), meta)
    if failed:
        raise UserError(f"{run_dir}: {len(failed)} failed check(s) cannot become a baseline; first: {failed[0]}")
    dest = _resolve(baseline_root) / run_slug(run_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("records.jsonl", "meta.json"):
        shutil.copyfile(run_dir / name, dest / name)
    return dest
