"""The kdbench command line: parse, then call one function. Exit codes: 0 all passed, 1 a check failed or
a regression, 2 usage or input error (one line, no traceback), 130 interrupted (finished cases kept)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kdbench.errors import UserError


def _run(args) -> int:
    from kdbench import report, runner
    outcome = runner.run_scenarios(args.scenarios, args.out, args.device, args.filter)
    path = report.render(outcome.run_dir)
    _summary(outcome.records)
    print(f"report: {path}")
    return outcome.exit_code


def _summary(records) -> None:
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.status] = counts.get(rec.status, 0) + 1
    print("records: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    for rec in records:
        if rec.status in ("fail", "error"):
            print(f"  {rec.status.upper()}: {rec.case} [{rec.backend}] {rec.reason}", file=sys.stderr)


def _report(args) -> int:
    from kdbench import report
    run_dir = _run_dir(args.run_dir)
    print(f"report: {report.render(run_dir)}")
    return 0


def _run_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "records.jsonl").exists() and not (p / "meta.json").exists():
        raise UserError(f"{path}: not a kdbench run directory (no records.jsonl or meta.json)")
    return p


def _compare(args) -> int:
    from kdbench import regress
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha: got {args.alpha}, expected a significance level in (0, 1)")
    if not 0 <= args.min_effect:
        raise UserError(f"--min-effect: got {args.min_effect}, expected a relative change >= 0")
    base, new = _run_dir(args.base), _run_dir(args.new)
    result = regress.compare(base, new, alpha=args.alpha, min_effect=args.min_effect)
    out = Path(args.out) if args.out else new / "compare.html"
    path = regress.render_compare(result, out)
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(result.verdict_counts.items())))
    print(f"report: {path}")
    return result.exit_code


def _list(args) -> int:
    from kdbench import config, families
    print("scenarios:")
    for path in sorted(Path(args.root).glob("**/*.yaml")):
        try:
            s = config.load(path)
            print(f"  {path}  ({s.kind}, {len(s.cases)} cases)")
        except UserError as exc:
            print(f"  {path}  (invalid: {exc})")
    print("kernel families and backends:")
    device = "cuda" if _has_cuda() else "cpu"
    for fam in families.FAMILIES:
        print(f"  {fam}")
        for backend in families.FAMILY_BACKENDS[fam]:
            ok, reason = families.backend_available(backend, device)
            print(f"    {backend:14s} {'available' if ok else 'unavailable: ' + reason}")
    return 0


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _env(args) -> int:
    from kdbench import envinfo
    print(envinfo.describe())
    return 0


def _build(args) -> int:
    from kdbench.backends import cuda_build
    reason = cuda_build.unavailable_reason()
    if reason:
        raise UserError(f"cannot build the CUDA extension here: {reason}")
    module = cuda_build.load(verbose=args.verbose)
    print(f"built: {module.__file__}")
    return 0


def _nightly(args) -> int:
    from kdbench import nightly
    if args.update_baseline:
        path = nightly.update_baseline(_run_dir(args.update_baseline), args.baselines)
        print(f"baseline updated: {path}")
        return 0
    return nightly.run_nightly(args.out, args.baselines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kdbench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    r = sub.add_parser("run", help="run scenarios, write results and the HTML report")
    r.add_argument("scenarios", nargs="+", metavar="SCENARIO", help="scenario YAML files")
    r.add_argument("--out", help="run directory (default runs/<time>-<names>)")
    r.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    r.add_argument("--filter", action="append", metavar="EXPR",
                   help="case filter: an exact case name, or comma-separated terms that must all match "
                        "(key=value on family/dtype/shape keys, else a substring of the name); repeat it to "
                        "run the cases any of the values selects")
    r.set_defaults(func=_run)
    rep = sub.add_parser("report", help="render the HTML report of a run directory (partial runs too)")
    rep.add_argument("run_dir")
    rep.set_defaults(func=_report)
    c = sub.add_parser("compare", help="compare two runs: U test on raw samples, verdicts, HTML diff")
    c.add_argument("base")
    c.add_argument("new")
    c.add_argument("--out", help="HTML path (default NEW/compare.html)")
    c.add_argument("--alpha", type=float, default=0.002, help="U-test significance level")
    c.add_argument("--min-effect", type=float, default=0.05, help="minimum relative change of the median")
    c.set_defaults(func=_compare)
    ls = sub.add_parser("list", help="scenarios, kernel families, backends and their availability")
    ls.add_argument("--root", default="scenarios", help="where to look for scenario files")
    ls.set_defaults(func=_list)
    e = sub.add_parser("env", help="CPU, GPUs, driver, CUDA, torch, NVML topology")
    e.set_defaults(func=_env)
    b = sub.add_parser("build", help="JIT-build the CUDA extension (GPU machine)")
    b.add_argument("--verbose", action="store_true")
    b.set_defaults(func=_build)
    n = sub.add_parser("nightly", help="run scenarios/nightly/*.yaml and compare with the stored baseline")
    n.add_argument("--out", help="run directory")
    n.add_argument("--baselines", default="reports/baselines", help="baseline root (one folder per GPU)")
    n.add_argument("--update-baseline", metavar="RUN_DIR", help="accept RUN_DIR as the new baseline")
    n.set_defaults(func=_nightly)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"kdbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
