"""The nightly's own checks (named, exit 1, no baseline from a failing run), the CPU nightly passing on CPU,
the A/A spread as a per-row minimum effect, the gating/context headline and the change-point view."""
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from kdbench import cli, drift, nightly, regress
from kdbench.errors import UserError
from kdbench.results import KEY_COLUMNS, Record, RunWriter

SCENARIO_TEXT = ("name: nightly_verify\nkind: kernel\ncases:\n  - name: f32\n    family: tree_verify_mla\n"
                 "    shape: {batch: 1}\n    tolerance: {rtol: 1.0e-4, atol: 1.0e-5, rel_l2: 1.0e-5}\n")


def samples(seed: int, median_s: float = 1e-3, n: int = 20) -> list[float]:
    return list(median_s * np.exp(np.random.default_rng(seed).normal(0, 0.01, n)))


def rec(case="f32", s=None, backend="cuda", status="pass", **kw) -> Record:
    r = Record("nightly_verify", "kernel", case, "tree_verify_mla", backend, "float32", "NVIDIA H200",
               status=status, samples_s=s or [], n_samples=len(s or []), **kw)
    if s:
        r.time_median_s = float(np.median(s))
    return r


def write_run(path: Path, records, started="2026-12-01T00:00:00") -> Path:
    w = RunWriter(path)
    for r in records:
        w.add(r)
    w.write_meta({"status": "finished", "started_at": started, "fingerprint": {"gpu_slug": "nvidia-h200"},
                  "scenarios": [{"name": "nightly_verify", "file": "v.yaml", "text": SCENARIO_TEXT}]})
    return path


def failing_record() -> Record:
    return rec(backend="torch", status="fail", rel_l2=1.04e-5, max_abs=3e-7, pct_outside=0.0,
               worst="[0, 0, 0, 3] (got 0.1, want 0.1000001)")


def test_nightly_names_its_failed_check_and_exits_1(tmp_path, monkeypatch, capsys):
    def fake_run_scenarios(paths, out_dir, device="auto", filter_expr=None):
        return types.SimpleNamespace(run_dir=write_run(Path(out_dir), [failing_record(), rec(s=samples(1))]),
                                     exit_code=1)
    monkeypatch.setitem(sys.modules, "kdbench.runner", types.SimpleNamespace(run_scenarios=fake_run_scenarios))
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "v.yaml").write_text(SCENARIO_TEXT)
    assert nightly.run_nightly(tmp_path / "run", tmp_path / "baselines", scenario_dir=scen) == 1
    err = capsys.readouterr().err
    assert "FAIL nightly_verify/f32 [torch] (float32): rel_l2 1.04e-05 > 1e-05" in err
    assert "1 of its own checks failed" in err


def test_update_baseline_refuses_a_run_with_a_failed_check(tmp_path, capsys):
    run = write_run(tmp_path / "run", [failing_record()])
    with pytest.raises(UserError, match="failed check"):
        nightly.update_baseline(run, tmp_path / "baselines")
    assert cli.main(["nightly", "--update-baseline", str(run), "--baselines", str(tmp_path / "b")]) == 2
    assert "rel_l2 1.04e-05 > 1e-05" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_cpu_nightly_passes_on_cpu(tmp_path, monkeypatch):
    """The real nightly scenarios on this machine's CPU: every check passes (no baseline: exit 0)."""
    monkeypatch.setattr("kdbench.runner.resolve_device", lambda device: ("cpu", "cpu"))
    code = nightly.run_nightly(tmp_path / "run", tmp_path / "baselines")
    rows = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    bad = [(r["case"], r["backend"], r["reason"]) for r in rows if r["status"] in ("fail", "error")]
    assert code == 0 and not bad, bad
    assert sum(r["status"] == "pass" for r in rows) >= 15


def test_spread_raises_the_row_minimum_effect(tmp_path):
    base = write_run(tmp_path / "base", [rec(s=samples(1))])
    aa = write_run(tmp_path / "aa", [rec(s=samples(2, median_s=1.08e-3))])        # another machine: +8 %
    new = write_run(tmp_path / "new", [rec(s=samples(3, median_s=1.07e-3))])      # +7 %: machine noise
    assert regress.compare(base, new).rows[0]["verdict"] == "slower"
    spread_file = drift.write_spread(tmp_path / "bl", [base, aa])
    spread = drift.load_spread(tmp_path / "bl")
    assert json.loads(spread_file.read_text())["rows"] and list(spread.values())[0] == pytest.approx(0.08, abs=0.01)
    result = regress.compare(base, new, row_min_effect=spread)
    assert result.rows[0]["verdict"] == "same" and result.exit_code == 0
    slower = write_run(tmp_path / "slower", [rec(s=samples(4, median_s=1.2e-3))])
    assert regress.compare(base, slower, row_min_effect=spread).exit_code == 1
    with pytest.raises(UserError, match="at least 2"):
        drift.aa_spread([base])
    other = write_run(tmp_path / "other", [rec("another-case", s=samples(5))])
    with pytest.raises(UserError, match="no timed row is in every run"):
        drift.aa_spread([base, other])


def test_headline_counts_gating_rows_apart_from_context(tmp_path):
    base = write_run(tmp_path / "b", [rec("k", samples(1)), rec("k", samples(2), backend="torch")])
    new = write_run(tmp_path / "n", [rec("k", samples(3, 1.3e-3)), rec("k", samples(4, 2e-3), backend="torch")])
    text = regress.headline(regress.compare(base, new))
    assert text == "gating rows: slower 1; context rows (do not gate): slower 1"


@pytest.mark.parametrize("medians, flagged, split", [
    ([1.0, 1.01, 0.99, 1.2, 1.21, 1.19], True, 3),     # a level change that held
    ([1.0, 1.0, 1.3, 1.0, 1.0, 1.0], False, None),     # one slow night
    ([1.0, 1.01, 0.99, 1.0, 1.02, 1.0], False, None),  # steady
])
def test_change_point_view(tmp_path, medians, flagged, split):
    for i, m in enumerate(medians):
        write_run(tmp_path / f"n{i}", [rec(s=samples(i, m * 1e-3)), rec(s=samples(i, 1e-3), backend="torch")],
                  started=f"2026-12-0{i + 1}T00:00:00")
    (point,) = drift.history(tmp_path)                   # context rows (torch) are left out
    assert point.flagged is flagged and point.runs[0] == "n0"
    if split is not None:
        assert point.split == split and point.shift == pytest.approx(0.2, abs=0.02)
    assert drift.history_lines([point])[0].startswith("CHANGE" if flagged else "steady")


def test_compare_help_shows_its_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "(default: 0.002)" in out and "(default: 0.05)" in out and "(default: 2)" in out
    assert "too few samples" in out and "ambiguous" in out


def test_compare_with_one_run_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["compare", str(tmp_path)]) == 2
    assert "expected BASE_RUN NEW_RUN" in capsys.readouterr().err


def test_a_spread_file_from_before_a_new_key_column_still_joins(tmp_path):
    """spread.json names its key columns; one written with fewer (before `phase`) maps onto today's keys."""
    old_columns = [c for c in KEY_COLUMNS if c != "phase"]
    key = {c: "" for c in old_columns} | {"scenario": "s", "kind": "kernel", "case": "c", "family": "tree_build",
                                         "backend": "cuda"}
    (tmp_path / drift.SPREAD_FILE).write_text(json.dumps(
        {"key_columns": old_columns, "rows": {"|".join(key[c] for c in old_columns): 0.07}}))
    want = tuple(key.get(c, "") for c in KEY_COLUMNS)
    assert drift.load_spread(tmp_path) == {want: 0.07}
