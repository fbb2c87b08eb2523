"""Issue 14, compare fails closed and damaged input: a missing, partial, empty or other-scenario new run
exits 1 with the reason; every damaged run directory, records line, meta.json or path is one line, exit 2,
no traceback; a torn last line alone is tolerated and said; equal keys are an error, never merged."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kdbench import cli
from kdbench.results import Record, RunWriter, load_run_records

BAD = Path(__file__).parent / "data" / "bad_scenarios"


def _rec(case: str, seed: int, scenario: str = "nightly", backend: str = "cuda") -> Record:
    s = list(1e-3 * np.exp(np.random.default_rng(seed).normal(0, 0.03, 20)))
    return Record(scenario, "kernel", case, "tree_build", backend, "float32", "cpu", samples_s=s, n_samples=20)


def _run(path: Path, records: list[Record], status: str = "finished", scenarios=("nightly",)) -> Path:
    w = RunWriter(path)
    for r in records:
        w.add(r)
    w.write_meta({"status": status, "scenarios": [{"name": n} for n in scenarios]})
    return path


@pytest.fixture()
def base(tmp_path) -> Path:
    return _run(tmp_path / "base", [_rec("a", 1), _rec("b", 2)])


def _one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_a_good_new_run_passes(base, tmp_path, capsys):
    new = _run(tmp_path / "new", [_rec("a", 3), _rec("b", 4)])
    assert cli.main(["compare", str(base), str(new)]) == 0
    assert "FAIL (closed)" not in capsys.readouterr().err


@pytest.mark.parametrize("make, fragment", [
    (lambda p: _run(p, [_rec("a", 3)], status="running"), "partial (meta.json status 'running'"),
    (lambda p: _run(p, [_rec("a", 3)], status="interrupted"), "status 'interrupted'"),
    (lambda p: _run(p, []), "holds no records"),
    (lambda p: _run(p, [_rec("a", 3, scenario="other")], scenarios=("other",)), "ran other scenarios (other)"),
    (lambda p: (p.mkdir(), (p / "meta.json").write_text('{"status": "finished"}'), p)[-1], "holds no records"),
    (lambda p: p, "does not exist or holds no run"),
])
def test_compare_fails_closed_on_a_dead_new_run(base, tmp_path, capsys, make, fragment):
    new = make(tmp_path / "new")
    assert cli.main(["compare", str(base), str(new)]) == 1
    err = _one_line_error(capsys, "FAIL (closed)", fragment)
    assert err.count("FAIL (closed)") >= 1


def test_allow_partial_compares_what_is_there(base, tmp_path, capsys):
    new = _run(tmp_path / "new", [_rec("a", 3)], status="running")
    assert cli.main(["compare", str(base), str(new), "--allow-partial"]) == 0
    assert "allowed by --allow-partial" in (new / "compare.html").read_text()


LINE = json.dumps({"scenario": "nightly", "kind": "kernel", "case": "z", "family": "tree_build",
                   "backend": "cuda"})


@pytest.mark.parametrize("damage, fragment", [
    (lambda t: "garbage\n" + t, "line 1 is not a valid record"),
    (lambda t: t + "[1, 2]\n", "line 3 is not a valid record (expected a JSON object"),
    (lambda t: t + LINE.replace('"z"', "7") + "\n", "line 3 is not a valid record (case: got 7, expected a string"),
    (lambda t: t + LINE.replace('"cuda"}', '"cuda", "samples_s": "fast"}') + "\n", "samples_s: got"),
    (lambda t: t + LINE.replace('"case": "z", ', "") + "\n", "missing key 'case'"),
    (lambda t: t + t.splitlines()[0] + "\n", "line 3 repeats the key of line 1"),
    (lambda t: t.encode("latin-1", "replace").decode() + "\udcff", None),
])
@pytest.mark.parametrize("command", ["compare", "report"])
def test_a_damaged_records_file_is_one_line_exit_2(base, tmp_path, capsys, damage, fragment, command):
    new = _run(tmp_path / "new", [_rec("a", 3), _rec("b", 4)])
    path = new / "records.jsonl"
    text = damage(path.read_text())
    if fragment is None:                       # invalid UTF-8 mid-file
        path.write_bytes(b"\xff\xfe" + path.read_bytes())
        fragment = "not UTF-8"
    else:
        path.write_text(text)
    argv = ["compare", str(base), str(new)] if command == "compare" else ["report", str(new)]
    assert cli.main(argv) == 2
    err = _one_line_error(capsys, str(path), fragment)
    assert err.count("\n") == 1, err


def test_a_torn_last_line_alone_is_tolerated_and_said(base, tmp_path, capsys):
    new = _run(tmp_path / "new", [_rec("a", 3), _rec("b", 4)])
    with open(new / "records.jsonl", "a") as fh:
        fh.write(LINE[:30])                     # the write the process died in: no newline
    loaded = load_run_records(new)
    assert loaded.torn_last_line and len(loaded.records) == 2
    assert cli.main(["compare", str(base), str(new)]) == 0
    assert "ends in a torn line" in (new / "compare.html").read_text()
    assert cli.main(["report", str(new)]) == 0


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: (d / "meta.json").write_text("{not json"), "meta.json: not valid JSON"),
    (lambda d: (d / "meta.json").write_text("[1]"), "meta.json: expected a JSON object, got list"),
    (lambda d: (d / "meta.json").write_text('{"status": "finished", "scenarios": 3}'), "scenarios: got int"),
    (lambda d: ((d / "meta.json").unlink(), (d / "meta.json").mkdir()), "meta.json: is not a regular file"),
    (lambda d: (shutil.rmtree(d), d.mkdir(), (d / "records.jsonl").mkdir()), "records.jsonl: is not a regular"),
])
@pytest.mark.parametrize("command", ["compare", "report"])
def test_a_damaged_run_directory_is_one_line_exit_2(base, tmp_path, capsys, damage, fragment, command):
    new = _run(tmp_path / "new", [_rec("a", 3)])
    damage(new)
    argv = ["compare", str(base), str(new)] if command == "compare" else ["report", str(new)]
    assert cli.main(argv) == 2
    assert _one_line_error(capsys, fragment).count("\n") == 1


def test_out_naming_a_file_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    smoke = Path(__file__).parents[1] / "scenarios" / "smoke.yaml"
    assert cli.main(["run", str(smoke), "--device", "cpu", "--out", str(tmp_path / "file")]) == 2
    _one_line_error(capsys, "exists and is not a directory")
    assert cli.main(["run", str(smoke), "--device", "cpu", "--out", str(tmp_path / "file" / "sub")]) == 2
    _one_line_error(capsys, "cannot write there")


def test_an_io_error_reading_a_scenario_is_one_line_exit_2(capsys):
    assert cli.main(["run", "/proc/self/mem"]) == 2       # a regular file whose read fails with EIO
    _one_line_error(capsys, "/proc/self/mem: cannot read")


def test_the_same_case_twice_in_one_run_is_refused(tmp_path, capsys):
    smoke = Path(__file__).parents[1] / "scenarios" / "smoke.yaml"
    copy = tmp_path / "copy.yaml"
    copy.write_text(smoke.read_text())
    assert cli.main(["run", str(smoke), str(copy), "--device", "cpu", "--out", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, "of scenario 'smoke' is also in", "rows would collide")
    assert not (tmp_path / "r").exists()


def test_max_cases_flag_and_a_huge_sweep_refused_fast(tmp_path, capsys):
    t0 = time.perf_counter()
    assert cli.main(["run", str(BAD / "huge_sweep.yaml"), "--device", "cpu"]) == 2
    assert time.perf_counter() - t0 < 1.0
    _one_line_error(capsys, "more than the limit of 5000", "--max-cases")
    assert cli.main(["run", str(BAD / "huge_sweep.yaml"), "--max-cases", "0"]) == 2
    _one_line_error(capsys, "--max-cases: got 0")


def test_list_does_not_hang_on_an_alias_bomb(tmp_path):
    shutil.copy(BAD / "alias_bomb.yaml", tmp_path / "bomb.yaml")
    shutil.copy(BAD / "huge_sweep.yaml", tmp_path / "sweep.yaml")
    proc = subprocess.run([sys.executable, "-m", "kdbench", "list", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "bomb.yaml  (invalid:" in proc.stdout and "sweep.yaml  (invalid:" in proc.stdout


@pytest.mark.parametrize("out, fragment", [("{tmp}", "Is a directory"), ("/proc/kdbench/x.html", "/proc/kdbench")])
def test_compare_out_a_directory_or_unwritable_is_one_line_exit_2(base, tmp_path, capsys, out, fragment):
    new = _run(tmp_path / "new", [_rec("a", 3), _rec("b", 4)])
    assert cli.main(["compare", str(base), str(new), "--out", out.format(tmp=tmp_path)]) == 2
    assert _one_line_error(capsys, fragment).count("\n") == 1


def test_report_html_a_directory_is_one_line_exit_2(base, capsys):
    (base / "report.html").mkdir()
    assert cli.main(["report", str(base)]) == 2
    assert _one_line_error(capsys, "report.html").count("\n") == 1
