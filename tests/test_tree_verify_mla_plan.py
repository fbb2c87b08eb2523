"""tree_verify_mla's grid plans on the host (no GPU needed): tests/tree_verify_mla_plan_check.cu includes the kernel
file, so the plan, the launch parameters, the seesaw tail plan's CTA decode and the combine's row map are the shipped
code; it checks them on 3,148 shapes and SM counts (every unit run once whole or once per piece, every partial row
written once and merged into the row it belongs to, the workspace size), and the seesaw's final O tile layout (each
accumulator element through stmatrix to the byte the TMA store's swizzled box reads for it, the tile covered once),
and prints one line per failure."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: the plan check is compiled from csrc/tree_verify_mla.cu")
def test_grid_plans_cover_every_unit_and_row(tmp_path):
    exe = tmp_path / "plan_check"
    build = subprocess.run([NVCC, "-O1", "-std=c++20", "-gencode=arch=compute_90a,code=sm_90a",
                            str(ROOT / "tests" / "tree_verify_mla_plan_check.cu"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"nvcc failed:\n{build.stderr[-3000:]}"
    env = {k: v for k, v in os.environ.items() if k not in ("KDB_TVM_TAIL", "KDB_TVM_SPLITS")}  # the model's plans
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and " 0 failures" in run.stdout, run.stdout[-3000:] + run.stderr[-1000:]
