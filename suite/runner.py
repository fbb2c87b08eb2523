"""run_scenarios: validated scenarios -> cases -> kind runners -> Records in a run directory -> report.

Every case is isolated: an exception or its time limit becomes an `error` record and the run goes on;
records are written as they finish, so a stop signal or a crash keeps every finished case and `kdbench report`
can render them. The run directory is locked for the whole run (rundir.py).
"""
from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from kdbench import config, estimate, rundir
from kdbench.errors import UserError, clip
from kdbench.interrupts import CaseTimeout, Interrupted, finishing, time_limit
from kdbench.kinds import run_case   # light: kinds/__init__ imports a kind's module only when a case runs
from kdbench.results import Record, RunWriter

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class RunContext:
    """What a kind runner needs besides its case."""
    device: str                       # "cpu" | "cuda"
    device_name: str
    run_dir: Path
    argv_base: str                    # "kdbench run <file> --device <dev> [--backends ...]" without --filter
    cache: dict = field(default_factory=dict)   # per-run memo (ceilings, built models, AR baselines)

    def repro(self, case: config.Case) -> str:
        return f"{self.argv_base.format(file=shlex.quote(case.file))} --filter {shlex.quote(case.name)}"

    def record(self, case: config.Case, backend: str, **fields) -> Record:
        """A Record keyed by the case (scenario, kind, name, family, dtype, this device) with its shape, seed
        and repro command; `fields` sets the rest (status, reason, dtype override, link, extra, ...)."""
        fields.setdefault("dtype", case.dtype)
        return Record(case.scenario, case.kind, case.name, case.family, backend, device=self.device_name,
                      shape=json.dumps(case.shape_dict(), separators=(",", ":")), seed=case.seed,
                      repro=self.repro(case), **fields)


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    records: list[Record]


def resolve_device(device: str) -> tuple[str, str]:
    """'auto' picks cuda when torch sees a GPU. Returns (device, human-readable name)."""
    import torch
    if device not in ("cpu", "cuda", "auto"):
        raise UserError(f"--device: got {device!r}, expected cpu, cuda or auto")
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise UserError("--device cuda: torch sees no CUDA GPU on this machine (try --device cpu)")
    if device == "auto":
        device = "cuda" if has_cuda else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return device, name


def make_run_dir(out_dir: str | None, scenarios: list[config.Scenario]) -> tuple[Path, rundir.RunLock]:
    return rundir.create(out_dir, [s.name for s in scenarios])


def load_all(paths: list[str], max_cases: int = config.MAX_CASES) -> list[config.Scenario]:
    """Every scenario, validated, before anything runs. Keys must be unique across files: the same
    (scenario, case) twice would collapse into one row in compare."""
    scenarios, seen = [], {}
    for p in paths:
        scenario = config.load(p, max_cases=max_cases)
        for case in scenario.cases:
            key = (case.scenario, case.name)
            if key in seen:
                raise UserError(f"{p}: case {case.name!r} of scenario {case.scenario!r} is also in {seen[key]}; "
                                "rename the scenario or the case (their rows would collide)")
            seen[key] = p
        scenarios.append(scenario)
    total = sum(len(s.cases) for s in scenarios)
    if total > max_cases:
        raise UserError(f"{', '.join(paths)}: {total} cases in all, more than the limit of {max_cases} per run "
                        "(raise it with --max-cases)")
    return scenarios


