"""kdbench's own launcher: one spawned process per rank (torch.multiprocessing, start method spawn), a TCP
rendezvous on a free local port, and a supervisor that ends the run at the first rank that raises or dies, or
when the deadline passes (a hung rank), killing every rank it started: no process outlives launch()."""
from __future__ import annotations

import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch.multiprocessing as mp

from .job import Job
from .worker import run_rank

STARTUP_S = 60.0   # spawn + import torch + build the model, on top of job.timeout_s
POLL_S = 0.05
GRACE_S = 0.5   # after the first failure, before choosing which rank caused it


@dataclass
class LaunchResult:
    ok: bool
    error: str                      # '' when ok: which rank failed, how, its traceback's last line
    elapsed_s: float
    exit_codes: list[int | None]    # None: was still running at the deadline (then killed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(job: Job, rank: int, init_method: str) -> None:
    """Child main: run the rank; on an exception write its traceback for the supervisor and exit 1."""
    try:
        run_rank(job, rank, init_method)
    except BaseException:   # noqa: BLE001 - the supervisor reports it; the exit code says it failed
        Path(job.out_dir, f"rank{rank}.error").write_text(traceback.format_exc())
        os._exit(1)


def launch(job: Job, deadline_s: float | None = None) -> LaunchResult:
    """Run job.world ranks to completion or to the first failure. deadline_s defaults to
    job.timeout_s + STARTUP_S; a rank still running then is reported as hung."""
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_entry, args=(job, r, init), daemon=True, name=f"kdbench-rank{r}")
             for r in range(job.world)]
    t0 = time.monotonic()
    limit = job.timeout_s + STARTUP_S if deadline_s is None else deadline_s
    for p in procs:
        p.start()
    error = ""
    try:
        error = _supervise(procs, job, t0, limit)
    finally:
        _stop(procs)
    return LaunchResult(not error, error, time.monotonic() - t0, [p.exitcode for p in procs])


def _supervise(procs, job: Job, t0: float, limit: float) -> str:
    while True:
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(GRACE_S)                       # let the peers' own errors land, then name the first cause
            return _first_failure(job, [p.exitcode for p in procs])
        if all(c == 0 for c in codes):
            return ""
        if time.monotonic() - t0 > limit:
            hung = [r for r, c in enumerate(codes) if c is None]
            return (f"rank(s) {hung} still running after {limit:.0f} s (hung; collective timeout "
                    f"{job.timeout_s:.0f} s): killed")
        time.sleep(POLL_S)


def _first_failure(job: Job, codes: list[int | None]) -> str:
    """The root cause among the failed ranks: a rank killed by a signal, else the earliest traceback written
    (a peer's failure makes the others' collectives fail a moment later)."""
    failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
    err = {r: Path(job.out_dir, f"rank{r}.error") for r in failed}
    first = min(failed, key=lambda r: (codes[r] > 0, err[r].stat().st_mtime_ns if err[r].exists() else 0))
    others = [r for r in failed if r != first]
    alive = [r for r, c in enumerate(codes) if c is None]
    return (_why(job, first, codes[first]) + (f"; then rank(s) {others} failed" if others else "")
            + (f"; rank(s) {alive} still running: killed" if alive else ""))


def _why(job: Job, rank: int, code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return f"rank {rank} died (signal {name})"
    err = Path(job.out_dir, f"rank{rank}.error")
    last = err.read_text().strip().splitlines()[-1] if err.exists() else "no traceback written"
    return f"rank {rank} failed (exit {code}): {last}"


def _stop(procs) -> None:
    """SIGTERM every live rank, then SIGKILL what is left after 2 s; reap all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 2.0
    for p in procs:
        p.join(max(end - time.monotonic(), 0.0))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5.0)
