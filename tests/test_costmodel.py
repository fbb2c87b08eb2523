"""The verify-cost model: floors against an independent weight count, the uniform-routing formula against a
simulation, the fit recovering known efficiencies, the h200_facts validation targets, the best-budget pick,
the measurement helpers on the CPU and the trace / replay command line."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
import torch

from kdbench import bestbudget as bb
from kdbench import cli, costfit, costmeasure
from kdbench import costmodel as cm
from kdbench import trace as tr
from kdbench.backends import torch_ops
from kdbench.backends.chain_device import chain_anc
from kdbench.references.model import weight_shapes
from kdbench.references.model_config import get_preset
from kdbench.references.tree_build import build_tree_from_topk, pad_tree_arrays


@pytest.mark.parametrize("name,rel", [("kimi-k2-slice-2", 2e-3), ("kimi-k2", 2e-3), ("deepseek-v3", 2e-3),
                                      ("tiny-groups", 0.1)])   # tiny: activations are a few % of its weights
def test_ar_floor_bytes_are_the_weights_one_token_reads(name, rel):
    cfg = get_preset(name)
    shapes = weight_shapes(cfg)
    total = sum(math.prod(s) for n, s in shapes.items() if n != "embed" and len(s) >= 2 and "gate_bias" not in n)
    unused = (cfg.n_routed_experts - cfg.n_experts_per_tok) * 3 * cfg.hidden * cfg.moe_intermediate
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    want = 2 * (total - n_moe * unused)                           # bf16, one token touches top-k experts
    f = cm.floors(cfg, 1, 1, 0)                                   # uniform curve: 1 token -> exactly k experts
    assert f.experts == pytest.approx(cfg.n_experts_per_tok)
    logits = cfg.vocab_size * cm.LOGIT_BYTES
    assert want <= f.bytes - logits <= want * (1 + rel)          # the rest: activations and one cache row


def test_uniform_experts_matches_a_simulation():
    cfg = get_preset("kimi-k2")
    rng = np.random.default_rng(0)
    for tokens in (1, 7, 50, 300):
        sims = [len({e for _ in range(tokens) for e in rng.choice(384, 8, replace=False)}) for _ in range(200)]
        assert cm.uniform_experts(cfg, tokens) == pytest.approx(np.mean(sims), rel=0.03)


def test_expert_curve_interpolates_and_clamps():
    curve = costfit.expert_curve(costfit.H200_FACTS)
    cfg = get_preset("kimi-k2-slice-2")
    for m in costfit.H200_FACTS:
        assert curve(cfg, m.batch, m.rows) == pytest.approx(m.experts)
    mid = curve(cfg, 8, 48)
    assert curve(cfg, 8, 33) < mid < curve(cfg, 8, 65)
    assert curve(cfg, 1024, 4096) == pytest.approx(260.0)         # clamped to the measured corner


def test_fit_recovers_known_efficiencies():
    truth = cm.Efficiency(gemm=0.55, moe=0.8, attn=0.5, overhead_s=3e-3, layer_s=0.4e-3)
    curve = costfit.expert_curve(costfit.H200_FACTS)
    ms = [costfit.Measurement(model, b, r, 1024, cm.forward_time(cm.floors(get_preset(model), b, r, 1024, experts=curve),
                                                                 truth))
          for model in ("kimi-k2-slice-2", "kimi-k2-slice-4") for b in (1, 8, 32) for r in (1, 17, 65, 257)]
    got = costfit.fit(ms, curve, attn_eff=0.5)
    for key in ("gemm", "moe", "overhead_s", "layer_s"):
        assert getattr(got, key) == pytest.approx(getattr(truth, key), rel=1e-6), key
    assert costfit.summary(costfit.validate(ms, got, curve))["max_abs_error"] < 1e-9


def test_fit_recovers_a_host_bound_regime():
    """Eager launches overlap the GPU: small forwards take the host's time, large ones the device's."""
    truth = cm.Efficiency(gemm=0.6, moe=0.9, attn=0.5, overhead_s=1.5e-3, host_s=6.0e-3)
    curve = costfit.expert_curve(costfit.H200_FACTS)
    cfg = get_preset("kimi-k2-slice-2")
    ms = [costfit.Measurement(cfg.name, b, r, 1024, cm.forward_time(cm.floors(cfg, b, r, 1024, experts=curve), truth))
          for b in (1, 8, 32) for r in (1, 9, 17, 33, 65, 129, 257)]
    assert sum(m.seconds == pytest.approx(6.0e-3) for m in ms) >= 3        # some cells are host-bound
    got = costfit.fit(ms, curve, attn_eff=0.5)
    for key in ("gemm", "moe", "overhead_s", "host_s"):
        assert getattr(got, key) == pytest.approx(getattr(truth, key), rel=0.02), key
    assert costfit.summary(costfit.validate(ms, got, curve))["max_abs_error"] < 0.01


H200_MEASURED = "reports/h200/2026-12-01/replay/costmodel_measurements.jsonl"


def test_fitted_efficiencies_on_the_h200_measurements_are_physical():
    """Every efficiency <= 1 (no class beats its floor), every fixed time >= 0, on the committed H200 cells and
    on every leave-one-out fit of them; and the issue's targets out of sample (median <= 10 %, worst <= 25 %)."""
    ms = costfit.load(pathlib.Path(__file__).resolve().parents[1] / H200_MEASURED)
    curve = costfit.expert_curve(ms)
    fits = [costfit.fit(ms, curve)] + [costfit.fit(ms[:i] + ms[i + 1:], curve) for i in range(len(ms))]
    for eff in fits:
        assert 0 < eff.gemm <= 1 and 0 < eff.moe <= 1 and 0 < eff.attn <= 1, eff
        assert min(eff.overhead_s, eff.layer_s, eff.host_s, eff.host_layer_s, eff.draft_overhead_s) >= 0, eff
    s = costfit.summary(costfit.leave_one_out(ms, curve))
    assert s["cells"] == 15 and s["median_abs_error"] <= 0.10 and s["max_abs_error"] <= 0.25, s


