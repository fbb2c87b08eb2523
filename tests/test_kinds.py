"""Every scenario kind runs on CPU with tiny shapes: acceptance (tau, per-depth, losslessness), e2e (per-stage
times, speedup, predicted speedup), topology (link modes skip on the CPU with the reason; the sharded runs: tests/test_parallel.py)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kdbench import runner
from kdbench.results import load_records
from kdbench.engine.records import GenerateResult, StepRecord
from kdbench.kinds.e2e import slot_efficiency

ACCEPTANCE = """
name: acc
kind: acceptance
seed: 3
cases:
  - name: sweep
    backends: [torch]
    shape: {model: tiny, policy: ddtree, budget: 8, prompts: 2, prompt_len: 8, max_new_tokens: 12,
            drafter: synthetic, quality: 0.7, batch: 2}
    sweep: {shape.policy: [ddtree, chain, ddtree_width_capped, static_kary]}
  - name: block
    backends: [torch]
    shape: {model: tiny-groups, policy: ddtree, budget: 4, prompts: 2, prompt_len: 5, max_new_tokens: 6,
            drafter: block, batch: 1}
"""

E2E = """
name: e2e
kind: e2e
seed: 4
cases:
  - name: ddtree
    backends: [torch]
    shape: {model: tiny, policy: ddtree, budget: 8, prompts: 2, prompt_len: 8, max_new_tokens: 10,
            drafter: synthetic, quality: 0.8, batch: 2}
"""

TOPOLOGY = """
name: topo
kind: topology
cases:
  - name: tp-nvlink-vs-pcie
    backends: [torch]
    shape: {model: kimi-k2-slice-2, gpus: 2, parallel: tp}
    sweep: {shape.link: [nvlink, pcie]}
"""


def _run(tmp_path, text: str, name: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    out = runner.run_scenarios([str(path)], str(tmp_path / name), "cpu", progress=False)
    return out, load_records(tmp_path / name)


def test_acceptance_kind(tmp_path):
    out, recs = _run(tmp_path, ACCEPTANCE, "acc")
    assert out.exit_code == 0, [(r.case, r.reason) for r in recs]
    assert len(recs) == 5 and all(r.lossless == "yes" and r.status == "pass" for r in recs)
    for r in recs:
        depth = r.extra["per_depth_accept"]
        assert len(depth) == 15 and all(a >= b for a, b in zip(depth, depth[1:]))
        assert math.isclose(r.tau, 1 + sum(depth), rel_tol=1e-9)       # tau counts the bonus token
        hist = r.extra["accept_len_hist"]
        assert sum(hist.values()) == r.extra["steps"]
    assert {r.policy for r in recs} >= {"ddtree(B=8)", "chain(B=8)"} and {r.family for r in recs} == {""}


def test_e2e_kind(tmp_path):
    out, recs = _run(tmp_path, E2E, "e2e")
    assert out.exit_code == 0
    ar, spec = recs
    assert ar.policy == "ar" and spec.policy == "ddtree(B=8)"
    assert spec.lossless == "yes" and spec.tau > 1
    assert set(spec.extra["stage_s"]) >= {"draft", "build", "verify", "accept", "compact"}
    assert spec.n_samples == len(spec.samples_s) > 0 and spec.time_median_s > 0
    assert math.isclose(spec.speedup_vs_ar, spec.tokens_per_s / ar.tokens_per_s)
    assert math.isclose(spec.predicted_speedup, spec.tau * ar.time_median_s / spec.time_median_s)
    assert spec.ttft_s > 0 and spec.tpot_s > 0
    # the pooled tau's interval over the 2 prompts, recomputed here from the recorded per-prompt taus and steps
    # (y_i = tau_i x_i); the speedup's is over batches: 2 prompts at batch 2 are one batch, so none
    taus, steps = np.array(spec.extra["tau_per_prompt"]), np.array(spec.extra["tau_steps_per_prompt"], float)
    assert spec.extra["tau_prompts"] == 2 and len(taus) == len(steps) == 2
    y, r = taus * steps, (taus * steps).sum() / steps.sum()
    assert math.isclose(r, spec.tau, rel_tol=1e-12)
    se = math.sqrt(((y - r * steps) ** 2).sum() / 2) / steps.mean()
    assert spec.extra["tau_ci95"] == pytest.approx([r - 12.706 * se, r + 12.706 * se], rel=1e-9, abs=1e-12)
    assert spec.extra["speedup_ci95"] is None and spec.extra["speedup_batches"] == 1
    assert "tau_ci95" not in ar.extra


def test_topology_link_modes_skip_on_cpu_with_the_reason(tmp_path):
    """nvlink / pcie select NCCL transports: on the CPU (gloo) they are skipped rows, link fields kept."""
    out, recs = _run(tmp_path, TOPOLOGY, "topo")
    assert out.exit_code == 0
    assert [r.link for r in recs] == ["nvlink", "pcie"]
    assert all(r.status == "skipped" and "--device cpu runs gloo" in r.reason for r in recs)
    assert all("topology_matrix" in r.extra for r in recs)


def test_divergence_is_classified_by_the_ar_logit_gap():
    """A planted divergence to AR's least likely token is a MISMATCH (a bug); an identical run is 'yes'."""
    import torch

    from kdbench.engine.engine import generate, target_from_preset
    from kdbench.engine.stages import Policy
    from kdbench.kinds import generation as gen

    model = target_from_preset("tiny", seed=5, device="cpu", dtype=torch.float64)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    ar = [generate(model, None, prompts, 6, Policy(kind="ar"))]
    assert gen.losslessness(model, prompts, ar, ar) == ("yes", False)
    worst = _least_likely_next(model, prompts[1] + ar[0].tokens[1][:2])
    planted = [type(ar[0])(tokens=[list(ar[0].tokens[0]), ar[0].tokens[1][:2] + [worst] + ar[0].tokens[1][3:]])]
    verdict, bug = gen.losslessness(model, prompts, ar, planted)
    assert bug and verdict.startswith("no: MISMATCH (prompt 1, position 2, AR logit gap"), verdict
    assert "; router margin " in verdict and model.margin_log is None, "an MoE target's verdict names its margin"


