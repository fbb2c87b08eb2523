"""The fastest policy per batch size (kdbench.e2e_best): the best measured row per batch, a verdict against AR that
reads "faster" only when the speedup's interval clears 1, and the rows it cannot be told apart from; the report
draws the table."""
import json

from kdbench import report
from kdbench.e2e_best import best_by_batch, verdict
from kdbench.results import Record, RunWriter


def e2e(policy, batch, speedup, ci, status="info", batches=12, moe="auto", mode="graph"):
    shape = {"model": "pair", "batch": batch, "policy": policy.split("(")[0], "budget": 64, "moe": moe}
    rec = Record("e", "e2e", f"b{batch}-{policy}-{moe}", "", "cuda", "bfloat16", "NVIDIA H200", policy=policy,
                 status=status, shape=json.dumps(shape), speedup_vs_ar=speedup, lossless="yes")
    rec.extra.update({"speedup_ci95": ci, "speedup_batches": batches, "graph_mode": mode})
    return rec


def test_verdict_needs_the_interval_to_clear_one():
    assert verdict(1.3, (1.05, 1.5)) == "faster than AR"
    assert verdict(1.3, (0.95, 1.6)) == "not told apart from AR"
    assert verdict(0.6, (0.5, 0.7)) == "slower than AR"
    assert verdict(1.0, None) == "point estimate 1.00x, no interval"


def test_best_row_per_batch_with_its_ties():
    recs = [e2e("ddtree(B=16)", 1, 1.24, [1.04, 1.45]), e2e("ddtree(B=64)", 1, 1.36, [1.10, 1.62]),
            e2e("chain(B=15)", 1, 0.81, [0.67, 0.96]), e2e("ddtree(B=16)", 8, 0.91, [0.60, 1.20], batches=3),
            e2e("ddtree(B=64)", 8, 0.68, [0.57, 0.79], batches=3), e2e("ddtree(B=256)", 8, 2.0, [1.9, 2.1], "fail"),
            e2e("ar", 1, float("nan"), None)]
    rows = best_by_batch(recs)
    assert [(r["batch"], r["best"]) for r in rows] == [(1, "ddtree(B=64)"), (8, "ddtree(B=16)")]   # a fail row never wins
    b1, b8 = rows
    assert b1["verdict"] == "faster than AR" and b1["ties"] == "ddtree(B=16)" and b1["rows"] == 3
    assert b8["verdict"] == "not told apart from AR" and b8["ties"] == "ddtree(B=64)" and b8["batches"] == 3


def test_report_draws_the_fastest_policy_table(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    for r in (e2e("ddtree(B=16)", 1, 1.24, [1.04, 1.45]), e2e("ddtree(B=64)", 1, 1.36, [1.10, 1.62])):
        w.add(r)
    w.write_meta({"status": "finished"})
    html = report.render(run).read_text(encoding="utf-8")
    assert "Fastest policy per batch size (measured)" in html
    assert "1.10&ndash;1.62&times; (12 batches)" in html and ">faster than AR<" in html


def test_settings_stay_apart_and_rows_without_a_figure_are_left_out():
    """Another MoE dispatch or graph mode at the same batch is another setting; a NaN speedup and an interval-less
    best say so instead of reading as clearly ahead."""
    recs = [e2e("ddtree(B=64)", 1, 1.3, [1.1, 1.5]), e2e("ddtree(B=64)", 1, 1.1, [0.9, 1.3], moe="grouped"),
            e2e("ddtree(B=16)", 1, 1.2, None, mode="eager"), e2e("chain(B=15)", 1, 1.19, None, mode="eager"),
            e2e("ddtree(B=256)", 1, float("nan"), [1.0, 2.0])]
    rows = best_by_batch(recs)
    assert len(rows) == 3 and {(r["case"], r["mode"]) for r in rows} == {
        ("b1-ddtree(B=64)-auto", "graph"), ("b1-ddtree(B=64)-grouped", "graph"), ("b1-ddtree(B=16)-auto", "eager")}
    eager = next(r for r in rows if r["mode"] == "eager")
    assert eager["ties"] == "unknown (no interval)" and eager["verdict"] == "point estimate 1.20x, no interval"
    assert all(r["rows"] == 1 for r in rows if r["mode"] == "graph")