def test_h200_facts_validation_meets_the_issue_targets():
    """Issue 13: median |error| <= 10 %, every cell <= 25 %, out of sample (leave one out)."""
    ms = list(costfit.H200_FACTS)
    s = costfit.summary(costfit.leave_one_out(ms, costfit.expert_curve(ms)))
    assert s["cells"] == 21 and s["median_abs_error"] <= 0.10 and s["max_abs_error"] <= 0.25, s


def test_build_time_fits_its_measurements():
    for b, n, v, t in cm.BUILD_MEASURED:
        assert cm.build_time(b, n, v) == pytest.approx(t, rel=0.35)   # residuals: plans/0008


def test_step_costs_grow_with_the_tree():
    cfg = get_preset("kimi-k2-slice-2")
    cs = cm.CostSetting(cfg, 1024, cm.SERVING)
    steps = [cm.spec_step(cs, 8, n).seconds for n in (0, 16, 64, 256)]
    assert steps == sorted(steps) and cm.ar_step(cs, 8).seconds < steps[0]
    assert cm.floors(cfg, 8, 65, 1024).experts > cm.floors(cfg, 8, 1, 1024).experts


def test_best_budget_is_the_highest_modeled_throughput():
    trace = tr.synthetic(3, 20, 64, vocab=512, quality=0.7, rank_probs=(0.6, 0.3, 0.1), seed=1)
    curve = costfit.expert_curve(costfit.H200_FACTS)
    cs = bb.CostSetting(get_preset("kimi-k2-slice-2"), 1024, costfit.fit(list(costfit.H200_FACTS), curve), curve)
    preds = bb.sweep(trace, [{"kind": "ddtree"}, {"kind": "adaptive"}], [2, 8, 32, 64], [1, 32], cs)
    for (kind, batch), p in bb.best(preds).items():
        same = [q.tokens_per_s for q in preds if q.policy == kind and q.batch == batch]
        assert p.tokens_per_s == max(same) and p.speedup == pytest.approx(p.tau * p.ar_step_s / p.step_s)
    taus = [q.tau for q in preds if q.policy == "ddtree" and q.batch == 1]
    assert taus == sorted(taus) and taus[-1] > taus[0]
    # tau's interval over the trace's 3 prompts, the speedup's at the modeled step times, the budgets it overlaps
    tied = 0
    for (kind, batch), p in bb.best(preds).items():
        assert p.prompts == 3 and p.tau_lo <= p.tau <= p.tau_hi
        lo, hi = p.speedup_interval()
        assert lo == pytest.approx(p.speedup * p.tau_lo / p.tau) and hi == pytest.approx(p.speedup * p.tau_hi / p.tau)
        tied += len(bb.ties(preds, p))
        for budget in bb.ties(preds, p):
            q = next(q for q in preds if (q.policy, q.batch, q.budget) == (kind, batch, budget))
            assert q is not p and q.speedup_interval()[1] >= lo and q.speedup_interval()[0] <= hi
    assert tied > 0                        # three prompts cannot separate every neighbouring budget
    table = bb.markdown(preds, "t")
    assert "| tau 95% |" in table and "budgets not told apart" in table and "(3) |" in table


