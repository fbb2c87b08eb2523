"""Tests of kdbench.report: renders from a synthetic run directory of every kind, escapes markup in names,
handles killed runs (torn last line, no 'finished' status), embeds plots as data: URIs, links nothing; the
summary lists only rows needing attention; headline speedups use the best baseline of the same case."""
import dataclasses
import json
import math
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from kdbench import report, report_plots
from kdbench.backends import registry
from kdbench import report_tables as tables
from kdbench.results import Record, RunWriter

EVIL = "<script>alert(1)</script>"
CEIL = {"copy_bytes_per_s": 4.0e12, "matmul_flops_per_s": 7.7e14, "source": "measured on NVIDIA H200"}


def kernel_rec(case: str, backend: str, budget: int, median: float, scenario: str = "kernels",
               status: str = "pass", **kw) -> Record:
    s = list(median * np.exp(np.random.default_rng(budget).normal(0, 0.02, 10)))
    return Record(scenario, "kernel", case, "tree_verify_mla", backend, "bfloat16", "NVIDIA H200",
                  shape=json.dumps({"batch": 4, "nodes": budget + 1, "past_len": 4096}), status=status,
                  trials=3, max_abs=1e-3, max_rel=2e-3, rel_l2=1e-3, pct_outside=0.0,
                  time_median_s=median, time_p20_s=0.98 * median, time_p80_s=1.02 * median, n_samples=10,
                  samples_s=s, bytes_moved=4e9 * median, flops=2e14 * median, floor_s=0.5 * median,
                  pct_of_floor_rate=50.0, sm_clock_mhz=1980.0, extra={"ceilings": CEIL},
                  repro=f"kdbench run scenarios/x.yaml --filter '{case}'", **kw)


def gen_rec(kind: str, policy: str, budget: int, tau: float) -> Record:
    return Record("gen", kind, f"{policy}[budget={budget}]", "", "torch", "bfloat16", "NVIDIA H200",
                  shape=json.dumps({"model": "tiny", "policy": policy, "budget": budget}), status="info",
                  tau=tau, tokens_per_s=100 * tau, speedup_vs_ar=tau / 1.3, predicted_speedup=tau / 1.2,
                  ttft_s=0.02, tpot_s=0.004, energy_j_per_token=0.5,
                  extra={"per_depth_accept": [0.9, 0.7, 0.5], "accept_len_hist": {"1": 2, "2": 5, "4": 3},
                         "stage_s": {"draft": 0.001, "tree_build": 0.0004, "verify": 0.003, "accept": 0.0001}})


FIT = "reports/h200/x/costmodel_measurements.jsonl (measured 2026-12-01 on NVIDIA H200, eager, commit abc)"


def replay_rec(policy: str, budget: int, batch: int, tau: float, step_s: float) -> Record:
    """A replay row: tau replayed, the rest MODELED (what kinds/replay.py writes)."""
    ar = 0.006
    return Record("replay", "replay", f"budgets[policy={policy},budget={budget},batch={batch}]", "", "torch",
                  "float32", "cpu", policy=f"{policy}(B={budget})",
                  shape=json.dumps({"policy": policy, "budget": budget, "batch": batch}), status="info", tau=tau,
                  extra={"modeled": True, "modeled_step_s": step_s, "modeled_verify_s": 0.8 * step_s,
                         "modeled_ar_step_s": ar, "modeled_tokens_per_s": batch * tau / step_s,
                         "modeled_speedup": tau * ar / step_s, "experts_per_layer": 40.0 + budget,
                         "verify_gb": 1.0 + budget / 100, "batch": batch, "budget": budget, "mean_rows": budget + 1.0,
                         "cost_model": "kimi-k2-slice-4, ctx 1024", "cost_fit": f"fit: {FIT}",
                         "drafter": "trained(L=15,layers=2)"})


def replay_run() -> list[Record]:
    """ddtree at batch 1 peaks at budget 64 (tau grows, the step grows slower until 64), at batch 8 at 16; chain
    (tau capped at 1.8) at the cheapest step, 16."""
    out = []
    for batch, steps in ((1, (0.010, 0.011, 0.020)), (8, (0.012, 0.020, 0.060))):
        for budget, tau, step in zip((16, 64, 256), (2.0, 3.0, 3.2), steps):
            out.append(replay_rec("ddtree", budget, batch, tau, step))
            out.append(replay_rec("chain", budget, batch, min(tau, 1.8), step))
    return out


