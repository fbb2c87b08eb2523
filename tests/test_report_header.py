"""The report's top (issue 10 item 3): a verdict per kind that flags e2e rows slower than AR (or faster with an
interval over prompts reaching below 1), predictions
more than 25 % off and lossy greedy runs above any green line; header facts (commits of merged runs, clocks,
throttled rows); ceilings per device the row was timed on; tolerances per case; whole-word skip reasons."""
import json
import math

from kdbench import intervals, report, report_header, report_plots, report_tables
from kdbench.errors import clip
from kdbench.results import Record, RunWriter

CPU_CEIL = {"copy_bytes_per_s": 1.2e10, "matmul_flops_per_s": 8e11, "source": "measured on the host"}
GPU_CEIL = {"copy_bytes_per_s": 4.2e12, "matmul_flops_per_s": 8.1e14, "source": "measured on NVIDIA H200"}
SCENARIO = ("name: k\nkind: kernel\ncases:\n  - name: acc\n    family: tree_accept\n    shape: {batch: 1}\n"
            "    tolerance: {rtol: 0, atol: 0}\n  - name: ver\n    family: tree_verify_mla\n    shape: {batch: 1}\n"
            "    tolerance: {rtol: 1.0e-4, atol: 1.0e-5, rel_l2: 5.0e-5}\n")


def e2e(policy="ddtree(B=64)", speedup=1.5, predicted=math.nan, lossless="yes", temperature=0.0):
    return Record("e", "e2e", "c", "", "cuda", "bfloat16", "NVIDIA H200", policy=policy, status="info",
                  shape=json.dumps({"model": "m", "policy": "ddtree", "temperature": temperature}),
                  speedup_vs_ar=speedup, predicted_speedup=predicted, lossless=lossless)


def kernel(case, backend, timed_on, ceil, throttle="", clock=1980.0):
    return Record("k", "kernel", case, "tree_accept", backend, "float32", "NVIDIA H200", status="pass",
                  time_median_s=1e-5, time_p20_s=1e-5, time_p80_s=1e-5, n_samples=3, samples_s=[1e-5] * 3,
                  bytes_moved=1e5, flops=1e4, throttle=throttle, sm_clock_mhz=clock,
                  extra={"ceilings": ceil, "timed_on": timed_on})


def issues(records, kind="e2e"):
    return next(v for v in report_header.kind_verdicts(records) if v["kind"] == kind)


def test_e2e_row_slower_than_ar_needs_attention():
    v = issues([e2e(speedup=0.4), e2e(speedup=1.2)])
    assert v["attention"] and "1 row(s) slower than AR (speedup 0.40–0.40×)" in v["issues"][0]
    assert not issues([e2e(speedup=1.2)])["attention"]
    assert not issues([e2e(policy="ar", speedup=math.nan)])["attention"]     # AR rows carry no speedup


def test_faster_row_whose_interval_reaches_below_one_needs_attention():
    unsure, sure = e2e(speedup=1.2), e2e(speedup=1.3)
    unsure.extra.update({"speedup_ci95": [0.9, 1.5], "speedup_batches": 3, "tau_ci95": [2.0, 2.6], "tau_prompts": 24})
    sure.extra.update({"speedup_ci95": [1.1, 1.5], "speedup_batches": 12})
    v = issues([unsure, sure])
    assert v["attention"] and len(v["issues"]) == 1
    assert "1 row(s) faster than AR whose speedup's 95% interval over batches reaches below 1" in v["issues"][0]
    assert not issues([sure])["attention"]
    flags = report_tables.e2e_flags(unsure)
    assert flags == ["speedup 1.20x, but its 95% interval over 3 batches (0.90-1.50x) reaches below 1"]
    cells = report_tables.generation_rows([unsure])[0]
    assert cells["speedup_ci"] == "0.90-1.50x (3 batches)" and cells["tau_ci"] == "2.00-2.60 (24 prompts)"
    one = e2e(speedup=1.3)
    one.extra.update({"speedup_ci95": None, "speedup_batches": 1, "tau_ci95": None, "tau_prompts": 1})
    assert report_tables.generation_rows([one])[0]["speedup_ci"] == "1 batch: no interval"
    old_form = e2e(speedup=1.2)                     # s12's first form: over prompts, no speedup_batches
    old_form.extra.update({"speedup_ci95": [0.9, 1.5]})
    assert intervals.speedup_interval(old_form) is None and not issues([old_form])["attention"]