def test_replay_tau_interval_is_the_pooled_ratio_over_prompts():
    trace = tr.synthetic(4, 12, 16, vocab=128, quality=0.8, rank_probs=(0.7, 0.3), seed=3)
    from kdbench.engine.stages import Policy
    from kdbench.intervals import ratio_interval
    from kdbench.replay import replay
    r = replay(trace, Policy(kind="ddtree", budget=8), None)
    iv = r.tau_interval()
    want = ratio_interval([sum(p.tau) for p in r.prompts], [len(p.tau) for p in r.prompts])
    assert iv == want and iv.n == 4 and iv.value == pytest.approx(r.mean_tau)


def test_chain_anc_is_the_engine_chain():
    logits = torch.randn(2, 15, 50, dtype=torch.float64)
    tb = torch_ops.tree_build(logits, torch.full((2,), 9, dtype=torch.int32), torch.zeros(2, dtype=torch.int64),
                              torch.zeros(2, dtype=torch.int32), 9, torch_ops.build_chain)
    assert torch.equal(chain_anc(10, 2, "cpu"), tb.anc)
    for rows in (65, 130):                     # more than one mask word: against the reference builder's bits
        n = rows - 1
        ref = build_tree_from_topk(-np.arange(1, n + 1, dtype=np.float64)[:, None], np.zeros((n, 1), np.int64), n, 0)
        bits = torch.from_numpy(np.ascontiguousarray(pad_tree_arrays(ref, rows)["bitmask"].view(np.int64)))
        assert torch.equal(chain_anc(rows, 3, "cpu"), bits.expand(3, -1, -1))


def test_measure_cell_on_the_cpu():
    from kdbench.engine.engine import target_from_preset
    model = target_from_preset("tiny-groups", seed=0, dtype=torch.float32)
    m = costmeasure.measure_cell(model, 2, 9, 20, attn="torch", device="cpu", repeat=1, seed=0)
    assert m.seconds > 0 and model.cfg.n_experts_per_tok <= m.experts <= model.cfg.n_routed_experts


def test_trace_and_replay_commands(tmp_path, capsys):
    t = tmp_path / "t.kdtr"
    assert cli.main(["trace", "--out", str(t), "--prompts", "2", "--prompt-len", "6", "--rounds", "9",
                     "--k", "16", "--quality", "0.7"]) == 0
    out = tmp_path / "r"
    assert cli.main(["replay", str(t), "--budgets", "2,16", "--policies", "chain,ddtree,adaptive:0.01",
                     "--out", str(out)]) == 0
    rows = json.loads((out / "replay.json").read_text())["replays"]
    assert [r["policy"] for r in rows][:2] == ["chain(B=2)", "chain(B=16)"] and len(rows) == 6
    assert all(1.0 <= r["tau"] <= 16 for r in rows)
    assert cli.main(["replay", str(t), "--policies", "bogus"]) == 2
    assert cli.main(["replay", str(tmp_path / "missing.kdtr")]) == 2
    assert cli.main(["replay", str(t), "--budgets", "64"]) == 2      # the trace holds top-16 only
    err = capsys.readouterr().err
    assert "bad item 'bogus'" in err and "no such trace file" in err and "needs top-64" in err


def test_fit_recovers_a_per_moe_layer_host_time():
    """Two layer counts: the host's issue time per MoE layer and per forward are separated (slice-2 + slice-4)."""
    truth = cm.Efficiency(gemm=0.55, moe=0.7, attn=0.5, overhead_s=0.4e-3, host_s=1.3e-3, host_layer_s=1.8e-3)
    curve = costfit.expert_curve(costfit.H200_FACTS)
    ms = [costfit.Measurement(model, b, r, 1024, cm.forward_time(cm.floors(get_preset(model), b, r, 1024, experts=curve),
                                                                 truth))
          for model in ("kimi-k2-slice-2", "kimi-k2-slice-4") for b in (1, 8, 32) for r in (1, 17, 65, 257)]
    assert ms[0].seconds == pytest.approx(1.3e-3 + 1.8e-3) and ms[12].seconds == pytest.approx(1.3e-3 + 3 * 1.8e-3)
    got = costfit.fit(ms, curve, attn_eff=0.5)
    for key in ("host_s", "host_layer_s", "gemm", "moe"):
        assert getattr(got, key) == pytest.approx(getattr(truth, key), rel=0.03), key
    assert costfit.summary(costfit.validate(ms, got, curve))["max_abs_error"] < 0.01


S2_MEASURED = pathlib.Path(__file__).resolve().parents[1] / "reports/h200/2026-12-01-s2/replay/costmodel_measurements.jsonl"


