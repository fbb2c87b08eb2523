"""The kdbench command line: parse, then call one function. Exit codes: 0 all passed, 1 a check failed, a
regression, or a compare that fails closed, 2 usage or input error (one line, no traceback), 128 + the signal
when stopped by SIGINT (130), SIGHUP (129) or SIGTERM (143): finished cases kept, the run marked interrupted."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kdbench import interrupts, replay_cli
from kdbench.errors import UserError


def _run(args) -> int:
    from kdbench import report, runner
    if args.max_cases < 1:
        raise UserError(f"--max-cases: got {args.max_cases}, expected an integer >= 1")
    outcome = runner.run_scenarios(args.scenarios, args.out, args.device, filter_expr=args.filter,
                                   max_cases=args.max_cases, force=args.force,
                                   backends=_backend_names(args.backends))
    with interrupts.finishing():    # the run is saved; a late signal must not lose its report
        path = report.render(outcome.run_dir)
    _summary(outcome.records)
    _print_path("report", path)
    return outcome.exit_code


def _backend_names(value: str | None) -> list[str] | None:
    """--backends a,b: the names, in order; an empty one is a usage error."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",")]
    if not all(names):
        raise UserError(f"--backends: got {value!r}, expected comma-separated backend names "
                        "(e.g. cuda,flashinfer_cascade)")
    return names


def _print_path(label: str, path) -> None:
    """`label: path` on one line, whatever the path holds (tools read this line)."""
    text = str(path)
    print(f"{label}: {text if text.isprintable() else ascii(text)}")


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
    _print_path("report", report.render(run_dir))
    return 0


def _run_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "records.jsonl").exists() and not (p / "meta.json").exists():
        raise UserError(f"{path}: not a kdbench run directory (no records.jsonl or meta.json)")
    for name in ("records.jsonl", "meta.json"):
        if (p / name).exists() and not (p / name).is_file():
            raise UserError(f"{p / name}: is not a regular file; the run is damaged")
    return p


def _compare(args) -> int:
    from kdbench import regress
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha: got {args.alpha}, expected a significance level in (0, 1)")
    if not 0 <= args.min_effect:
        raise UserError(f"--min-effect: got {args.min_effect}, expected a relative change >= 0")
    if args.against:
        return _compare_against(args)
    if len(args.paths) != 2:
        raise UserError(f"compare: got {len(args.paths)} run directories, expected BASE_RUN NEW_RUN "
                        "(or --against REV [SCENARIO...])")
    base, new = _run_dir(args.paths[0]), Path(args.paths[1])
    if new.exists():
        _run_dir(args.paths[1]) if (new / "meta.json").exists() or (new / "records.jsonl").exists() else None
    result = regress.compare(base, new, alpha=args.alpha, min_effect=args.min_effect,
                             allow_partial=args.allow_partial)
    for reason in result.closed:
        print(f"kdbench compare: FAIL (closed): {reason}", file=sys.stderr)
    if not new.is_dir():
        return result.exit_code     # nowhere to put the HTML diff; the reason is on the terminal
    out = Path(args.out) if args.out else new / "compare.html"
    path = regress.render_compare(result, out)
    print("verdicts: " + regress.headline(result))
    _print_path("report", path)
    return result.exit_code


def _compare_against(args) -> int:
    from kdbench import ab, nightly
    if args.rounds < 1:
        raise UserError(f"--rounds: got {args.rounds}, expected an integer >= 1 (ABBA pairs)")
    scenarios = args.paths or nightly.scenario_paths()
    for s in scenarios:
        if not Path(s).is_file():
            raise UserError(f"{s}: no such scenario file (with --against the arguments are scenario files)")
    out = Path(args.out_dir or f"runs/ab-{nightly._stamp()}")
    plan = ab.AbPlan(args.against, tuple(scenarios), out, tuple(args.filter or ()), args.device, args.rounds)
    return nightly.compare_against(plan, alpha=args.alpha, min_effect=args.min_effect)