def test_float64_divergence_is_never_a_near_tie():
    """The near-tie excuse depends on the dtype: float64 has none, so even AR's runner-up token is a MISMATCH."""
    import torch

    from kdbench.kinds import generation as gen

    assert gen.NEAR_TIE_LOGIT[torch.float64] == 0 < gen.NEAR_TIE_LOGIT[torch.float32] < gen.NEAR_TIE_LOGIT[torch.bfloat16]
    model, prompts, ar, planted, _gap = _runner_up_at_position_1()
    verdict, bug = gen.losslessness(model, prompts, ar, planted)
    assert bug and "MISMATCH (prompt 0, position 1" in verdict, verdict


def test_near_tie_threshold_is_looked_up_by_the_model_dtype(monkeypatch):
    """With a (patched) float64 threshold above the runner-up's gap the same divergence is a near-tie, not a
    bug: the verdict follows the model's dtype entry."""
    import torch

    from kdbench.kinds import generation as gen

    model, prompts, ar, planted, gap = _runner_up_at_position_1()
    monkeypatch.setitem(gen.NEAR_TIE_LOGIT, torch.float64, 2 * gap)
    verdict, bug = gen.losslessness(model, prompts, ar, planted)
    assert not bug and verdict.startswith("no: near-tie (prompt 0, position 1"), verdict


def _runner_up_at_position_1():
    """A float64 tiny model, one prompt, its AR run, and that run with AR's runner-up token planted at position
    1; also AR's logit gap there (best - runner-up)."""
    import torch

    from kdbench.engine.engine import generate, target_from_preset
    from kdbench.engine.stages import Policy
    from kdbench.kinds.generation import next_logits

    model = target_from_preset("tiny", seed=5, device="cpu", dtype=torch.float64)
    prompts = [[1, 2, 3, 4]]
    ar = [generate(model, None, prompts, 4, Policy(kind="ar"))]
    top2 = torch.topk(next_logits(model, prompts[0] + ar[0].tokens[0][:1]), 2)
    planted = [type(ar[0])(tokens=[ar[0].tokens[0][:1] + [int(top2.indices[1])] + ar[0].tokens[0][2:]])]
    return model, prompts, ar, planted, float(top2.values[0] - top2.values[1])