def test_the_session_2_h200_cells_meet_the_targets():
    """kimi-k2-slice-2, slice-4 and the trained pair (2026-12-01 session 2, plans/0008): every fit physical, in
    sample and out of sample (leave one out) median <= 10 % and every cell <= 25 % per model, and the same out of
    sample for the slices' joint fit (per-layer terms: what the 61-layer projection uses)."""
    ms = costfit.load(S2_MEASURED)
    assert {m.model for m in ms} == {"kimi-k2-slice-2", "kimi-k2-slice-4", "kdbench-pair"}
    assert {m.mode for m in ms} == {"eager"} and len(costfit.outside_verify(ms, "kdbench-pair")) == 3
    for model in sorted({m.model for m in ms}):
        cells = [m for m in ms if m.model == model]
        curve = costfit.expert_curve(cells)
        eff = costfit.fit(cells, curve)
        assert 0 < eff.gemm <= 1 and 0 < eff.moe <= 1, (model, eff)
        assert min(eff.overhead_s, eff.host_s, eff.draft_overhead_s) >= 0, (model, eff)
        ins = costfit.summary(costfit.validate(cells, eff, curve))
        assert ins["median_abs_error"] <= 0.10 and ins["max_abs_error"] <= 0.25, (model, ins)
        loo = costfit.summary(costfit.leave_one_out(cells, curve))
        assert loo["median_abs_error"] <= 0.10 and loo["max_abs_error"] <= 0.25, (model, loo)
    slices = costfit.forwards([m for m in ms if m.model.startswith("kimi-k2-slice-")])
    loo = [c for i, m in enumerate(slices)
           for c in costfit.validate([m], costfit.fit(slices[:i] + slices[i + 1:], costfit.expert_curve(slices)),
                                     costfit.expert_curve([x for x in slices if x.model == m.model]))]
    s = costfit.summary(loo)
    assert s["cells"] == 27 and s["median_abs_error"] <= 0.10 and s["max_abs_error"] <= 0.25, s


def test_the_shipped_fit_is_the_committed_measurement_file():
    """suite/data/cost_fit_h200.json (what the replay kind models with) holds exactly the committed cells of
    the file it names, with their date, GPU and engine mode."""
    fit = costfit.shipped()
    assert fit.gpu == "NVIDIA H200" and fit.mode == "eager" and len(fit.commit) >= 7
    assert fit.measurements == tuple(costfit.load(pathlib.Path(__file__).resolve().parents[1] / fit.file))
    assert fit.file in fit.label() and fit.date in fit.label()
    eff, _, source = costfit.shipped_setting("kimi-k2-slice-4")
    assert source == f"fit: {fit.label()}" and eff.host_s > 0
    assert costfit.shipped_setting("kimi-k2")[0] == cm.SERVING
    assert "router experts of kimi-k2-slice-4" in costfit.shipped_setting("kimi-k2")[2]


def test_a_bad_shipped_fit_is_a_user_error(tmp_path):
    from kdbench.errors import UserError
    bad = tmp_path / "fit.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(UserError, match="fit.json: bad shipped cost fit"):
        costfit.shipped(bad)
    bad.write_text("{")
    with pytest.raises(UserError, match="bad shipped cost fit"):
        costfit.shipped(bad)


def test_the_pair_drafter_the_model_charges_is_the_shipped_one():
    from kdbench import pair
    assert cm.default_drafter(get_preset("kdbench-pair")) == pair.drafter_config()


def test_live_check_budgets_are_the_best_and_its_two_nearest():
    grid = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert bb.live_check_budgets(grid, 64) == [32, 64, 128]
    assert bb.live_check_budgets(grid, 1024) == [256, 512, 1024]   # top of the grid: both below
    assert bb.live_check_budgets(grid, 4) == [4, 8, 16]            # bottom: both above
    assert bb.live_check_budgets([16, 64], 64) == [16, 64]
    assert bb.live_check_budgets(list(reversed(grid)), 8) == [4, 8, 16]


def test_budgets_not_told_apart_are_the_overlapping_intervals():
    def pred(budget, speedup, tau_lo, tau_hi, batch=1, policy="ddtree"):
        return bb.Prediction(policy, f"{policy}(B={budget})", budget, batch, 2.0, 10.0, 1e-3, 1e-3, 1.0, speedup,
                             8.0, 1.0, tau_lo=tau_lo, tau_hi=tau_hi, prompts=12)
    top = pred(64, 1.4, 1.8, 2.2)                      # speedup 1.26-1.54
    near, far = pred(16, 1.2, 1.8, 2.2), pred(256, 1.0, 1.9, 2.1)   # 1.08-1.32 overlaps; 0.95-1.05 does not
    other_batch, no_iv = pred(32, 1.3, 1.8, 2.2, batch=8), pred(8, 1.35, math.nan, math.nan)
    assert bb.ties([top, near, far, other_batch, no_iv], top) == [16]
    assert no_iv.speedup_interval() is None
