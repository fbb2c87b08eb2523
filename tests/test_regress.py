"""Tests of kdbench.regress (U test, verdicts, exit code, HTML) and kdbench.nightly (baseline handling) on
synthetic run directories: a planted 20% slowdown is caught, A/A pairs are not, clocks make it ambiguous."""
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from kdbench import nightly
from kdbench.errors import UserError
from kdbench.regress import compare, mann_whitney_u, min_p_value, rankdata, render_compare
from kdbench.results import Record, RunWriter


def samples(seed: int, median_s: float = 1e-3, n: int = 20, spread: float = 0.03) -> list[float]:
    """Timing-like samples: log-normal around median_s with a few percent of noise."""
    rng = np.random.default_rng(seed)
    return list(median_s * np.exp(rng.normal(0, spread, n)))


def rec(case: str, s: list[float] | None = None, status: str = "pass", backend: str = "cuda", kind: str = "kernel",
        **kw) -> Record:
    r = Record("nightly", kind, case, "tree_build", backend, "float32", "NVIDIA H200", status=status,
               samples_s=s or [], n_samples=len(s or []), repro=f"kdbench run x.yaml --filter {case}", **kw)
    if s:
        r.time_median_s = float(np.median(s))
    return r


def write_run(path: Path, records: list[Record], finished: bool = True) -> Path:
    w = RunWriter(path)
    for r in records:
        w.add(r)
    w.write_meta({"status": "finished" if finished else "running",
                  "fingerprint": {"gpu_slug": "nvidia-h200", "gpus": [{"name": "NVIDIA H200"}]}})
    return path


# ------------------------------------------------------------------------------------------ the U test

def test_rankdata_averages_ties():
    ranks, ties = rankdata(np.array([3.0, 1.0, 3.0, 2.0]))
    assert ranks.tolist() == [3.5, 1.0, 3.5, 2.0]
    assert sorted(ties.tolist()) == [1, 1, 2]


def test_u_test_matches_scipy_asymptotic_values():
    # reference values from scipy.stats.mannwhitneyu(x, y, method="asymptotic") (scipy 1.17), ties included
    x = [1.0, 2.0, 2.0, 3.0, 5.0, 5.0, 5.0, 8.0]
    y = [2.0, 4.0, 5.0, 6.0, 6.0, 9.0, 9.0, 10.0, 11.0]
    u, p = mann_whitney_u(x, y)
    assert u == 14.5
    assert p == pytest.approx(0.04126741302260858, rel=1e-12)
    assert mann_whitney_u([1.0] * 3, [1.0] * 3) == (4.5, 1.0)      # all tied: no evidence


def test_min_p_value_says_how_many_samples_alpha_needs():
    assert min_p_value(7, 7) > 0.002 > min_p_value(8, 8)
    assert min_p_value(20, 20) < 1e-6


def test_aa_pairs_rarely_flagged():
    flagged = sum(mann_whitney_u(samples(2 * i), samples(2 * i + 1))[1] < 0.002 for i in range(300))
    assert flagged <= 3            # expected 0.6 false positives at alpha = 0.002


# ------------------------------------------------------------------------------------------ verdicts

def test_planted_slowdown_is_slower_and_fails(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1)), rec("b", samples(2))])
    new = write_run(tmp_path / "new", [rec("a", samples(3, median_s=1.2e-3)), rec("b", samples(4))])
    res = compare(base, new)
    verdicts = {r["case"]: r for r in res.rows}
    assert verdicts["a"]["verdict"] == "slower"
    assert verdicts["a"]["change_pct"] == pytest.approx(20, abs=3)
    assert verdicts["b"]["verdict"] == "same"
    assert res.exit_code == 1 and res.verdict_counts["slower"] == 1


def test_slower_reference_timing_is_reported_but_does_not_gate(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1), status="info", backend="numpy_ref")])
    new = write_run(tmp_path / "new", [rec("a", samples(2, median_s=1.5e-3), status="info", backend="numpy_ref")])
    res = compare(base, new)
    assert res.rows[0]["verdict"] == "slower" and "does not gate" in res.rows[0]["note"]
    assert res.exit_code == 0