def test_prediction_more_than_25_percent_off_needs_attention_and_absence_is_fine():
    assert any("predicted" in i for i in issues([e2e(speedup=1.0, predicted=1.3)])["issues"])
    assert not issues([e2e(speedup=1.0, predicted=1.2)])["attention"]          # 20 % off: within
    assert not issues([e2e(speedup=1.0)])["attention"]                         # no prediction recorded


def test_lossy_greedy_run_needs_attention_but_sampled_does_not():
    v = issues([e2e(lossless="no: near-tie (prompt 0, position 11)")])
    assert v["attention"] and "not lossless (no: near-tie: 1)" in v["issues"][0]
    assert issues([e2e(lossless="")])["attention"]                             # greedy, never checked
    assert not issues([e2e(lossless="", temperature=1.0)])["attention"]


def test_no_green_line_above_an_e2e_problem(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    for r in (e2e(speedup=0.5), kernel("acc", "cuda", "cuda", GPU_CEIL)):
        w.add(r)
    w.write_meta({"status": "finished", "scenarios": [{"name": "k", "file": "k.yaml", "text": SCENARIO}]})
    html = report.render(run).read_text(encoding="utf-8")
    top = html[:html.index('<h2 id="summary">')]
    assert '<div class="banner bad">Needs attention: e2e.' in top and "st-pass\">No row failed" not in html
    assert html.index('id="verdicts"') < html.index('id="summary"') and 'href="#verdicts"' in html


def test_ceilings_come_from_where_each_row_was_timed():
    recs = [kernel("acc", "numpy_ref", "cpu", CPU_CEIL), kernel("acc", "cuda", "cuda", GPU_CEIL)]
    rows = report_tables.ceiling_rows(recs)
    assert [(r["device"], r["copy_tb_per_s"]) for r in rows] == [("CPU", 0.012), ("NVIDIA H200", 4.2)]
    plot = report_plots.roofline_plot(recs, "tree_accept")
    assert "(NVIDIA H200, CPU)" in plot["caption"]


def test_header_lists_every_merged_commit_clock_state_and_throttled_rows():
    recs = [kernel("acc", "cuda", "cuda", GPU_CEIL, throttle="sw_power_cap", clock=1635.0),
            kernel("acc", "torch", "cuda", GPU_CEIL)]
    meta = {"parts": [{"commit": "2666237"}, {"commit": "2666237"}, {"commit": "d8e89a6"}],
            "fingerprint": {"gpus": [{"name": "NVIDIA H200"}]}, "started_at": "2026-11-30T01:00:00"}
    h = report_header.header(meta, recs)
    assert h["commits"] == "2666237 (2 runs), d8e89a6 (1 run)" and h["gpu"] == "1× NVIDIA H200"
    assert h["throttled"] == 1 and h["throttle_reasons"] == "sw_power_cap (1)"
    assert "not locked" in h["clock"] and "1635–1980" in h["clock"]
    assert "steady" in report_header.header({}, [kernel("a", "cuda", "cuda", GPU_CEIL)])["clock"]


def test_tolerance_is_shown_per_case(tmp_path):
    run = tmp_path / "run"
    w = RunWriter(run)
    w.add(kernel("acc", "cuda", "cuda", GPU_CEIL))
    w.add(Record("k", "kernel", "ver[dtype=float32]", "tree_verify_mla", "torch", "float32", "cpu", status="pass"))
    w.write_meta({"status": "finished", "scenarios": [{"name": "k", "file": "k.yaml", "text": SCENARIO}]})
    html = report.render(run).read_text(encoding="utf-8")
    assert "tolerance: exact" in html and "tolerance: rtol 0.0001, atol 1e-05, rel_l2 5e-05" in html


def test_reasons_are_never_cut_mid_word():
    oom = ("out of memory at this shape: CUDA out of memory. Tried to allocate 64.50 GiB. GPU 0 has a total "
           "capacity of 139.80 GiB of which 7.74 GiB is free. Including non-PyTorch memory, this process has "
           "132.05 GiB memory in use. Of the all")                            # as stored on 2026-11-30
    assert report_header.whole_sentences(oom).endswith("132.05 GiB memory in use. …")
    short = "backend 'cuda' is unavailable: no GPU"
    assert report_header.whole_sentences(short) == short
    clipped = clip("word " * 100, 50)
    assert len(clipped) <= 50 and clipped.endswith("word…")
