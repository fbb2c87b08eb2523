"""Tests of kdbench.report: renders from a synthetic run directory of every kind, escapes markup in names,
handles killed runs (torn last line, no 'finished' status), embeds plots as data: URIs, links nothing."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from kdbench import report
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
    return Record("gen", kind, f"{policy}[budget={budget}]", kind, "torch", "bfloat16", "NVIDIA H200",
                  shape=json.dumps({"model": "tiny", "policy": policy, "budget": budget}), status="info",
                  tau=tau, tokens_per_s=100 * tau, speedup_vs_ar=tau / 1.3, predicted_speedup=tau / 1.2,
                  ttft_s=0.02, tpot_s=0.004, energy_j_per_token=0.5,
                  extra={"per_depth_accept": [0.9, 0.7, 0.5], "accept_len_hist": {"1": 2, "2": 5, "4": 3},
                         "stage_s": {"draft": 0.001, "tree_build": 0.0004, "verify": 0.003, "accept": 0.0001}})


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
    recs += [gen_rec("e2e", "ddtree", 64, 4.0)]
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


def test_markup_in_names_is_escaped(full_html):
    html = full_html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html


def test_plots_are_embedded_and_nothing_is_linked(full_html):
    html = full_html
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) >= 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert "href=" not in html


def test_killed_run_with_torn_line_renders_as_partial(tmp_path):
    run = write_run(tmp_path / "killed", [kernel_rec("a", "torch", 16, 1e-3)],
                    meta={"status": "running", "started_at": "2026-11-29T10:00:00"},
                    torn='{"scenario": "kernels", "kind": "kernel", "case": "b", "fam')
    html = report.render(run).read_text(encoding="utf-8")
    assert "Partial run" in html and "1 unreadable line(s)" in html
    assert "<td>a</td>" in html and "<td>b</td>" not in html


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