def _list(args) -> int:
    from kdbench import config, estimate, families
    from kdbench.backends import registry
    device = "cuda" if _has_cuda() else "cpu"
    m = estimate.machine(device)
    print(f"scenarios (on this machine: {device}, {m.host_bytes / estimate.GB:.0f} GB host"
          + (f", {m.device_bytes / estimate.GB:.0f} GB GPU" if m.device_bytes else "") + "):")
    for path in sorted(Path(args.root).glob("**/*.yaml")):
        try:
            s = config.load(path, max_cases=args.max_cases)
        except UserError as exc:
            print(f"  {path}  (invalid: {exc})")
            continue
        fits, why = estimate.verdict(list(s.cases), m)
        total = sum(estimate.case(c, device).seconds for c in s.cases)
        peak = max((estimate.case(c, device) for c in s.cases), key=lambda e: max(e.host_bytes, e.device_bytes))
        verdict = f"fits: {peak.text().split(', ~')[0]} peak, ~{estimate._duration(total)}" if fits else f"refused: {why}"
        print(f"  {path}  ({s.kind}, {len(s.cases)} cases) {verdict}")
    print("kernel families and backends:")
    for fam in families.FAMILIES:
        print(f"  {fam}")
        for backend in registry.for_family(fam):
            ok, reason = registry.available(backend, device)
            role = registry.role(backend)
            print(f"    {backend:19s} {role:9s} {'available' if ok else 'unavailable: ' + reason}")
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
    if args.calibrate:
        return _calibrate(args)
    if args.history:
        return _history(args)
    return nightly.run_nightly(args.out, args.baselines, against=args.against, rounds=args.rounds)


def _calibrate(args) -> int:
    from kdbench import drift, nightly
    runs = [_run_dir(d) for d in args.calibrate]
    dest = nightly._resolve(args.baselines) / nightly.run_slug(runs[0])
    path = drift.write_spread(dest, runs)
    print(f"A/A spread of {len(runs)} runs written: {path}")
    return 0


def _history(args) -> int:
    from kdbench import drift, nightly
    folder = Path(args.history)
    spread = {}
    runs = sorted(d for d in folder.iterdir() if (d / "meta.json").exists()) if folder.is_dir() else []
    if runs:
        spread = drift.load_spread(nightly._resolve(args.baselines) / nightly.run_slug(runs[0]))
    points = drift.history(folder, spread=spread)
    for line in drift.history_lines(points):
        print(line)
    print(f"{sum(p.flagged for p in points)} of {len(points)} gating rows changed level", file=sys.stderr)
    return 0


class _Defaults(argparse.HelpFormatter):
    """Appends each option's default to its help, unless there is none or the help already names one."""
    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def config_max_cases() -> int:
    from kdbench.config import MAX_CASES   # config imports yaml only: light
    return MAX_CASES


def _add_compare(sub) -> None:
    c = sub.add_parser("compare", formatter_class=_Defaults,
                       help="compare two runs, or this code against REV on this machine: U test, verdicts, HTML",
                       description="Verdicts per row: fail, slower, faster, ambiguous (the test cannot be trusted: "
                                   "too few samples to reach alpha, SM clocks or throttling differ), same, "
                                   "skipped, missing, new. Exit 1 on a failed check or a slower gating row.")
    c.add_argument("paths", nargs="*", metavar="PATH",
                   help="BASE_RUN NEW_RUN; with --against: scenario files (default scenarios/nightly/*.yaml)")
    c.add_argument("--against", metavar="REV",
                   help="a git revision or a source-tree path: run it and this code in ABBA rounds here")
    c.add_argument("--rounds", type=int, default=2, help="--against: ABBA round pairs (2 = A B B A)")
    c.add_argument("--filter", action="append", metavar="EXPR", help="--against: case filter, as for run")
    c.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"], help="--against: device")
    c.add_argument("--out-dir", help="--against: where rounds and pooled runs go (default runs/ab-<time>)")
    c.add_argument("--out", help="HTML path (default NEW_RUN/compare.html)")
    c.add_argument("--alpha", type=float, default=0.002, help="U-test significance level")
    c.add_argument("--min-effect", type=float, default=0.05, help="minimum relative change of the median")
    c.add_argument("--allow-partial", action="store_true",
                   help="compare a partial, empty or different-scenario new run instead of failing (exit 1)")
    c.set_defaults(func=_compare)


def _add_nightly(sub) -> None:
    n = sub.add_parser("nightly", formatter_class=_Defaults,
                       help="run scenarios/nightly/*.yaml and compare with the stored baseline")
    n.add_argument("--out", help="run directory")
    n.add_argument("--baselines", default="reports/baselines", help="baseline root (one folder per GPU)")
    n.add_argument("--update-baseline", metavar="RUN_DIR", help="accept RUN_DIR as the new baseline")
    n.add_argument("--against", metavar="REV", help="gate on ABBA rounds of REV (git revision or source tree) "
                                                    "and this code on this machine; the baseline shows drift")
    n.add_argument("--rounds", type=int, default=2, help="--against: ABBA round pairs")
    n.add_argument("--calibrate", nargs="+", metavar="RUN_DIR",
                   help="store the A/A spread of >= 2 runs of one code with the baseline (per-row min effect)")
    n.add_argument("--history", metavar="DIR", help="change-point view over the nightly runs in DIR")
    n.set_defaults(func=_nightly)