def run_scenarios(paths: list[str], out_dir: str | None = None, device: str = "auto", *,
                  filter_expr: str | list[str] | None = None, progress: bool = True,
                  max_cases: int = config.MAX_CASES, force: bool = False,
                  backends: list[str] | None = None) -> RunOutcome:
    """filter_expr: one --filter value or several (a case runs when any selects it; config.select); backends:
    --backends, the names each selected case keeps of its own list (config.restrict_backends).
    A scenario that cannot run here (estimate.verdict: too big, or no backend available) is a UserError
    before anything is allocated, unless force."""
    scenarios = load_all(paths, max_cases)
    every = [c for s in scenarios for c in s.cases]
    filters = [filter_expr] if isinstance(filter_expr, str) else filter_expr
    cases = config.restrict_backends(config.select(every, filters, ", ".join(paths)), backends, ", ".join(paths))
    device, device_name = resolve_device(device)
    if not force:
        refuse_unfit(scenarios, cases, device)
    run_dir, lock = make_run_dir(out_dir, scenarios)
    argv_base = "kdbench run {file} --device " + device + (f" --backends {','.join(backends)}" if backends else "")
    ctx = RunContext(device, device_name, run_dir, argv_base)
    writer = RunWriter(run_dir)
    meta = _meta(scenarios, device, device_name, filters)
    if backends:
        meta["backends"] = list(backends)
    writer.write_meta(meta)
    exit_code = EXIT_OK
    try:
        _run_cases(cases, ctx, writer, progress)
        meta["status"] = "finished"
    except Interrupted as exc:
        meta["status"], meta["stopped_by"] = "interrupted", str(exc)
        exit_code = exc.exit_code
    except KeyboardInterrupt:
        meta["status"], exit_code = "interrupted", EXIT_INTERRUPTED
    finally:
        with finishing():
            if meta["status"] == "interrupted":
                print(f"\ninterrupted ({meta.get('stopped_by', 'SIGINT')}): finished cases are kept",
                      file=sys.stderr)
            meta["finished_at"] = _dt.datetime.now().isoformat(timespec="seconds")
            meta["n_records"] = len(writer.records)
            writer.write_meta(meta)
            lock.release()
    if exit_code == EXIT_OK and any(r.status in ("fail", "error") for r in writer.records):
        exit_code = EXIT_FAIL
    return RunOutcome(run_dir, exit_code, writer.records)


def refuse_unfit(scenarios: list[config.Scenario], cases: list[config.Case], device: str) -> None:
    """UserError naming the first scenario whose selected cases do not fit this machine, with the estimate."""
    m = estimate.machine(device)
    for s in scenarios:
        chosen = [c for c in cases if c.file == s.file and c.scenario == s.name]
        fits, why = estimate.verdict(chosen, m) if chosen else (True, "")
        if not fits:
            raise UserError(f"{s.file}: refused on {device}: {why} (--force runs it anyway)")


def _run_cases(cases: list[config.Case], ctx: RunContext, writer: RunWriter, progress: bool) -> None:
    t0 = time.perf_counter()
    for i, case in enumerate(cases, 1):
        if progress:
            _progress(i, len(cases), case.name, time.perf_counter() - t0)
        done: set[str] = set()
        try:
            with time_limit(case.timeout_s):
                for rec in run_case(case, ctx):
                    writer.add(rec)
                    done.add(rec.backend)
        except CaseTimeout as exc:
            for backend in [b for b in case.backends if b not in done] or [""]:
                writer.add(ctx.record(case, backend, status="error", reason=f"error: {exc}"))
        except Exception as exc:  # one case's crash must not lose the others
            writer.add(error_record(case, ctx, exc))
    if progress:
        print(f"\r[{len(cases)}/{len(cases)}] done in {time.perf_counter() - t0:.1f} s" + " " * 40,
              file=sys.stderr)


def error_record(case: config.Case, ctx: RunContext, exc: BaseException, backend: str = "") -> Record:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return ctx.record(case, backend, status="error", reason=clip(f"{type(exc).__name__}: {exc}"),
                      extra={"traceback": "".join(tb[-6:])})


def _progress(i: int, n: int, name: str, elapsed: float) -> None:
    width = 24
    filled = int(width * (i - 1) / n)
    bar = "#" * filled + "-" * (width - filled)
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"[{bar}] {i}/{n} {elapsed:6.1f}s {name[:60]}" + (" " * 10 if end == "\r" else ""), end=end,
          file=sys.stderr, flush=True)


def _meta(scenarios: list[config.Scenario], device: str, device_name: str, filters: list[str] | None) -> dict:
    from kdbench import envinfo
    return {
        "status": "running",
        "started_at": _dt.datetime.now().isoformat(timespec="seconds"),
        "device": device,
        "device_name": device_name,
        "command": " ".join(shlex.quote(a) for a in ["kdbench", *sys.argv[1:]]) if sys.argv else "",
        "filter": filters[0] if filters and len(filters) == 1 else filters,   # one value: a string, as before
        "scenarios": [{"name": s.name, "kind": s.kind, "file": s.file, "text": s.text} for s in scenarios],
        "fingerprint": envinfo.fingerprint(),
    }
