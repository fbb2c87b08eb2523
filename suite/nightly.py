"""Nightly: run scenarios/nightly/*.yaml, compare with the stored baseline of this GPU kind
(reports/baselines/<gpu-slug>/), write report.html + compare.html; `update_baseline` accepts a run.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from kdbench import regress, report
from kdbench.errors import UserError
from kdbench.results import load_meta

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


def run_nightly(out_dir: str | Path | None, baseline_root: str | Path = "reports/baselines", *,
                scenario_dir: str | Path = NIGHTLY_DIR) -> int:
    """Run the nightly scenarios, render the report, compare with the baseline. Exit code: the worse of the
    run's (1 on a failed check) and the compare's (1 on a regression or failure); 0 without a baseline
    only if every check passed, with a message saying how to create one."""
    from kdbench.runner import run_scenarios   # the runner imports torch; keep `kdbench --help` light
    outcome = run_scenarios(scenario_paths(scenario_dir), out_dir, device="auto", filter_expr=None)
    run_dir = Path(outcome.run_dir)
    print(f"report: {report.render(run_dir)}")
    base = _resolve(baseline_root) / run_slug(run_dir)
    if not (base / "records.jsonl").exists():
        print(f"no baseline at {base}; after checking this run, accept it with "
              f"`kdbench nightly --update-baseline {run_dir}`", file=sys.stderr)
        return outcome.exit_code
    result = regress.compare(base, run_dir)
    path = regress.render_compare(result, run_dir / "compare.html")
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in result.verdict_counts.items() if v))
    print(f"compare: {path}")
    return max(outcome.exit_code, result.exit_code)


def update_baseline(run_dir: str | Path, baseline_root: str | Path = "reports/baselines") -> Path:
    """Copy a finished run's records.jsonl + meta.json to <baseline_root>/<gpu-slug>/ (an explicit step)."""
    run_dir = Path(run_dir)
    meta = load_meta(run_dir)
    if not report.is_finished(meta):
        raise UserError(f"{run_dir}: a partial run (meta.json status {meta.get('status', 'missing')!r}) "
                        "cannot become a baseline")
    if not (run_dir / "records.jsonl").exists():
        raise UserError(f"{run_dir}: no records.jsonl")
    dest = _resolve(baseline_root) / run_slug(run_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("records.jsonl", "meta.json"):
        shutil.copyfile(run_dir / name, dest / name)
    return dest
