"""A rank that raises, dies (SIGKILL) or hangs ends its case with a clear error within a bounded time, the
following case still runs and passes, and no rank process is left behind (CPU, gloo)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from kdbench import runner
from kdbench.parallel.job import Job
from kdbench.parallel.launch import launch
from kdbench.results import load_records

TIMEOUT_S = 4          # the collective timeout the healthy rank hits while its peer hangs

FAULTS = f"""
name: faults
kind: topology
cases:
  - name: fault
    backends: [torch]
    shape: {{model: tiny, gpus: 2, batch: 1, budget: 3, prompt_len: 4, dtype: float64, repeat: 1, warmup: 0,
            phases: [prefill, decode], timeout_s: {TIMEOUT_S}}}
    sweep: {{shape.fault: [raise, kill, hang]}}
    tolerance: {{rel_l2: 1.0e-13}}
  - name: healthy-after
    backends: [torch]
    shape: {{model: tiny, gpus: 2, batch: 1, budget: 3, prompt_len: 4, dtype: float64, repeat: 1, warmup: 0,
            phases: [prefill, decode], timeout_s: 30}}
    tolerance: {{rel_l2: 1.0e-13}}
"""


def _rank_children() -> list[int]:
    """Live child processes of this one started by multiprocessing's spawn (the ranks)."""
    me, out = str(os.getpid()), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[1]
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ppid == me and "spawn_main" in cmd:
            out.append(int(d.name))
    return out


def test_raise_kill_hang_end_their_case_only(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text(FAULTS)
    t0 = time.monotonic()
    res = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False)
    elapsed = time.monotonic() - t0
    recs = {r.case: r for r in load_records(tmp_path / "run")}
    assert res.exit_code == 1                                            # error rows fail the run
    raised, killed, hung = (recs[f"fault[fault={f}]"] for f in ("raise", "kill", "hang"))
    assert raised.status == "error" and "rank 1 failed" in raised.reason and "injected fault" in raised.reason
    assert killed.status == "error" and "rank 1 died (signal SIGKILL)" in killed.reason
    assert hung.status == "error" and "rank 0 failed" in hung.reason and "still running: killed" in hung.reason
    assert hung.extra["launch_s"] < TIMEOUT_S + 40                      # the collective timeout ended it
    healthy = [r for r in load_records(tmp_path / "run") if r.case == "healthy-after"]
    assert [r.status for r in healthy] == ["pass", "pass"]
    assert elapsed < 150
    assert _rank_children() == []


def test_deadline_kills_a_run_where_every_rank_hangs(tmp_path):
    """One rank that hangs has no peer to time out on: the launcher's own deadline ends it."""
    job = Job(model="tiny", seed=1, dtype="float64", parallel="tp", world=1, device="cpu", out_dir=str(tmp_path),
              fault="hang", fault_rank=0, phases=("prefill", "decode"), timeout_s=30)
    t0 = time.monotonic()
    res = launch(job, deadline_s=8)
    assert not res.ok and "still running after 8 s" in res.error and res.exit_codes[0] is not None
    assert time.monotonic() - t0 < 8 + 10
    assert _rank_children() == []


def test_case_time_limit_stops_the_ranks_too(tmp_path):
    """The runner's per-case limit (case_timeout_s) lands in the launcher's poll loop: the ranks are killed."""
    path = tmp_path / "limit.yaml"
    path.write_text("""
name: limit
kind: topology
case_timeout_s: 10
cases:
  - name: hang-long-timeout
    backends: [torch]
    shape: {model: tiny, gpus: 2, budget: 3, prompt_len: 4, dtype: float64, phases: [prefill, decode],
            fault: hang, timeout_s: 600}
""")
    t0 = time.monotonic()
    runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False)
    (rec,) = load_records(tmp_path / "run")
    assert rec.status == "error" and "timed out" in rec.reason
    assert time.monotonic() - t0 < 10 + 15
    assert _rank_children() == []
