"""The CLI end to end on CPU: run -> report -> compare, exit codes, and no traceback for user mistakes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdbench import cli
from kdbench.results import load_meta, load_records

SCENARIO = """
name: cli-test
kind: kernel
seed: 11
cases:
  - name: accept
    family: tree_accept
    backends: [numpy_ref, torch, cuda]
    shape: {batch: 2, budget: 8, vocab: 20}
    trials: 2
    timing: {warmup: 1, repeat: 3}
  - name: compact
    family: kv_compact
    backends: [numpy_ref, torch]
    shape: {batch: 2, budget: 4, past_len: 5, layers: 1, dim: 8}
    trials: 1
    timing: {warmup: 0, repeat: 3}
"""


@pytest.fixture()
def scenario(tmp_path) -> Path:
    path = tmp_path / "cli test.yaml"   # a space: repro commands must quote paths
    path.write_text(SCENARIO)
    return path


def test_run_report_compare_end_to_end(scenario, tmp_path, capsys):
    base, new = tmp_path / "base", tmp_path / "new"
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(base)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == f"report: {base / 'report.html'}"
    records = load_records(base)
    statuses = {(r.case, r.backend): r.status for r in records}
    assert statuses[("accept", "torch")] == "pass" and statuses[("compact", "torch")] == "pass"
    assert statuses[("accept", "cuda")] == "skipped"
    assert load_meta(base)["status"] == "finished"
    assert (base / "results.csv").read_text().startswith("scenario,kind,case,family,backend")
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(new), "--filter", "accept"]) == 0
    assert {r.case for r in load_records(new)} == {"accept"}
    assert cli.main(["report", str(new)]) == 0
    code = cli.main(["compare", str(base), str(new)])
    assert code in (0, 1) and (new / "compare.html").exists()


def test_repro_command_reruns_exactly_one_case(scenario, tmp_path):
    run = tmp_path / "r"
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(run)]) == 0
    rec = next(r for r in load_records(run) if r.case == "accept" and r.backend == "torch")
    assert rec.repro.startswith("kdbench run ") and "--filter accept" in rec.repro


@pytest.mark.parametrize("argv, fragment", [
    (["run", "does/not/exist.yaml"], "no such scenario file"),
    (["run", "{scenario}", "--out", "/proc/kdbench-cannot-write"], "--out /proc/kdbench-cannot-write: cannot write"),
    (["run", "{scenario}", "--filter", "no-such-case"], "matches no case"),
    (["report", "{tmp}"], "not a kdbench run directory"),
    (["compare", "{tmp}", "{tmp}"], "not a kdbench run directory"),
])
def test_user_mistakes_exit_2_with_one_line(argv, fragment, scenario, tmp_path, capsys):
    argv = [a.format(scenario=scenario, tmp=tmp_path) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [["run", "--no-such-flag", "x.yaml"], ["frobnicate"], []])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_bad_scenario_in_a_real_process_exits_2_without_traceback():
    bad = Path(__file__).parent / "data" / "bad_scenarios" / "unknown_key.yaml"
    proc = subprocess.run([sys.executable, "-m", "kdbench", "run", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "cases[0].shape.colour: unknown key" in proc.stderr and "Traceback" not in proc.stderr


def test_a_backend_that_raises_is_recorded_and_the_run_continues(scenario, tmp_path, monkeypatch):
    from kdbench.families import tree_accept

    real_run = tree_accept.run

    def flaky(backend, inputs, case, device):
        if backend == "torch":
            raise RuntimeError("planted failure")
        return real_run(backend, inputs, case, device)

    monkeypatch.setattr(tree_accept, "run", flaky)
    run = tmp_path / "r"
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(run)]) == 1
    recs = {(r.case, r.backend): r for r in load_records(run)}
    assert recs[("accept", "torch")].status == "error"
    assert "planted failure" in recs[("accept", "torch")].reason
    assert recs[("compact", "torch")].status == "pass"      # the next case still ran


def test_report_renders_a_run_whose_process_was_killed(tmp_path):
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\nkind: kernel\ncases:\n" + "".join(
        f"  - name: c{i}\n    family: tree_verify_mla\n    backends: [numpy_ref]\n"
        f"    shape: {{batch: 1, heads: 8, nodes: 17, past_len: 3000}}\n    timing: {{warmup: 0, repeat: 3}}\n"
        for i in range(40)))
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "kdbench", "run", str(slow), "--device", "cpu",
                             "--out", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not _lines(run / "records.jsonl"):
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = _lines(run / "records.jsonl")
    assert 1 <= finished < 40
    assert json.loads((run / "meta.json").read_text())["status"] == "running"
    assert cli.main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    assert "partial" in html.lower()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_exact_repro_filter_runs_only_that_case(tmp_path):
    smoke = Path(__file__).parents[1] / "scenarios" / "smoke.yaml"
    run = tmp_path / "r"
    assert cli.main(["run", str(smoke), "--device", "cpu", "--out", str(run), "--filter", "tree_verify_mla"]) == 0
    assert {r.case for r in load_records(run)} == {"tree_verify_mla"}   # not tree_verify_mla-bf16


def test_repeated_filter_runs_the_union(tmp_path):
    smoke = Path(__file__).parents[1] / "scenarios" / "smoke.yaml"
    run = tmp_path / "r"
    argv = ["run", str(smoke), "--device", "cpu", "--out", str(run), "--filter", "tree_verify_mla",
            "--filter", "kv_compact"]
    assert cli.main(argv) == 0
    assert {r.case for r in load_records(run)} == {"tree_verify_mla", "kv_compact"}
    assert load_meta(run)["filter"] == ["tree_verify_mla", "kv_compact"]


def test_out_directory_holding_a_run_is_refused(scenario, tmp_path, capsys):
    run = tmp_path / "r"
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(run), "--filter", "compact"]) == 0
    before = (run / "records.jsonl").read_text()
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (run / "records.jsonl").read_text() == before


def test_backends_option_keeps_only_those_backends(scenario, tmp_path):
    """--backends torch: each case runs only that of its own backends, the repro commands carry the option, and
    a name no case lists, or an empty one, is a one-line usage error."""
    run = tmp_path / "r"
    assert cli.main(["run", str(scenario), "--device", "cpu", "--out", str(run), "--backends", "torch"]) == 0
    records = load_records(run)
    assert {r.backend for r in records} == {"torch"} and {r.case for r in records} == {"accept", "compact"}
    assert all(r.repro.endswith("--backends torch --filter " + r.case) for r in records)
    assert load_meta(run)["backends"] == ["torch"]
    for bad, message in (("torch,flashinfer_cascade", "--backends flashinfer_cascade: no selected case"),
                         ("torch,", "expected comma-separated backend names")):
        proc = subprocess.run([sys.executable, "-m", "kdbench", "run", str(scenario), "--device", "cpu",
                               "--out", str(tmp_path / bad.replace(",", "_")), "--backends", bad],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_backends_option_drops_cases_that_list_none(tmp_path):
    smoke = Path(__file__).parents[1] / "scenarios" / "smoke.yaml"
    run = tmp_path / "r"
    argv = ["run", str(smoke), "--device", "cpu", "--out", str(run), "--filter", "kv_compact", "--filter",
            "tree_verify_mla", "--backends", "torch_twopass"]
    assert cli.main(argv) == 0   # kv_compact lists [torch, cuda]: dropped, not run empty
    assert {(r.case, r.backend) for r in load_records(run)} == {("tree_verify_mla", "torch_twopass")}