def test_slower_kernel_baseline_is_context_not_a_regression(tmp_path):
    """A same-process baseline (torch, SDPA, the CPU heaps) moves with the host; only our kernels gate."""
    base = write_run(tmp_path / "base", [rec("a", samples(1), backend="torch"), rec("b", samples(3))])
    new = write_run(tmp_path / "new", [rec("a", samples(2, median_s=1.5e-3), backend="torch"), rec("b", samples(4))])
    res = compare(base, new)
    verdicts = {r["case"]: r for r in res.rows}
    assert verdicts["a"]["verdict"] == "slower" and "torch is context, does not gate" in verdicts["a"]["note"]
    assert verdicts["b"]["verdict"] == "same" and res.exit_code == 0


def test_slower_info_row_of_a_backend_gates(tmp_path):
    """e2e / acceptance rows are 'info' (nothing checked) but time our engine's backends: a slowdown fails."""
    base = write_run(tmp_path / "base", [rec("a", samples(1), status="info", backend="torch", kind="e2e")])
    new = write_run(tmp_path / "new", [rec("a", samples(2, median_s=1.5e-3), status="info", backend="torch",
                                           kind="e2e")])
    res = compare(base, new)
    assert res.rows[0]["verdict"] == "slower" and "does not gate" not in res.rows[0]["note"]
    assert res.exit_code == 1


def test_topology_phase_rows_gate_and_collective_rows_do_not(tmp_path):
    """A sharded phase row times our tp/ep code: slower fails. A collective microbenchmark (gloo) times the
    library: slower is context."""
    def topo(case, s, backend):
        return rec(case, s, status="pass" if backend == "torch" else "info", backend=backend, kind="topology")
    base = write_run(tmp_path / "base", [topo("verify", samples(1), "torch"), topo("comm", samples(2), "gloo")])
    new = write_run(tmp_path / "new", [topo("verify", samples(3, median_s=1.5e-3), "torch"),
                                       topo("comm", samples(4), "gloo")])
    assert compare(base, new).exit_code == 1
    slow_comm = write_run(tmp_path / "slow_comm", [topo("verify", samples(5), "torch"),
                                                   topo("comm", samples(6, median_s=1.5e-3), "gloo")])
    res = compare(base, slow_comm)
    rows = {r["case"]: r for r in res.rows}
    assert rows["comm"]["verdict"] == "slower" and "gloo is context" in rows["comm"]["note"]
    assert rows["verify"]["verdict"] == "same" and res.exit_code == 0


def test_speedup_is_faster_and_passes(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1))])
    new = write_run(tmp_path / "new", [rec("a", samples(2, median_s=0.7e-3))])
    res = compare(base, new)
    assert res.rows[0]["verdict"] == "faster" and res.exit_code == 0


def test_aa_runs_are_same(tmp_path):
    cases = [f"c{i}" for i in range(10)]
    base = write_run(tmp_path / "base", [rec(c, samples(i)) for i, c in enumerate(cases)])
    new = write_run(tmp_path / "new", [rec(c, samples(100 + i)) for i, c in enumerate(cases)])
    res = compare(base, new)
    assert res.verdict_counts["same"] == 10 and res.exit_code == 0


def test_small_significant_change_is_same(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1, spread=0.002, n=40))])
    new = write_run(tmp_path / "new", [rec("a", samples(2, median_s=1.02e-3, spread=0.002, n=40))])
    row = compare(base, new).rows[0]
    assert row["p_value"] < 0.002 and row["verdict"] == "same"
    assert "minimum effect" in row["note"]


def test_clock_mismatch_or_throttle_is_ambiguous(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1), sm_clock_mhz=1980.0),
                                         rec("b", samples(2), sm_clock_mhz=1980.0)])
    new = write_run(tmp_path / "new", [rec("a", samples(3, median_s=1.3e-3), sm_clock_mhz=1500.0),
                                       rec("b", samples(4, median_s=1.3e-3), sm_clock_mhz=1975.0,
                                           throttle="sw_power_cap")])
    res = compare(base, new)
    rows = {r["case"]: r for r in res.rows}
    assert rows["a"]["verdict"] == "ambiguous" and "SM clock" in rows["a"]["note"]
    assert rows["b"]["verdict"] == "ambiguous" and "throttle" in rows["b"]["note"]
    assert res.exit_code == 0


def test_too_few_samples_is_ambiguous(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1, n=5))])
    new = write_run(tmp_path / "new", [rec("a", samples(2, median_s=2e-3, n=5))])
    row = compare(base, new).rows[0]
    assert row["verdict"] == "ambiguous" and "too few samples" in row["note"]