def _corpus(args) -> int:
    from kdbench import corpus, prompts, tokenizer
    if args.manifest:
        man = corpus.write_manifest()
        print(f"manifest: {corpus.MANIFEST} ({len(man['files'])} files)")
    path = corpus.build(Path(args.out))
    print(f"corpus: {path}")
    if args.tokenizer or args.prompts:
        docs = corpus.load(path)
        if args.tokenizer:
            tokenizer.train([d.text for d in docs if d.split == "train"]).save(str(tokenizer.TOKENIZER))
            print(f"tokenizer: {tokenizer.TOKENIZER}")
        if args.prompts:
            print("prompts: " + ", ".join(str(p) for p in prompts.write_all(docs)))
    return 0


def _train(args) -> int:
    from kdbench import train_pair
    if args.device == "cuda" and not _has_cuda():
        raise UserError("--device cuda: no CUDA device here")
    train_pair.run(Path(args.out), Path(args.corpus), args.size, args.seed, args.device,
                   args.target_seconds, args.drafter_seconds)
    if args.check:
        train_pair.quick_accept(Path(args.out), args.device)
    return 0


def _add_pair(sub) -> None:
    """corpus and train: the trained pair (plans/0007)."""
    co = sub.add_parser("corpus", help="build the trained pair's corpus from the shipped manifest (no downloads)")
    co.add_argument("--out", default=".kdbench/corpus.jsonl.xz", help="the built corpus (JSON lines, xz)")
    co.add_argument("--manifest", action="store_true", help="rescan this interpreter's files into a new manifest")
    co.add_argument("--tokenizer", action="store_true", help="retrain the shipped tokenizer on the train split")
    co.add_argument("--prompts", action="store_true", help="recut the shipped held-out prompt sets")
    co.set_defaults(func=_corpus)
    t = sub.add_parser("train", help="train the MLA+MoE target and its block drafter (plans/0007)")
    t.add_argument("--out", required=True, help="folder for the pair files, meta and loss curves")
    t.add_argument("--corpus", default=".kdbench/corpus.jsonl.xz", help="built by `kdbench corpus`")
    t.add_argument("--size", default="full", choices=["tiny", "full"])
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    t.add_argument("--target-seconds", type=float, default=0.0,
                   help="fit the target's step count to S seconds (0: no cap)")
    t.add_argument("--drafter-seconds", type=float, default=0.0,
                   help="fit the drafter's step count to S seconds (0: no cap)")
    t.add_argument("--check", action="store_true", help="then print tau of chain / ddtree on held-out prompts")
    t.set_defaults(func=_train)


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
    r.add_argument("--max-cases", type=int, default=config_max_cases(), metavar="N",
                   help="refuse a run that expands to more than N cases (default %(default)s)")
    r.add_argument("--backends", metavar="NAMES",
                   help="comma-separated backend names: each selected case runs only these of its own backends "
                        "(a case listing none of them is skipped); e.g. ours against the peers without the slow "
                        "torch baselines. Rows' repro commands carry it")
    r.add_argument("--force", action="store_true",
                   help="run scenarios that do not fit this machine (estimated memory, no available backend)")
    r.set_defaults(func=_run)
    rep = sub.add_parser("report", help="render the HTML report of a run directory (partial runs too)")
    rep.add_argument("run_dir")
    rep.set_defaults(func=_report)
    _add_compare(sub)
    ls = sub.add_parser("list", help="scenarios, kernel families, backends and their availability")
    ls.add_argument("--root", default="scenarios", help="where to look for scenario files")
    ls.add_argument("--max-cases", type=int, default=config_max_cases(), metavar="N", help=argparse.SUPPRESS)
    ls.set_defaults(func=_list)
    e = sub.add_parser("env", help="CPU, GPUs, driver, CUDA, torch, NVML topology")
    e.set_defaults(func=_env)
    b = sub.add_parser("build", help="JIT-build the CUDA extension (GPU machine)")
    b.add_argument("--verbose", action="store_true")
    b.set_defaults(func=_build)
    _add_nightly(sub)
    replay_cli.add_commands(sub)   # trace, replay (suite/replay_cli.py)
    _add_pair(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    previous = interrupts.install()   # SIGTERM and SIGHUP behave like Ctrl-C from here on
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UserError as exc:
        print(f"kdbench: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:         # an I/O error on a path the user gave (unreadable, full disk, ...)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kdbench: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:   # outside the case loop (imports, report rendering): nothing half-written
        with interrupts.finishing():
            print(f"\nkdbench: interrupted ({exc if isinstance(exc, interrupts.Interrupted) else 'SIGINT'})",
                  file=sys.stderr)
            return getattr(exc, "exit_code", 130)
    finally:
        interrupts.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
