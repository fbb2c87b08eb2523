"""kdbench.parallel on the CPU: 2 gloo ranks equal one process (tp and ep; the EP MoE layer bit for bit; one
rank bit for bit), the messages recorded equal the analytic list, torchrun's rendezvous runs the same job,
link modes and the NCCL log parser, the collective formulas."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kdbench import config, runner
from kdbench.errors import ScenarioError
from kdbench.parallel import comm_bench, link, measure, messages, rows
from kdbench.parallel.job import Job, make_inputs
from kdbench.parallel.launch import launch
from kdbench.references.model_config import get_preset
from kdbench.results import load_records

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def ci_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("topo") / "run"
    res = runner.run_scenarios([str(ROOT / "scenarios/topology/cpu_gloo.yaml")], str(out), "cpu",
                               progress=False)
    return res, load_records(out)


def test_ci_scenario_equals_one_process(ci_records):
    res, recs = ci_records
    assert res.exit_code == 0, [(r.case, r.phase, r.reason) for r in recs if r.status != "info"]
    phases = [r for r in recs if not r.phase.startswith("comm")]
    assert {(r.case, r.phase) for r in phases} >= {
        (f"tiny-f64[parallel={p}]", f) for p in ("tp", "ep") for f in ("prefill", "decode", "verify")}
    assert all(r.status == "pass" for r in phases)
    for r in phases:
        if r.phase == "moe" and r.shape.find('"parallel":"ep"') >= 0 or r.case == "tp-1rank-exact":
            assert r.rel_l2 == 0 and r.extra["bit_equal"] is True   # EP MoE alone (both dispatches); one rank
        else:
            assert 0 < r.rel_l2 < 1e-13      # 2 ranks: the all-reduce's order differs (and is not hidden)
    assert {r.phase for r in phases if r.case == "tiny-f64-ep-exact-sizes"} == {"decode", "verify", "moe"}
    assert all(r.family == "" for r in recs)      # family is a kernel family only (issue 10)
    assert any(r.case == "ep-moe-grouped-f32" and r.dtype == "float32" for r in phases)


def test_step_time_splits_into_layers_and_collectives(ci_records):
    _, recs = ci_records
    for r in recs:
        if r.phase in ("decode", "verify") and r.extra["world"] == 2:
            layers = r.extra["layers"]
            n_layers = get_preset(json.loads(r.shape)["model"]).n_layers
            assert [x["layer"] for x in layers] == list(range(n_layers))
            assert all(x["comm_s"] > 0 and x["total_s"] >= x["comm_s"] for x in layers)
            assert sum(x["total_s"] for x in layers) <= r.time_median_s * 1.5
            assert r.extra["transport"].startswith("gloo")
        if r.phase == "verify" and "comm_s" in r.extra:
            dec = next(d for d in recs if d.case == r.case and d.phase == "decode")
            assert math.isclose(r.extra["breakeven_tau"], r.time_median_s / dec.time_median_s)
            assert 0 < r.extra["comm_share_verify"] < 1


def test_recorded_messages_equal_the_analytic_list(ci_records):
    _, recs = ci_records
    cfg = get_preset("tiny")
    for r in recs:
        if r.case.startswith("tiny-f64[") and r.phase in ("decode", "verify", "prefill"):
            shape = json.loads(r.shape)
            rows = shape["batch"] * {"prefill": shape["prompt_len"], "decode": 1, "verify": shape["budget"] + 1}[r.phase]
            want = messages.step_messages(cfg, 2, shape["parallel"], rows, 8)
            assert [tuple(c) for c in r.extra["calls"]] == want, (r.case, r.phase)


def test_comm_rows_follow_nccl_tests_definitions(ci_records):
    _, recs = ci_records
    comm = [r for r in recs if r.phase.startswith("comm")]
    sweep = {r.phase for r in comm if r.extra["source"] == "sweep"}
    assert sweep == {f"comm:{op}:{s}" for op in comm_bench.OPS for s in (4096, 8192, 16384)}
    step = {(r.extra["op"], int(r.bytes_moved)) for r in comm if r.extra["source"] == "step"}
    sent = {(op, b) for r in recs if r.case == "tp-1rank-exact" and "calls" in r.extra for _, op, b in r.extra["calls"]}
    assert step == sent and {op for op, _ in step} == {"all_reduce"}     # tp: all-reduces only
    for r in comm:
        assert math.isclose(r.extra["algbw_GBps"] * 1e9, r.bytes_moved / r.time_median_s, rel_tol=1e-9)
        assert r.extra["busbw_GBps"] == 0.0                       # one rank: nothing crosses a link


def test_bus_factors_and_sizes():
    assert comm_bench.bus_factor("all_reduce", 8) == 2 * 7 / 8
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert comm_bench.bus_factor(op, 4) == 3 / 4
    sizes = comm_bench.default_sizes()
    assert sizes[0] == 4096 and sizes[-1] == 1 << 30 and len(sizes) == 19


def test_torchrun_rendezvous_runs_the_same_job(tmp_path):
    """Several hosts use torchrun's rendezvous; on one host --standalone exercises the same entry point."""
    job = Job(model="tiny", seed=11, dtype="float64", parallel="ep", world=2, device="cpu",
              out_dir=str(tmp_path / "torchrun"), batch=2, prompt_len=6, budget=5, phases=("decode", "moe"),
              repeat=1, warmup=0, timeout_s=60)
    Path(job.out_dir).mkdir()
    (tmp_path / "job.json").write_text(job.to_json())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "kdbench.parallel.worker", "--job", str(tmp_path / "job.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    spawned = Job(**{**job.__dict__, "out_dir": str(tmp_path / "spawn")})
    assert launch(spawned).ok
    for r in range(2):
        a = json.loads(Path(job.out_dir, f"rank{r}.json").read_text())["phases"]
        b = json.loads(Path(spawned.out_dir, f"rank{r}.json").read_text())["phases"]
        assert a["decode"]["digest"] == b["decode"]["digest"] and a["moe"]["digest"] == b["moe"]["digest"]
    rank0 = json.loads(Path(job.out_dir, "rank0.json").read_text())["phases"]
    assert rank0["moe"]["check"]["bit_equal"] is True and rank0["decode"]["check"]["rel_l2"] < 1e-13


def test_job_round_trips_json_and_inputs_are_trees():
    job = Job(model="tiny", seed=3, dtype="float32", parallel="tp", world=2, device="cpu", out_dir="/x",
              budget=70, comm_bench=(4096,), env={"A": "1"})
    assert Job.from_json(job.to_json()) == job
    x = make_inputs(job, 256)
    assert x.anc.shape == (job.batch, 71, 2)                    # 71 rows: two 64-bit words
    assert (x.depth[:, 0] == 0).all() and (x.depth[:, 1:] >= 1).all()
    assert ((x.anc[:, :, 0] & 1) == 1).all()                   # the root is everyone's ancestor


NCCL_LOG = """\
h200-0:4242:4300 [0] NCCL INFO NCCL version 2.27.3+cuda12.9
h200-0:4242:4300 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
h200-0:4242:4300 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
h200-0:4242:4300 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""
SHM_LOG = "h:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct\n"
NET_LOG = "h:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0\n"


def test_nccl_log_parser_and_link_verdicts(tmp_path):
    (tmp_path / "nccl.h.1.log").write_text(NCCL_LOG)
    p2p = link.parse_logs(str(tmp_path))
    assert p2p["transports"] == ["P2P/CUMEM/read"] and p2p["channels"] == 2 and p2p["version"].startswith("2.27")
    assert link.mismatch("nvlink", p2p, 2) == "" and "still used P2P" in link.mismatch("pcie", p2p, 2)
    (tmp_path / "nccl.h.2.log").write_text(SHM_LOG + NET_LOG)
    mixed = link.parse_logs(str(tmp_path))
    assert mixed["kinds"] == ["NET", "P2P", "SHM"]
    assert "NCCL used" in link.mismatch("nvlink", mixed, 2)
    assert link.mismatch("auto", mixed, 2) == "" and link.summary(mixed, 1).startswith("none")
    empty = link.parse_logs(str(tmp_path / "missing"))
    assert "cannot confirm" in link.mismatch("pcie", empty, 2)


def test_link_modes_map_to_nccl_settings_and_skip_what_cannot_be_had():
    assert link.nccl_env("pcie", "/d")["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" not in link.nccl_env("nvlink", "/d") and link.nccl_env("auto", "/d")["NCCL_DEBUG"] == "INFO"
    nv = {"a": 0, "b": 1, "link": "nvlink", "detail": "NV18"}
    pc = {"a": 0, "b": 2, "link": "pcie", "detail": "SYS: across NUMA nodes"}
    assert link.unavailable("nvlink", 2, [nv, pc]) == ""          # GPUs 0 and 1 only
    assert "GPU0-GPU2" in link.unavailable("nvlink", 3, [nv, pc])
    assert "needs >= 2 GPUs" in link.unavailable("pcie", 1, [])
    assert link.unavailable("auto", 1, []) == "" and link.unavailable("pcie", 2, []) == ""


def test_report_has_the_topology_section(ci_records, tmp_path):
    from kdbench import report
    res, _ = ci_records
    html = report.render(res.run_dir).read_text()
    assert "bus bandwidth vs message size per link" in html
    assert "sharded step time per link: compute vs communication" in html
    assert "MODELED, not measured: full-size Kimi K2 with DDTree on 8 GPUs" in html
    # the legend names every backend of the section, the collective library too (not a registry entry)
    assert "<b>torch</b> torch eager" in html and "<b>gloo</b> gloo collectives between CPU processes" in html


SKIPS = """
name: skips
kind: topology
cases:
  - name: heads-not-divisible
    backends: [torch]
    shape: {model: tiny, gpus: 3}
  - name: fault-rank-out-of-range
    backends: [torch]
    shape: {model: tiny, gpus: 2, parallel: ep, fault: raise, fault_rank: 2}
  - name: cuda-attention-on-cpu
    backends: [cuda]
    shape: {model: tiny, gpus: 2}
"""


def test_impossible_cases_are_skipped_with_the_reason_before_any_launch(tmp_path):
    path = tmp_path / "skips.yaml"
    path.write_text(SKIPS)
    res = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cpu", progress=False)
    recs = {r.case: r for r in load_records(tmp_path / "run")}
    assert res.exit_code == 0 and all(r.status == "skipped" for r in recs.values())
    assert "n_heads 4," in recs["heads-not-divisible"].reason and "not divisible by 3 ranks" in recs["heads-not-divisible"].reason
    assert "fault_rank 2 is not a rank of 2" in recs["fault-rank-out-of-range"].reason
    assert "needs --device cuda" in recs["cuda-attention-on-cpu"].reason
    assert not (tmp_path / "run" / "parallel").exists()                 # nothing was launched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: one NCCL rank")
def test_one_gpu_nccl_rank_equals_one_process(tmp_path):
    text = (ROOT / "scenarios/topology/h200_gpu1.yaml").read_text()
    path = tmp_path / "gpu1.yaml"
    path.write_text(text)
    res = runner.run_scenarios([str(path)], str(tmp_path / "run"), "cuda", filter_expr=["tiny-gpu1-f32"], progress=False)
    recs = load_records(tmp_path / "run")
    assert res.exit_code == 0 and {r.status for r in recs} == {"pass"}
    assert all(r.extra["transport"].startswith("none (1 rank") for r in recs)


@pytest.mark.parametrize("shape, key", [
    ("{model: nope, gpus: 2}", "model"), ("{model: tiny, link: infiniband}", "link"),
    ("{model: tiny, timeout_s: 0}", "timeout_s"), ("{model: tiny, phases: []}", "phases"),
    ("{model: tiny, comm_max_bytes: 100}", "comm_max_bytes"), ("{model: tiny, gpus: 0}", "gpus"),
])
def test_bad_topology_shapes_are_one_line_user_errors(tmp_path, shape, key):
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\nkind: topology\ncases:\n  - name: c\n    shape: {shape}\n")
    with pytest.raises(ScenarioError, match=rf"cases\[0\]\.shape\.{key}"):
        config.load(path)


@pytest.mark.parametrize("tol", ["{rtol: 1.0e-3}", "{rel_l2: 1.0e-6, max_outside_pct: 5}"])
def test_a_tolerance_topology_would_not_apply_is_refused(tmp_path, tol):
    """rows._verdict applies rel_l2 and atol only: an rtol-only tolerance would pass any output."""
    path = tmp_path / "t.yaml"
    path.write_text(f"name: t\nkind: topology\ncases:\n  - name: c\n    backends: [torch]\n"
                    f"    shape: {{model: tiny, gpus: 2}}\n    tolerance: {tol}\n")
    with pytest.raises(ScenarioError, match="cases\\[0\\].tolerance.*rel_l2 and atol only"):
        config.load(path)


def test_a_topology_case_names_one_backend(tmp_path):
    """One sharded job per case: [torch, cuda] ran once with cuda attention and recorded backend 'torch,cuda'."""
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nkind: topology\ncases:\n  - name: c\n    backends: [torch, cuda]\n"
                    "    shape: {model: tiny, gpus: 2}\n")
    with pytest.raises(ScenarioError, match=r"cases\[0\]\.backends: got \['torch', 'cuda'\], expected one backend"):
        config.load(path)


@pytest.mark.parametrize("tol", [config.Tolerance(rel_l2=1e-6), config.Tolerance(atol=1e-6), config.Tolerance()])
def test_a_check_on_an_all_zero_or_non_finite_reference_fails(tol):
    """A NaN rel_l2 or max_abs compares False with every bound, so the check would pass unseen: an all-zero
    one-process reference (0/0; the sharded output zero too) and a reference holding an inf must fail."""
    rng = np.random.default_rng(11)
    want = torch.from_numpy(rng.standard_normal((3, 5)))
    zero = torch.zeros(3, 5, dtype=torch.float64)
    inf_ref = want.clone()
    inf_ref[1, 2] = math.inf
    for ref, got in ((zero, zero), (zero, want), (inf_ref, inf_ref)):
        status, reason = rows._verdict(measure.compare(ref, got), tol, ["d", "d"])
        assert status == "fail" and "nothing was checked" in reason, (ref, got, reason)
    assert rows._verdict(measure.compare(want, want.clone()), tol, ["d", "d"]) == ("pass", "")
    near = want * (1 + 1e-3)                                   # a real difference still fails on its bound
    assert rows._verdict(measure.compare(want, near), tol, ["d", "d"])[0] == "fail"