def _pooled(case: str, rounds: list[list[float]]) -> Record:
    """A row as kdbench.ab pools it: samples of every round, each round's p20, the lowest as the level."""
    p20 = [float(np.quantile(r, 0.2)) for r in rounds]
    return rec(case, [x for r in rounds for x in r], extra={"ab_round_p20_s": p20, "ab_level_s": min(p20)})


def test_a_change_within_one_sides_round_spread_is_ambiguous(tmp_path):
    """A/B rounds: +12 % between the sides while one side's two rounds differ by 20 % is the machine, not the
    code (a disturbed process shifts a whole round); +12 % with both sides' rounds within 2 % is slower."""
    quiet = [samples(1), samples(2, median_s=1.01e-3)]
    noisy_new = [samples(3, median_s=1.12e-3), samples(4, median_s=1.34e-3)]
    quiet_new = [samples(5, median_s=1.12e-3), samples(6, median_s=1.13e-3)]
    base = write_run(tmp_path / "base", [_pooled("a", quiet), _pooled("b", quiet)])
    new = write_run(tmp_path / "new", [_pooled("a", noisy_new), _pooled("b", quiet_new)])
    res = compare(base, new)
    rows = {r["case"]: r for r in res.rows}
    assert rows["a"]["verdict"] == "ambiguous" and "rounds of one side disagree" in rows["a"]["note"]
    assert rows["b"]["verdict"] == "slower" and res.exit_code == 1


def test_correctness_failure_in_new_fails_even_when_faster(tmp_path):
    base = write_run(tmp_path / "base", [rec("a", samples(1)), rec("b", samples(2))])
    new = write_run(tmp_path / "new", [rec("a", samples(3, median_s=0.5e-3), status="fail",
                                           reason="outside tolerance: (3,) (got=0, want=1)"),
                                       rec("b", status="error", reason="RuntimeError: boom")])
    res = compare(base, new)
    assert [r["verdict"] for r in res.rows] == ["fail", "fail"]
    assert "outside tolerance" in res.rows[0]["note"] and res.exit_code == 1


def test_a_check_that_stops_passing_or_running_is_dropped_and_fails(tmp_path):
    """pass -> info (an acceptance row whose greedy output stopped matching AR), pass -> skipped and
    info -> skipped, with and without samples: 'dropped', never 'same'; in a gating row it fails the compare."""
    base = write_run(tmp_path / "base", [
        rec("acc", samples(1), kind="acceptance", backend="torch"),                    # timed, checked
        rec("unt", status="pass"),                                                   # no samples
        rec("skp", samples(2)),
        rec("e2e", samples(3), status="info", kind="e2e", backend="torch")])
    new = write_run(tmp_path / "new", [
        rec("acc", samples(4), status="info", kind="acceptance", backend="torch",
            reason="greedy speculative output differs from AR: 3 of 8 prompts"),
        rec("unt", status="info"),
        rec("skp", status="skipped", reason="the cuda backend needs --device cuda (a CUDA GPU)"),
        rec("e2e", status="skipped", kind="e2e", backend="torch", reason="out of memory")])
    res = compare(base, new)
    rows = {r["case"]: r for r in res.rows}
    assert {c: r["verdict"] for c, r in rows.items()} == {c: "dropped" for c in ("acc", "unt", "skp", "e2e")}
    assert "pass -> info" in rows["acc"]["note"] and "differs from AR" in rows["acc"]["note"]
    assert "timing same" in rows["acc"]["note"] and rows["acc"]["p_value"] == rows["acc"]["p_value"]  # timed
    assert "no longer runs" in rows["skp"]["note"] and "info -> skipped" in rows["e2e"]["note"]
    assert res.exit_code == 1 and res.verdict_counts["dropped"] == 4 and res.verdict_counts["same"] == 0
    html = render_compare(res, tmp_path / "compare.html").read_text()
    assert 'class="v-dropped"' in html and "4 gating rows dropped" in html