def write_run(path, records, meta=None, torn: str = ""):
    w = RunWriter(path)
    for r in records:
        w.add(r)
    if meta is not None:
        w.write_meta(meta)
    if torn:
        with open(path / "records.jsonl", "a", encoding="utf-8") as fh:
            fh.write(torn)
    return path


def full_run(tmp_path):
    recs = [kernel_rec(f"verify[nodes={b + 1}]", be, b, m * (1 + b / 64))
            for b in (16, 64, 256) for be, m in (("torch", 2e-3), ("cuda", 4e-4))]
    recs.append(kernel_rec("failing", "cuda", 8, 1e-4, status="fail", reason="outside tolerance: (0, 3) x"))
    recs.append(kernel_rec("evil", "torch", 8, 1e-4, scenario=EVIL))
    recs += [gen_rec("acceptance", p, b, t) for p in ("ddtree", "chain") for b, t in ((16, 3.0), (64, 4.1))]
    recs += [gen_rec("e2e", "ddtree", 64, 4.0)] + replay_run()
    meta = {"status": "finished", "started_at": "2026-11-29T10:00:00", "command": "kdbench run x.yaml",
            "fingerprint": {"hostname": "h200-box", "gpus": [{"index": 0, "name": "NVIDIA H200"}],
                            "topology": [], "topology_reason": "1 GPU(s): no pairs", "git": {"sha": "abc"}},
            "scenarios": [{"name": EVIL, "file": "x.yaml", "text": f"name: {EVIL}\n"}]}
    return write_run(tmp_path / "run", recs, meta)


@pytest.fixture(scope="module")
def full_html(tmp_path_factory):
    return report.render(full_run(tmp_path_factory.mktemp("full"))).read_text(encoding="utf-8")


def test_full_report_renders_every_section(full_html):
    html = full_html
    assert "Partial run" not in html
    for text in ("kernel: tree_verify_mla", "acceptance", "e2e", "Roofline: tree_verify_mla",
                 "Latency vs nodes", "tau vs budget per policy", "accept-length histogram",
                 "step time by stage", "Conventions", "counting the bonus token", "h200-box",
                 "measured on NVIDIA H200", "outside tolerance: (0, 3) x"):
        assert text in html, text
    assert "kdbench run scenarios/x.yaml --filter &#39;verify[nodes=17]&#39;" in html   # repro per row
    assert "<td class=\"num st-fail\">1</td>" in html                                   # verdict counts
    # GB/s = bytes_moved / median / 1e9 = (4e9 * m) / m / 1e9 = 4; TFLOP/s = (2e14 * m) / m / 1e12 = 200
    assert "<td class=\"num\">4</td>" in html and "<td class=\"num\">200</td>" in html


def test_the_replay_section_shows_modeled_numbers_and_the_best_budget(full_html):
    """Issue 13 item 3: replay rows with their MODELED step, tokens/s, speedup, experts and bytes, the fit used
    (file, date, GPU), the best budget per batch (the highest modeled tokens/s) and tokens/s vs budget."""
    from kdbench.replay_section import best_rows
    html = full_html
    for text in ("replay (step times MODELED)", "step (MODELED)", "tokens/s (MODELED)", "speedup vs AR (MODELED)",
                 "experts / MoE layer (MODELED)", "verify GB (MODELED)", "best budget per batch size",
                 "tokens/s vs tree budget, MODELED", "measured 2026-12-01 on NVIDIA H200, eager"):
        assert text in html, text
    best = {(r[2], r[3]): r[4] for r in best_rows(replay_run())}
    assert best == {("ddtree", "1"): "64", ("ddtree", "8"): "16", ("chain", "1"): "16", ("chain", "8"): "16"}
    row = next(r for r in best_rows(replay_run()) if r[2] == "ddtree" and r[3] == "1")
    assert row[7] == "11.00 ms" and row[9] == f"{3.0 / 0.011:.0f}" and row[10] == f"{3.0 * 0.006 / 0.011:.2f}x"


def test_markup_in_names_is_escaped(full_html):
    html = full_html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html


def test_plots_are_embedded_and_nothing_is_linked(full_html):
    html = full_html
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) >= 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', html))   # contents links only


