"""CPU checks of the H200 scripts whose outputs the findings quote: the live best-budget check (batch 1 over
several prompts, replay == live on the CPU's float32 target), the ncu summaries of committed ncu CSVs, and that the
torch-free kernel benches still compile."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
S3 = ROOT / "reports/h200/2026-12-01-s3"


def test_live_check_runs_batch_one_over_several_prompts_and_replay_equals_live(tmp_path):
    cmd = [sys.executable, str(ROOT / "reports/h200/replay_live_check.py"), str(tmp_path), "--measured",
           str(S3 / "call_c/runs/cm/costmodel_measurements.jsonl"), "--batches", "1,2", "--rounds", "3",
           "--prompt-len", "16", "--b1-prompts", "2"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=600)
    rows = json.loads((tmp_path / "live_check_kdbench-pair.json").read_text())["rows"]
    assert {(r["batch"], r["prompts"]) for r in rows} == {(1, 2), (2, 2)}
    assert len(rows) == 6 and sum(r["predicted_best"] for r in rows) == 2      # best + two nearest per batch
    assert all(r["replay_equals_live"] for r in rows), [(r["batch"], r["budget"]) for r in rows]
    assert all(r["tau_live"] >= 1.0 and r["step_measured_s"] > 0 for r in rows)


def test_ncu_summary_reads_the_committed_raw_page():
    out = subprocess.run([sys.executable, str(ROOT / "reports/h200/ncu_summary.py"),
                          str(S3 / "call_a/logs/ncu_main_raw.csv"), "--label", "ncu main"], check=True, capture_output=True, text=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| void tvm::tree_verify_mla_pingpong_kernel")]
    assert len(rows) == 3
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert cells[2] == "2117.2" and cells[-2] == "59.9" and cells[-1].startswith("barrier")   # us, tensor %, stall
    assert (S3 / "call_a/ncu_main.md").read_text().strip() == out.strip()     # the committed table is this output


def test_ncu_sass_ops_reproduces_session_19s_instruction_counts():
    """plans/0004 tree_build Session 19 quotes these: the admission path's warp instructions at B 32, K 256."""
    s19 = ROOT / "reports/h200/2026-12-03-s19/call_e"
    out = subprocess.run([sys.executable, str(ROOT / "reports/h200/ncu_sass_ops.py"), str(s19 / "src_sass.csv.gz"),
                          "lane/512=0", "probe_no_final=10", "probe=8"], check=True, capture_output=True, text=True).stdout
    assert "| warp instructions | 69.8M | 61.4M | 19.9M |" in out
    assert out.strip() in (s19 / "ncu_sass_summary.md").read_text()       # the committed table is this output


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compile only; the benches run on the H200)")
@pytest.mark.parametrize("bench", sorted(p.name for p in (ROOT / "reports/h200").glob("*.cu")))
def test_h200_bench_sources_compile(bench, tmp_path):
    """The torch-free kernel benches include csrc/ directly: a kernel change that breaks one shows here, not in
    the next GPU call."""
    cmd = ["nvcc", "-O3", "-std=c++20", "-gencode=arch=compute_90a,code=sm_90a", f"-I{ROOT / 'csrc'}", "-c",
           str(ROOT / "reports/h200" / bench), "-o", str(tmp_path / "bench.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


def test_time_moe_dry_run_on_cpu_times_the_torch_dispatches_and_skips_the_gpu_ones(tmp_path):
    """The MoE layer timing's code paths on the CPU (tiny preset, float32): every case times grouped and loop against
    the float64 evaluation; the Triton experts and the FlashInfer and Liger peers are skipped rows with their reasons."""
    cmd = [sys.executable, str(ROOT / "reports/h200/time_moe.py"), str(tmp_path), "--quick", "--device", "cpu",
           "--preset", "tiny"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=600)
    rows = json.loads((tmp_path / "moe_timing.json").read_text())["rows"]
    cases = {r["case"] for r in rows}
    assert cases == {"ar-b1", "ar-b8", "ar-b32", "verify-b8-t65"}
    timed = [r for r in rows if r["dispatch"] in ("grouped", "loop") and r.get("mode") == "eager"]
    assert len(timed) == 4 * 2 * 2 and all(r["status"] == "pass" and r["rel_l2_after"] < 1e-2 for r in timed)
    skipped = [r for r in rows if r["dispatch"] in ("triton", "flashinfer", "liger")]
    assert len(skipped) == 12 and all(r["status"] == "skipped" and "cuda" in r["reason"].lower() for r in skipped)


def test_grid_summary_reproduces_session_10s_batch_one_counts():
    """The counts quoted for s10's batch-1 verify grid (plans/0004 "Session 10") from its committed records."""
    s10 = ROOT / "reports/h200/2026-12-02-s10"
    out = subprocess.run([sys.executable, str(ROOT / "reports/h200/verify_grid_summary.py"),
                          str(s10 / "call_b/runs/grid_b1/records.jsonl"),
                          str(s10 / "call_e/runs/grid_b1_last/records.jsonl")],
                         check=True, capture_output=True, text=True).stdout
    assert "shapes 27: faster than the cascade on 27, >= 1.25x on 26, missed on 1 (min 1.19x" in out, out
    assert ">= 80 % of the floor rate on 4 (" in out, out
    plan = " ".join((ROOT / "plans/0004-kernels.md").read_text().split())
    assert ">= 1.25x the cascade on 26 of 27** (median 14.9x" in plan and "1.19x" in plan, "the plan quotes them"
    assert "median 14.94x" in out


def test_the_quoted_moe_layer_figures_are_call_cs_saved_samples():
    """plans/0015's shipped row (Triton layer, graph replay): median ms and % of floor at 1 / 8 / 32 / 520 rows."""
    rows = json.loads((ROOT / "reports/h200/2026-12-02-s10/call_c/logs/moe_timing.json").read_text())["rows"]
    got = {r["rows"]: (round(r["median_s"] * 1e3, 3), round(r["pct_of_floor"], 1)) for r in rows
           if r["dispatch"] == "triton" and r["scope"] == "layer" and r["mode"] == "graph" and r["status"] == "pass"}
    assert got == {1: (0.246, 77.2), 8: (1.116, 97.6), 32: (2.274, 100.4), 520: (5.559, 84.8)}
    plan = (ROOT / "plans/0015-fused-moe.md").read_text()
    row = next(line for line in plan.splitlines() if line.startswith("| + BN per slot count, router, plan (C"))
    for ms, pct in got.values():
        assert f"{ms:.3f} ({pct:.1f} %)" in row, (ms, pct, row)   # the plan's table quotes these samples


def test_the_quoted_kv_compact_bulk_figures_are_call_ds_saved_samples():
    """plans/0004's kv_compact Session 16 table: bulk (prod) / vector / same-size cudaMemcpy medians in us, per view, at
    B 64 and 128, from s16 call D's bench JSON."""
    data = json.loads((ROOT / "reports/h200/2026-12-02-s16/call_d/logs/kvc_bench.json").read_text())
    plan = (ROOT / "plans/0004-kernels.md").read_text()
    views = {"| memset flush, single launch |": lambda c: c["rows"] | {"vector": c["rows"]["c1g16cs"]},
             "| read flush (clean L2) |": lambda c: c["read_flush"]["rows"],
             "| graph of 16 launches (what the engine pays) |": lambda c: c["graph"]["rows"]}
    for head, rows_of in views.items():
        line = next(x for x in plan.splitlines() if x.strip().startswith(head))
        for case in (c for c in data["cases"] if c["batch"] in (64, 128)):
            rows = rows_of(case)
            for name in ("prod", "vector", "memcpy_same_bytes"):
                assert f"{rows[name]['median_s'] * 1e6:.2f}" in line, (head, case["batch"], name, line)