def test_a_dropped_context_row_is_shown_but_does_not_gate(tmp_path):
    """A baseline kernel row (torch) that stops running is visible as 'dropped' but, like its timing, is
    context; a status that rises (skipped -> pass) or stays is not a drop."""
    base = write_run(tmp_path / "base", [rec("a", samples(1), backend="torch"), rec("b", status="skipped"),
                                         rec("c", status="info")])
    new = write_run(tmp_path / "new", [rec("a", status="skipped", backend="torch"), rec("b", samples(2)),
                                       rec("c", status="info")])
    res = compare(base, new)
    rows = {r["case"]: r["verdict"] for r in res.rows}
    assert rows == {"a": "dropped", "b": "skipped", "c": "same"} and res.exit_code == 0


def test_missing_and_new_rows(tmp_path):
    base = write_run(tmp_path / "base", [rec("old", samples(1)), rec("both", samples(2))])
    new = write_run(tmp_path / "new", [rec("both", samples(3)), rec("added", samples(4))])
    res = compare(base, new)
    rows = {r["case"]: r["verdict"] for r in res.rows}
    assert rows == {"both": "same", "added": "new", "old": "missing"}
    assert res.exit_code == 0


def test_partial_new_run_is_noted_and_html_is_escaped(tmp_path):
    base = write_run(tmp_path / "base", [rec("<b>x</b>", samples(1))])
    new = write_run(tmp_path / "new", [rec("<b>x</b>", samples(2, median_s=1.5e-3))], finished=False)
    res = compare(base, new)
    assert any("partial" in n for n in res.notes)
    html = render_compare(res, tmp_path / "out" / "compare.html").read_text()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert "slower" in html and "http" not in html


# ------------------------------------------------------------------------------------------ nightly

def test_update_baseline_copies_a_finished_run_and_refuses_a_partial(tmp_path):
    run = write_run(tmp_path / "run", [rec("a", samples(1))])
    dest = nightly.update_baseline(run, tmp_path / "baselines")
    assert dest == tmp_path / "baselines" / "nvidia-h200"
    assert (dest / "records.jsonl").read_text() == (run / "records.jsonl").read_text()
    partial = write_run(tmp_path / "partial", [rec("a", samples(1))], finished=False)
    with pytest.raises(UserError, match="partial"):
        nightly.update_baseline(partial, tmp_path / "baselines")


def test_run_nightly_compares_with_the_baseline(tmp_path, monkeypatch):
    """The runner is replaced by a fake that writes a run with a planted slowdown."""
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "k.yaml").write_text("name: k\n")
    seen = {}

    def fake_run_scenarios(paths, out_dir, device="auto", filter_expr=None):
        seen.update(paths=paths, device=device, filter=filter_expr)
        run_dir = write_run(Path(out_dir), [rec("a", samples(5, median_s=1.3e-3))])
        return types.SimpleNamespace(run_dir=run_dir, exit_code=0)

    monkeypatch.setitem(sys.modules, "kdbench.runner",
                        types.SimpleNamespace(run_scenarios=fake_run_scenarios))
    baselines = tmp_path / "baselines"
    assert nightly.run_nightly(tmp_path / "n0", baselines, scenario_dir=scen) == 0   # no baseline yet
    nightly.update_baseline(write_run(tmp_path / "good", [rec("a", samples(6))]), baselines)
    assert nightly.run_nightly(tmp_path / "n1", baselines, scenario_dir=scen) == 1
    assert seen == {"paths": [str(scen / "k.yaml")], "device": "auto", "filter": None}
    assert (tmp_path / "n1" / "compare.html").exists() and (tmp_path / "n1" / "report.html").exists()
    with pytest.raises(UserError):
        nightly.scenario_paths(tmp_path / "empty")


def test_runs_under_other_kernel_knobs_are_noted(tmp_path):
    """A baseline timed with KDB_TVM_SPLITS forced (another plan) against a default run: the comparison says so."""
    base = write_run(tmp_path / "base", [rec("a", samples(1))])
    new = write_run(tmp_path / "new", [rec("a", samples(2))])
    for run, knobs in ((base, {"KDB_TVM_SPLITS": "4"}), (new, {})):
        meta = json.loads((run / "meta.json").read_text())
        meta["fingerprint"]["kernel_knobs"] = knobs
        (run / "meta.json").write_text(json.dumps(meta))
    notes = compare(base, new).notes
    assert any("different kernel knobs" in n and "KDB_TVM_SPLITS" in n and "new none" in n for n in notes)
    same = write_run(tmp_path / "same", [rec("a", samples(3))])   # no knobs recorded (older runs): no note
    assert not any("kernel knobs" in n for n in compare(base, same).notes)