def test_killed_run_with_torn_line_renders_as_partial(tmp_path):
    run = write_run(tmp_path / "killed", [kernel_rec("a", "torch", 16, 1e-3)],
                    meta={"status": "running", "started_at": "2026-11-29T10:00:00"},
                    torn='{"scenario": "kernels", "kind": "kernel", "case": "b", "fam')
    html = report.render(run).read_text(encoding="utf-8")
    assert "Partial run" in html and "1 unreadable line(s)" in html
    assert '<td class="case">a</td>' in html and '<td class="case">b</td>' not in html


def test_run_without_meta_or_records(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    html = report.render(run).read_text(encoding="utf-8")
    assert "Partial run" in html and "no records were saved" in html
    assert "not recorded in meta.json" in html


def test_report_reads_saved_results_only(tmp_path):
    """Rendering imports neither the runner, the kernel families nor torch: nothing can be re-run."""
    run = full_run(tmp_path)
    code = ("import sys; from kdbench import report; report.render(sys.argv[1]); "
            "bad = [m for m in ('torch', 'kdbench.runner', 'kdbench.families', 'kdbench.kinds') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(run)], check=True, timeout=120)


def test_formatters():
    assert report.fmt_time(2.5e-6) == "2.5 µs" and report.fmt_time(0.0123) == "12.3 ms"
    assert report.fmt_time(float("nan")) == "–" and report.fmt_time(3e-10) == "0.3 ns"
    assert report.fmt_num(1234567.0) == "1.235e+06" and report.fmt_num(0.5) == "0.5"
    assert report.fmt_num(None) == "–" and report.fmt_pct(12.345) == "12.3%"
    assert report.cell(3, "int") == "3" and report.cell(None) == ""


# ------------------------------------------------------------------------------------------ summary and headline

def speed_rec(case: str, backend: str, median: float, dtype: str = "bfloat16", status: str = "pass") -> Record:
    return Record("kernels", "kernel", case, "tree_build", backend, dtype, "NVIDIA H200", status=status,
                  time_median_s=median, time_p20_s=median, time_p80_s=median, n_samples=10,
                  pct_of_floor_rate=1e-6 / median, repro=f"kdbench run k.yaml --filter {case}")


def speed_run() -> list[Record]:
    """Case a: torch_sdpa is the fastest baseline (numpy_ref is faster but is the reference, not a baseline)
    -> cuda 5x. Case b: the only same-dtype baseline is torch -> 2x (a float32 torch row is faster but another
    dtype; a failing torch_sdpa row is faster but does not count). Case c: cuda fails -> no speedup."""
    return [speed_rec("a", "cuda", 1e-4), speed_rec("a", "torch", 1e-3), speed_rec("a", "torch_sdpa", 5e-4),
            speed_rec("a", "numpy_ref", 1e-5, status="info"),
            speed_rec("b", "cuda", 2e-4), speed_rec("b", "torch", 4e-4), speed_rec("b", "torch", 1e-5, "float32"),
            speed_rec("b", "torch_sdpa", 1e-5, status="fail"),
            speed_rec("c", "cuda", 1e-5, status="fail"), speed_rec("c", "torch", 1e-3)]


def test_speedup_is_the_best_baseline_over_cuda():
    recs = speed_run()
    best = tables.best_baselines(recs)
    assert [tables.speedup(r, best) for r in recs if r.backend == "cuda"] == [
        (pytest.approx(5.0), "torch_sdpa"), (pytest.approx(2.0), "torch"), (pytest.approx(float("nan"), nan_ok=True), "")]
    h = tables.kernel_headline("tree_build", recs, best)
    assert (h["cases"], h["rows"], h["pass"], h["bad"], h["compared"]) == (4, 10, 7, 2, 2)  # b/float32 is a case
    assert h["speedup_median"] == pytest.approx(3.5) and h["speedup_min"] == pytest.approx(2.0)
    assert h["speedup_min_case"] == "b"
    # % of floor rate = 1e-6 / median: passing cuda rows a (1e-2) and b (5e-3), the failing c is left out
    assert h["floor_pct"] == pytest.approx(7.5e-3)


def test_moe_experts_speedups_are_for_its_shipped_backend():
    """moe_experts' ours is moe_triton (registry.shipped): its rows get the speedups over the best baseline and the
    best peer, a cuda row of that family (there is none in practice) would not, and a slower ours shows below 1."""
    def moe(backend, median):
        return dataclasses.replace(speed_rec("r", backend, median), family="moe_experts")
    recs = [moe("moe_triton", 4e-4), moe("moe_grouped", 3e-4), moe("moe_loop", 9e-3), moe("moe_liger", 2e-4),
            moe("cuda", 1e-4)]
    assert registry.shipped("moe_experts") == "moe_triton" and registry.shipped("tree_build") == "cuda"
    best, peers = tables.best_baselines(recs), tables.best_peers(recs)
    assert tables.speedup(recs[0], best) == (pytest.approx(0.75), "moe_grouped")
    assert tables.speedup(recs[0], peers) == (pytest.approx(0.5), "moe_liger")
    assert tables.speedup(recs[-1], best) == (pytest.approx(float("nan"), nan_ok=True), "")
    h = tables.kernel_headline("moe_experts", recs, best, peers)
    assert h["ours"] == "moe_triton" and h["compared"] == 1 and h["peer_min"] == pytest.approx(0.5)


def test_headline_and_speedup_cells_in_the_html(tmp_path):
    html = report.render(write_run(tmp_path / "speed", speed_run(), {"status": "finished"})).read_text("utf-8")
    headline = html[html.index("<h3>Kernel families</h3>"):html.index('">kernel: tree_build</h2>')]
    assert ">3.5×</td>" in headline and ">2×</td>" in headline and "<td>b</td>" in headline
    assert "5× <span class=\"muted\">torch_sdpa</span>" in html and "2× <span class=\"muted\">torch</span>" in html


def _attention_block(html: str) -> str:
    return html[html.index("<h3>Needs attention</h3>"):html.index('<h2 id="conventions">Conventions</h2>')].split("<h3>")[1]


def test_summary_lists_only_rows_needing_attention(tmp_path):
    recs = [kernel_rec(f"ok{i}", "cuda", 16, 1e-4) for i in range(5)]
    recs += [kernel_rec("broken", "cuda", 16, 1e-4, status="fail", reason="outside tolerance: (1, 2)"),
             kernel_rec("crashed", "torch", 16, 1e-4, status="error", reason="RuntimeError: boom")]
    recs += [kernel_rec(f"skip{i}", "cuda", 16, math.nan, status="skipped", reason="cuda extension not built")
             for i in range(3)]
    html = report.render(write_run(tmp_path / "att", recs, {"status": "finished"})).read_text("utf-8")
    block = _attention_block(html)
    assert "broken" in block and "crashed" in block and "RuntimeError: boom" in block
    assert block.index("broken") < block.index("crashed")                      # failures first
    assert not any(f"ok{i}" in block or f"skip{i}" in block for i in range(5))
    skipped = html[html.index("skipped rows"):html.index("</table>", html.index("skipped rows"))]
    assert skipped.count("cuda extension not built") == 1 and ">3</td>" in skipped
    assert "tree_verify_mla/cuda (3)" in skipped


def test_clean_run_says_nothing_needs_attention(full_html, tmp_path):
    run = write_run(tmp_path / "clean", [kernel_rec("a", "torch", 16, 1e-3)], {"status": "finished"})
    assert "No row failed, errored or is ambiguous." in report.render(run).read_text("utf-8")
    assert "No row failed" not in full_html      # full_run plants one failing row


def test_generation_headlines():
    acc = [gen_rec("acceptance", p, b, t) for p in ("ddtree", "chain") for b, t in ((16, 3.0), (64, 4.1))]
    for r in acc:      # the kinds name the policy in extra['policy'] and the policy column
        r.extra["policy"] = r.policy = f"{json.loads(r.shape)['policy']}(B={json.loads(r.shape)['budget']})"
    rows = {h["policy"]: h for h in tables.acceptance_headline(acc)}
    assert set(rows) == {"ddtree", "chain"} and rows["ddtree"]["tau"] == (3.0, 4.1)
    assert rows["ddtree"]["budget"] == (16, 64) and rows["ddtree"]["rows"] == 2
    ar = gen_rec("e2e", "ddtree", 64, 1.0)
    ar.extra["policy"], ar.tau, ar.speedup_vs_ar = "ar", math.nan, math.nan
    e2e = tables.e2e_headline([ar, gen_rec("e2e", "ddtree", 64, 4.0)])
    assert [(h["policy"], h["tokens_per_s"][0]) for h in e2e] == [("ar", 100.0), ("ddtree", 400.0)]


def test_conventions_show_ceilings_and_telemetry(full_html):
    conv = full_html[full_html.index('<h2 id="conventions">Conventions</h2>'):full_html.index('<h2 id="environment">')]
    assert "counting the bonus token" in conv and "floor = max(bytes_moved" in conv
    assert ">4 TB/s<" in conv and ">770 TFLOP/s<" in conv and "measured on NVIDIA H200" in conv
    assert "1980 (1980)" in conv and "throttle reasons" in conv


# ------------------------------------------------------------------------------------------ plots and format

def test_rendering_raises_no_matplotlib_warning(tmp_path):
    """A long legend once collapsed the axes ('constrained_layout not applied'); legends now go outside."""
    many = [kernel_rec(f"v[nodes={b}]", f"backend{k}_with_a_long_name", b, 1e-4 * (k + 1))
            for b in (16, 64, 256) for k in range(14)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.render(write_run(tmp_path / "many", many, {"status": "finished"}))
        report.render(full_run(tmp_path))


def test_latency_panel_holds_the_other_keys_where_most_rows_are():
    """Grid heads x nodes with a hole: the nodes panel is drawn at the heads value that has all nodes."""
    shapes = [{"heads": h, "nodes": n} for h in (8, 16, 64) for n in (16, 64, 256) if (h, n) != (64, 256)]
    assert report_plots._anchor(shapes, "nodes", ["heads"]) in {("8",), ("16",)}
    assert report_plots._anchor(shapes, "nodes", ["heads"]) == ("16",)           # the middle one of the tie


def test_number_formats():
    assert report.fmt_num(1439.99, 3) == "1440" and report.fmt_num(0.012345, 3) == "0.0123"
    assert report.fmt_num(0.0) == "0" and report.cell(4.0, "num") == "4" and report.cell(2.5, "x") == "2.5×"
    assert report.fmt_time_range(9.68e-4, 1.06e-3) == "0.968–1.06 ms"
    assert report.span((1.58, 2.11)) == "1.58–2.11" and report.span((3.0, 3.0)) == "3"


def test_merged_run_shows_its_notes_and_commands_escaped(tmp_path):
    meta = {"status": "finished", "notes": "merged <b>three</b> calls",
            "commands": ["kdbench run a.yaml --filter '<x>'  (commit abc1234)", "kdbench run b.yaml  (commit def5678)"]}
    html = report.render(write_run(tmp_path / "run", [kernel_rec("c", "cuda", 8, 1e-3)], meta)).read_text()
    assert "merged &lt;b&gt;three&lt;/b&gt; calls" in html and "the 2 runs merged here" in html
    assert "--filter &#39;&lt;x&gt;&#39;  (commit abc1234)" in html


def test_e2e_rows_needing_a_look_are_flagged():
    from kdbench.report_tables import attention_rows, e2e_flags
    from kdbench.results import Record

    def rec(speedup, predicted, lossless="yes"):
        return Record(scenario="s", case="c", kind="e2e", family="ddtree(B=64)", backend="cuda", dtype="bf16",
                      status="info", speedup_vs_ar=speedup, predicted_speedup=predicted, lossless=lossless)
    assert e2e_flags(rec(1.5, 1.6)) == []
    assert e2e_flags(rec(0.8, 0.85)) == ["speedup 0.80x < 1 vs AR"]
    assert "off by more than 25%" in e2e_flags(rec(1.5, 2.0))[0]
    tail = rec(0.95, 1.31)
    tail.extra["slot_efficiency"] = 0.70           # a quarter of the batch's slots idle: the flag says so
    assert "slot efficiency 0.70: predicted x it = 0.92x" in e2e_flags(tail)[1]
    assert e2e_flags(rec(1.5, 1.5, "no: near-tie (prompt 0)")) == ["greedy output differs from AR"]
    rows = attention_rows([rec(1.5, 1.6), rec(0.5, 0.5)])
    assert len(rows) == 1 and rows[0]["note"].startswith("speedup 0.50x")
