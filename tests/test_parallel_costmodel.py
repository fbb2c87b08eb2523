"""The link cost model (MODELED): nccl-tests' inverse, the messages it charges, the roofline per layer, memory,
and the labelled 8-GPU comparison."""
from __future__ import annotations

import dataclasses
import json
import math

from kdbench.experts import uniform_experts
from kdbench.parallel import costmodel as cm
from kdbench.parallel import messages, report_section
from kdbench.references.model_config import get_preset
from kdbench.results import Record

K2 = get_preset("kimi-k2")


def test_link_time_inverts_nccl_tests_busbw():
    link = cm.Link("x", alpha_s=20e-6, busbw_Bps=100e9)
    assert link.seconds("all_reduce", 1 << 30, 1) == 0.0               # one rank sends nothing
    for op in ("all_reduce", "all_gather", "all_to_all"):
        size = 1 << 30
        t = link.seconds(op, size, 8) - link.alpha_s
        assert math.isclose(size / t * messages.bus_factor(op, 8), 100e9, rel_tol=1e-12)   # busbw recovered


def test_uniform_experts_matches_the_notes():
    """shared/notes/mla_moe.md §6: DSV3 (256, top-8) 16 rows -> 102, 64 -> 222; K2 (384) 64 -> 284. The link
    model charges exactly these (one formula, kdbench.experts, shared with kdbench.costmodel)."""
    assert round(uniform_experts(256, 8, 16)) == 102 and round(uniform_experts(256, 8, 64)) == 222
    assert round(uniform_experts(384, 8, 64)) == 284 and math.isclose(uniform_experts(384, 8, 1), 8)
    assert uniform_experts(0, 0, 64) == 0.0
    assert cm.uniform_experts is uniform_experts, "the link model must use the shared formula, not a copy"


def test_comm_charges_the_exact_all_to_all_not_the_padded_buffers():
    rows, n = 65, 8
    link = cm.Link("x", alpha_s=0.0, busbw_Bps=1e9)
    got = cm.layer_comm_s(K2, 1, link, n, rows)
    per = math.ceil(rows / n)
    a2a = 2 * per * 8 * 7168 * 2 * (n - 1) / n
    ar = rows * 7168 * 2 * 2 * (n - 1) / n
    ag = n * per * 7168 * 2 * (n - 1) / n
    assert math.isclose(got, (a2a + ar + ag) / 1e9, rel_tol=1e-12)
    padded = [b for op, b in messages.layer_messages(K2, 1, n, "ep", rows, 2) if op == "all_to_all"]
    assert padded[0] == n * per * 8 * 7168 * 2                        # what the capturable buffers send: n x more


def test_step_time_orders():
    ar = cm.step_s(K2, cm.H200, cm.NVLINK_H200_8, 8, batch=1, T=1, ctx=4096)
    ver = cm.step_s(K2, cm.H200, cm.NVLINK_H200_8, 8, batch=1, T=65, ctx=4096)
    pcie = cm.step_s(K2, cm.H200, cm.PCIE5_P2P_8, 8, batch=1, T=65, ctx=4096)
    assert ver["compute_s"] > 3 * ar["compute_s"]                      # 284 experts touched vs 8
    assert pcie["comm_s"] > ver["comm_s"] and pcie["compute_s"] == ver["compute_s"]
    slow = dataclasses.replace(cm.H200, efficiency=0.25)
    slow_ar = cm.step_s(K2, slow, cm.NVLINK_H200_8, 8, batch=1, T=1, ctx=4096)
    assert math.isclose(slow_ar["compute_s"], 2 * ar["compute_s"])
    four = cm.step_s(K2, cm.H200, cm.NVLINK_H200_8, 4, batch=1, T=1, ctx=4096)
    assert four["compute_s"] > ar["compute_s"]                         # fewer ranks: more weights each


def test_memory_fits_full_k2_on_8_but_not_on_4():
    assert cm.memory_ok(K2, 8, 96e9)[0] and cm.memory_ok(K2, 8, 141e9)[0]
    fits, gb = cm.memory_ok(K2, 4, 96e9)
    assert not fits and gb > 96


def test_8gpu_comparison_is_labelled_and_complete():
    assert cm.ASSUMPTIONS[0].startswith("MODELED")
    rows = cm.compare_8gpu()
    assert [r["gpu"] for r in rows] == ["H200", "RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell"]
    for r in rows:
        assert r["verify"]["total_s"] > r["ar"]["total_s"] > 0 and r["fits"]
        assert math.isclose(r["speedup"], r["ddtree_tok_s"] / r["ar_tok_s"])
    assert rows[0]["ar_tok_s"] > rows[1]["ar_tok_s"] > rows[2]["ar_tok_s"]


def test_calibrated_efficiency_reproduces_the_measurement():
    cfg = get_preset("kimi-k2-slice-2")
    eff = cm.calibrated_efficiency(12.1e-3, cfg, cm.H200, batch=8, T=65, ctx=129)
    gpu = dataclasses.replace(cm.H200, efficiency=eff)
    assert 0 < eff < 1
    bf16 = cm.Weights(expert=2.0)
    modeled = cm.step_s(cfg, gpu, cm.NVLINK_H200_8, 1, batch=8, T=65, ctx=129, w=bf16)["total_s"]
    assert math.isclose(modeled, 12.1e-3, rel_tol=1e-9)
    slow = cm.compare_8gpu(efficiency=eff / 2)
    assert slow[0]["ar"]["compute_s"] > cm.compare_8gpu(efficiency=eff)[0]["ar"]["compute_s"]


def test_validation_table_models_the_measured_runs_bf16_experts():
    """The report's measured-vs-modeled check must model what was measured (bf16 random experts, as the
    calibration does), not K2's INT4 experts: a run that equals the bf16 model reads 1.00."""
    cfg = get_preset("kimi-k2-slice-2")
    shape = {"model": "kimi-k2-slice-2", "batch": 4, "budget": 31, "prompt_len": 100}
    want = cm.step_s(cfg, cm.H200, cm.NVLINK_H200_8, 1, batch=4, T=32, ctx=101, w=cm.MEASURED_WEIGHTS)["total_s"]
    rec = Record("t", "topology", "c", "", "torch", dtype="bfloat16", phase="verify", shape=json.dumps(shape),
                 time_median_s=want, extra={"world": 1, "comm_s": 0.0})
    table = report_section.validation_table([rec])
    assert table["rows"][0][-1] == "1.00"
    int4 = cm.step_s(cfg, cm.H200, cm.NVLINK_H200_8, 1, batch=4, T=32, ctx=101)["total_s"]
    assert int4 < want        # the INT4 model would have read > 1 for the same run