def _least_likely_next(model, prefix):
    from kdbench.kinds.generation import next_logits
    return int(next_logits(model, prefix).argmin())


def test_float64_cases_and_padding_rows_check_every_backend(tmp_path):
    """float64 cases run float32 on torch against float64 inputs drawn in float32 (exact compaction); padding
    rows (all-zero masks) give o = 0 and lse = -inf in every attention baseline."""
    text = """
name: k
kind: kernel
cases:
  - name: compact64
    family: kv_compact
    backends: [torch]
    dtype: float64
    shape: {batch: 3, budget: 8, past_len: 9, layers: 2, dim: 16}
  - name: verify-padding
    family: tree_verify_mla
    backends: [torch, torch_twopass]
    shape: {batch: 2, heads: 3, nodes: 9, past_len: 21, ragged: true, padding: 2, kv_lora: 32, rope: 8}
    tolerance: {rtol: 1.0e-4, atol: 1.0e-5, rel_l2: 1.0e-5}
"""
    out, recs = _run(tmp_path, text, "k")
    assert out.exit_code == 0, [(r.case, r.backend, r.reason) for r in recs]
    assert {(r.case, r.backend, r.status) for r in recs} == {
        ("compact64", "torch", "pass"), ("verify-padding", "torch", "pass"),
        ("verify-padding", "torch_twopass", "pass")}


def test_in_place_backends_never_rewrite_the_inputs():
    """kv_compact runs in place; on the CPU a tensor made from the numpy input must be a copy, or the timed
    loop would rewrite the inputs that the reference and the post-timing check read."""
    import numpy as np

    from kdbench import config, families

    case = next(c for c in config.load(Path(__file__).parents[1] / "scenarios" / "smoke.yaml").cases
                if c.family == "kv_compact")
    fam = families.get("kv_compact")
    inputs = fam.make_inputs(case, 7)
    before = inputs["cache"].copy()
    fn = fam.timed("torch", inputs, case, "cpu")
    fn()
    fn()
    assert np.array_equal(inputs["cache"], before)


def test_slot_efficiency_counts_finished_slots_and_discarded_tokens():
    def step(i, taus):
        return StepRecord(i, taus, tuple(max(t - 1, 0) for t in taus), tuple(1 for _ in taus), {"verify": 1})
    # two requests, max_new_tokens 7 -> 6 decode tokens each: request 0 commits 3+3 in two steps, request 1
    # 2+2+4 = 8 in three (2 past its limit are discarded); step 3 runs request 0's slot idle
    res = GenerateResult(tokens=[[0] * 7, [0] * 7], steps=[step(0, (3, 2)), step(1, (3, 2)), step(2, (0, 4))])
    eff = slot_efficiency([res], 7)
    assert eff["live_slot_fraction"] == 5 / 6
    assert eff["delivered_over_committed"] == 12 / 14
    assert abs(eff["slot_efficiency"] - 5 / 6 * 12 / 14) < 1e-12
    assert slot_efficiency([GenerateResult(tokens=[], steps=[])], 7) == {}


def test_tau_per_prompt_steps_and_category_are_pooled():
    """per_prompt_steps counts a finished request's tau-0 steps out; a category's tau is pooled (tokens / steps),
    as the row's, not the mean of its prompts' taus."""
    from kdbench.kinds import generation as gen

    def step(i, taus):
        return StepRecord(i, taus, tuple(max(t - 1, 0) for t in taus), tuple(1 for _ in taus), {"verify": 1})
    res = [GenerateResult(tokens=[[1], [2], [3]], steps=[step(0, (6, 1, 2)), step(1, (0, 1, 2)), step(2, (0, 1, 4))])]
    assert gen.per_prompt_steps(res) == [(6.0, 1), (3.0, 3), (8.0, 3)]
    assert gen.per_prompt_tau(res) == [6.0, 1.0, 8.0 / 3]
    cats = gen.by_category(res, ["a", "a", "b"])
    assert cats == {"a": 9.0 / 4, "b": 8.0 / 3}      # a: (6 + 3) / (1 + 3), not (6 + 1) / 2
