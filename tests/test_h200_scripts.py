"""CPU checks of the H200 scripts whose outputs the findings quote: the live best-budget check (batch 1 over
several prompts, replay == live on the CPU's float32 target), the ncu summary of a committed ncu CSV, and that the
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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compile only; the benches run on the H200)")
@pytest.mark.parametrize("bench", sorted(p.name for p in (ROOT / "reports/h200").glob("*.cu")))
def test_h200_bench_sources_compile(bench, tmp_path):
    """The torch-free kernel benches include csrc/ directly: a kernel change that breaks one shows here, not in
    the next GPU call."""
    cmd = ["nvcc", "-O3", "-std=c++20", "-gencode=arch=compute_90a,code=sm_90a", f"-I{ROOT / 'csrc'}", "-c",
           str(ROOT / "reports/h200" / bench), "-o", str(tmp_path / "bench.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
