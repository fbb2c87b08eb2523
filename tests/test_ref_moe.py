"""Tests for references/moe.py: hand-computed routing cases (bias, groups, -inf masking, ties, fp32 gate)
and the routed + shared expert sum against a per-token loop."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kdbench.references import moe
from kdbench.references.model import init_weights
from kdbench.references.model_config import get_preset


def _cfg(**kw):
    base = dict(n_routed_experts=4, n_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling=1.0)
    return dataclasses.replace(get_preset("tiny"), **{**base, **kw})


def _route_scores(scores_logits, bias, cfg):
    """Route one token whose gate logits are exactly `scores_logits` (x = logits, w_gate = I)."""
    x = np.array([scores_logits], dtype=np.float64)
    return moe.route(x, np.eye(len(scores_logits)), np.array(bias, dtype=np.float64), cfg)


def test_bias_selects_but_unbiased_scores_weigh():
    # s = sigmoid([0, 1, -1, 2]); biased = s + [0, 0, 0.8, -0.3] = [.5, .731, 1.069, .581] -> experts 2, 1.
    # Weights use the unbiased s: sigmoid(-1) + sigmoid(1) = 1, so normalized weights are s themselves * 2.
    idx, w = _route_scores([0.0, 1.0, -1.0, 2.0], [0.0, 0.0, 0.8, -0.3], _cfg(routed_scaling=2.0))
    assert idx.tolist() == [[2, 1]] and idx.dtype == np.int64
    np.testing.assert_allclose(w, [[2 * moe.sigmoid(-1.0), 2 * moe.sigmoid(1.0)]], rtol=1e-15)


def test_unnormalized_weights_are_scaled_scores():
    idx, w = _route_scores([0.0, 1.0, -1.0, 2.0], [0.0] * 4, _cfg(routed_scaling=2.5, norm_topk_prob=False))
    assert idx.tolist() == [[3, 1]]
    np.testing.assert_allclose(w, [[2.5 * moe.sigmoid(2.0), 2.5 * moe.sigmoid(1.0)]], rtol=1e-15)


def _mask_with_zero(biased, cfg):
    """The HF / older vLLM variant that masks dropped groups with 0.0 (used to prove the case below bites)."""
    groups = biased.reshape(cfg.n_group, -1)
    score = np.sort(groups, axis=-1)[:, -2:].sum(-1)
    keep = np.argsort(-score, kind="stable")[:cfg.topk_group]
    masked = np.zeros_like(groups)
    masked[keep] = groups[keep]
    return np.argsort(-masked.ravel(), kind="stable")[:cfg.n_experts_per_tok]


def test_dropped_groups_are_masked_with_minus_inf_not_zero():
    # All s = 0.5; biases make every biased score negative. Groups of 2: sums -0.3, -0.7, -1.1, -1.5 -> keep
    # groups 0 and 1, top-3 of [-0.1, -0.2, -0.3, -0.4] = experts 0, 1, 2. Masking with 0.0 would instead
    # pick experts 4, 5, 6 from the dropped groups (0.0 beats every negative kept score).
    cfg = _cfg(n_routed_experts=8, n_experts_per_tok=3, n_group=4, topk_group=2)
    bias = [-0.6, -0.7, -0.8, -0.9, -1.0, -1.1, -1.2, -1.3]
    idx, w = _route_scores([0.0] * 8, bias, cfg)
    assert idx.tolist() == [[0, 1, 2]]
    np.testing.assert_allclose(w, [[1 / 3] * 3], rtol=1e-15)
    assert _mask_with_zero(0.5 + np.array(bias), cfg).tolist() == [4, 5, 6]


def test_group_score_is_sum_of_top_two_not_max():
    # Biased scores [0.9, 0.1 | 0.6, 0.6]: group max prefers group 0, top-2 sum (1.0 < 1.2) group 1;
    # inside group 1 the tie goes to the lower expert index.
    cfg = _cfg(n_experts_per_tok=1, n_group=2, topk_group=1)
    idx, _ = _route_scores([0.0] * 4, [0.4, -0.4, 0.1, 0.1], cfg)
    assert idx.tolist() == [[2]]


def test_ties_go_to_lower_group_and_expert_index():
    cfg = _cfg(n_routed_experts=8, n_experts_per_tok=3, n_group=4, topk_group=2)
    idx, w = _route_scores([0.25] * 8, [0.0] * 8, cfg)
    assert idx.tolist() == [[0, 1, 2]]
    idx, _ = _route_scores([0.25] * 8, [0.0] * 8, dataclasses.replace(cfg, n_group=1, topk_group=1))
    assert idx.tolist() == [[0, 1, 2]]


def test_gate_logits_are_float32_values():
    # float64 logits 1 vs 1 + 1e-9 would pick expert 1; in float32 both are 1.0, a tie -> expert 0.
    x = np.array([[1.0, 1.0]])
    w_gate = np.array([[1.0, 0.0], [1.0, 1e-9]])
    idx, _ = moe.route(x, w_gate, np.zeros(2), _cfg(n_routed_experts=2, n_experts_per_tok=1))
    assert idx.tolist() == [[0]]
    assert moe.gate_logits_fp32(x, w_gate).tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize("seed, n_group", [(30, 1), (31, 4)])
def test_one_group_or_all_groups_kept_equals_plain_topk(seed, n_group):
    # K2 (n_group = topk_group = 1) and "keep every group" must both reduce to a plain top-k on s + b.
    rng = np.random.default_rng(seed)
    cfg = _cfg(n_routed_experts=16, n_experts_per_tok=4, n_group=n_group, topk_group=n_group,
               routed_scaling=2.827)
    x, w_gate, bias = rng.standard_normal((50, 12)), rng.standard_normal((16, 12)), 0.1 * rng.standard_normal(16)
    idx, w = moe.route(x, w_gate, bias, cfg)
    s = moe.sigmoid(moe.gate_logits_fp32(x, w_gate))
    expect = np.argsort(-(s + bias), axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(idx, expect, err_msg=f"seed {seed}")
    sel = np.take_along_axis(s, expect, 1)
    np.testing.assert_allclose(w, 2.827 * sel / sel.sum(1, keepdims=True), rtol=1e-14, err_msg=f"seed {seed}")


def test_group_limited_routing_stays_in_kept_groups():
    seed = 32
    rng = np.random.default_rng(seed)
    cfg = _cfg(n_routed_experts=16, n_experts_per_tok=4, n_group=4, topk_group=2)
    x, w_gate, bias = rng.standard_normal((200, 12)), rng.standard_normal((16, 12)), 0.1 * rng.standard_normal(16)
    idx, w = moe.route(x, w_gate, bias, cfg)
    biased = (moe.sigmoid(moe.gate_logits_fp32(x, w_gate)) + bias).reshape(200, 4, 4)
    group_score = np.sort(biased, -1)[..., -2:].sum(-1)  # [N, 4]
    for n in range(200):
        kept = set(np.argsort(-group_score[n], kind="stable")[:2].tolist())
        assert {int(e) // 4 for e in idx[n]} <= kept, f"seed {seed} token {n}"
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-14)  # routed_scaling 1, normalized
    assert len({tuple(r) for r in idx // 4}) > 1, f"seed {seed}: routing never varied"


def test_bad_group_configs_are_refused():
    with pytest.raises(ValueError, match="groups"):
        moe.route(np.ones((1, 4)), np.eye(4), np.zeros(4), _cfg(n_group=3, topk_group=1))
    with pytest.raises(ValueError, match="top-3"):
        moe.route(np.ones((1, 4)), np.eye(4), np.zeros(4), _cfg(n_experts_per_tok=3, n_group=2, topk_group=1))


def test_swiglu_hand_case():
    # W2 (silu(2) * 3) = 0.5 * 2 * sigmoid(2) * 3
    got = moe.swiglu(np.array([[1.0]]), np.array([[2.0]]), np.array([[0.5]]), np.array([[3.0]]))
    assert got[0, 0] == pytest.approx(3.0 * moe.sigmoid(2.0), rel=1e-15)


def _moe_loop(weights, cfg, layer, x):
    """Per token: evaluate the routed experts one by one, plus the shared expert."""
    p = f"layers.{layer}."
    idx, w = moe.route(x, weights[p + "gate"], weights[p + "gate_bias"], cfg)
    y = np.zeros_like(x)
    for n in range(len(x)):
        for e, we in zip(idx[n], w[n]):
            a = weights[p + "experts.w1"][e] @ x[n]
            y[n] += we * weights[p + "experts.w2"][e] @ (a / (1 + np.exp(-a)) * (weights[p + "experts.w3"][e] @ x[n]))
        a = weights[p + "shared.w1"] @ x[n]
        y[n] += weights[p + "shared.w2"] @ (a / (1 + np.exp(-a)) * (weights[p + "shared.w3"] @ x[n]))
    return y


@pytest.mark.parametrize("name, seed", [("tiny", 33), ("tiny-groups", 34)])
def test_moe_forward_equals_per_token_loop(name, seed):
    cfg = get_preset(name)
    weights = init_weights(cfg, seed)
    x = np.random.default_rng(seed).standard_normal((9, cfg.hidden))
    got, want = moe.moe_forward(weights, cfg, 1, x), _moe_loop(weights, cfg, 1, x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max(), err_msg=f"seed {seed}")


@pytest.mark.parametrize("name, seed", [("tiny", 35), ("tiny-groups", 36)])
def test_init_gate_bias_changes_routing(name, seed):
    cfg = get_preset(name)
    weights = init_weights(cfg, seed)
    x = np.random.default_rng(seed).standard_normal((64, cfg.hidden))
    with_bias, _ = moe.route(x, weights["layers.1.gate"], weights["layers.1.gate_bias"], cfg)
    without, _ = moe.route(x, weights["layers.1.gate"], np.zeros(cfg.n_routed_experts), cfg)
    changed = np.mean(np.any(np.sort(with_bias, 1) != np.sort(without, 1), axis=1))
    assert 0.05 < changed, f"{name} seed {seed}: bias changed routing for only {changed:.0%} of tokens"
