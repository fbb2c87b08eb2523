"""Tests for references/mla.py: norms, YaRN, RoPE, projections, and naive == absorbed attention."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kdbench.check import require_rel_l2
from kdbench.references import mla
from kdbench.references.model import init_weights
from kdbench.references.model_config import get_preset


def assert_rel_l2(actual, expected, tol: float, what: str) -> None:
    require_rel_l2(actual, expected, tol, what)


def test_rms_norm_hand_case():
    # rms([3, 4]) = sqrt(12.5); w scales each channel.
    got = mla.rms_norm(np.array([3.0, 4.0]), np.array([1.0, 2.0]), 0.0)
    r = math.sqrt(12.5)
    np.testing.assert_allclose(got, [3.0 / r, 8.0 / r], rtol=1e-15)


@pytest.mark.parametrize("name, expected", [("kimi-k2", 0.130861), ("deepseek-v3", 0.135234)])
def test_softmax_scale_matches_formula(name, expected):
    cfg = get_preset(name)
    m = 1.0 + 0.1 * cfg.mscale_all_dim * math.log(cfg.rope_factor)
    assert cfg.softmax_scale == pytest.approx(m * m / math.sqrt(128 + 64), rel=1e-15)
    assert cfg.softmax_scale == pytest.approx(expected, abs=5e-7), f"{name}: {cfg.softmax_scale}"


@pytest.mark.parametrize("name, low, high", [("deepseek-v3", 10, 23), ("kimi-k2", 19, 20)])
def test_yarn_correction_range(name, low, high):
    assert mla.yarn_correction_range(get_preset(name)) == (low, high)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "tiny-groups"])
def test_yarn_inv_freq_keeps_high_and_divides_low_frequencies(name):
    cfg = get_preset(name)
    dr, (low, high) = cfg.qk_rope_dim, mla.yarn_correction_range(cfg)
    base = cfg.rope_theta ** (-np.arange(0, dr, 2) / dr)
    got = mla.yarn_inv_freq(cfg)
    np.testing.assert_allclose(got[:low + 1], base[:low + 1], rtol=1e-15)  # ramp 0 up to and at `low`
    np.testing.assert_allclose(got[high:], base[high:] / cfg.rope_factor, rtol=1e-15)  # ramp 1 from `high`
    mid = np.arange(low + 1, min(high, dr // 2))
    assert np.all((got[mid] < base[mid]) & (got[mid] > base[mid] / cfg.rope_factor))


def test_no_yarn_gives_plain_frequencies():
    cfg = dataclasses.replace(get_preset("tiny"), rope_factor=1.0)
    np.testing.assert_allclose(mla.yarn_inv_freq(cfg), 50000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-15)


def test_unsupported_mscale_ratio_is_refused():
    with pytest.raises(ValueError, match="mscale"):
        mla.yarn_inv_freq(dataclasses.replace(get_preset("tiny"), mscale=0.707))


def test_rope_rotates_adjacent_pairs():
    # Pair 0 turns by 90 degrees at position 1, pair 1 (frequency 0) stays: (x0, x1) -> (-x1, x0).
    got = mla.rope_interleaved(np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([1]), np.array([math.pi / 2, 0.0]))
    np.testing.assert_allclose(got, [[-2.0, 1.0, 3.0, 4.0]], atol=1e-15)


def test_rope_scores_depend_only_on_relative_position():
    seed = 3
    rng = np.random.default_rng(seed)
    inv = mla.yarn_inv_freq(get_preset("kimi-k2"))
    q, k = rng.standard_normal((2, 64))
    s1 = mla.rope_interleaved(q, 1000, inv) @ mla.rope_interleaved(k, 993, inv)
    s2 = mla.rope_interleaved(q, 7, inv) @ mla.rope_interleaved(k, 0, inv)
    assert s1 == pytest.approx(s2, rel=1e-9), f"seed {seed}"
    assert np.linalg.norm(mla.rope_interleaved(q, 12345, inv)) == pytest.approx(np.linalg.norm(q), rel=1e-14)


def test_rope_broadcasts_positions_over_heads():
    seed = 4
    x = np.random.default_rng(seed).standard_normal((3, 2, 8))  # [T, H, dr]
    inv, pos = mla.yarn_inv_freq(get_preset("tiny")), np.array([0, 5, 9])
    got = mla.rope_interleaved(x, pos, inv)
    for t in range(3):
        for h in range(2):
            np.testing.assert_allclose(got[t, h], mla.rope_interleaved(x[t, h], pos[t], inv), rtol=1e-15)


def test_project_without_q_lora_uses_wq_directly():
    seed = 5
    cfg = get_preset("tiny-groups")  # q_lora_rank 0
    w = init_weights(cfg, seed)
    assert "layers.0.wq" in w and "layers.0.wq_a" not in w
    h = np.random.default_rng(seed).standard_normal((4, cfg.hidden))
    pos = np.array([0, 3, 4, 9])
    got = mla.mla_project(w, cfg, 0, h, pos)
    head, hd = 2, cfg.qk_head_dim
    q_head = h @ w["layers.0.wq"][head * hd:(head + 1) * hd].T  # [T, dn+dr] by hand for one head
    inv = mla.yarn_inv_freq(cfg)
    np.testing.assert_allclose(got["q_nope"][:, head], q_head[:, :cfg.qk_nope_dim], rtol=1e-13)
    np.testing.assert_allclose(got["q_pe"][:, head], mla.rope_interleaved(q_head[:, cfg.qk_nope_dim:], pos, inv),
                               rtol=1e-12, atol=1e-14)
    kv = h @ w["layers.0.wkv_a"].T
    np.testing.assert_allclose(got["c_kv"], mla.rms_norm(kv[:, :32], w["layers.0.kv_norm"], cfg.rms_eps), rtol=1e-13)
    np.testing.assert_allclose(got["k_pe"], mla.rope_interleaved(kv[:, 32:], pos, inv), rtol=1e-12, atol=1e-14)


def _random_attention_case(cfg, seed, t=5, past=6, layer=1):
    """Projected q/k of random hidden states; the keys are the past rows followed by the T new rows."""
    rng = np.random.default_rng(seed)
    w = init_weights(cfg, seed)
    h = rng.standard_normal((past + t, cfg.hidden))
    proj = mla.mla_project(w, cfg, layer, h, np.arange(past + t))
    q_nope, q_pe = proj["q_nope"][past:], proj["q_pe"][past:]  # [T, H, dn], [T, H, dr]
    visible = np.concatenate([np.ones((t, past), bool), np.tril(np.ones((t, t), bool))], axis=1)
    visible &= rng.random(visible.shape) < 0.8  # knock out some keys: mask handling, not just causal
    visible[:, past:] |= np.eye(t, dtype=bool)
    return w, q_nope, q_pe, proj["c_kv"], proj["k_pe"], visible


@pytest.mark.parametrize("name, heads, seed", [("tiny", 4, 10), ("tiny-groups", 4, 11), ("tiny", 7, 12)])
def test_naive_equals_absorbed(name, heads, seed):
    cfg = dataclasses.replace(get_preset(name), n_heads=heads)
    w, q_nope, q_pe, c_kv, k_pe, visible = _random_attention_case(cfg, seed)
    o, lse = mla.attention_naive(q_nope, q_pe, c_kv, k_pe, w["layers.1.wkv_b"], cfg, visible)
    q_lat = mla.absorb_q(w, cfg, 1, q_nope)
    o_lat, lse_abs = mla.attention_absorbed(q_lat, q_pe, c_kv, k_pe, visible, cfg.softmax_scale)
    _, w_uv = mla.split_wkv_b(w, cfg, 1)
    assert_rel_l2(np.einsum("thc,hvc->thv", o_lat, w_uv), o, 1e-10, f"{name} H={heads} seed {seed}: o")
    assert_rel_l2(lse_abs, lse, 1e-10, f"{name} H={heads} seed {seed}: lse")
    assert_rel_l2(mla.mla_output(w, cfg, 1, o_lat), mla.heads_output(w, 1, o), 1e-10, f"seed {seed}: output")


def _loop_attention(q_lat, q_pe, c_kv, k_pe, visible, scale):
    """Independent per-row, per-head softmax over the visible keys only."""
    t, n_heads = q_lat.shape[:2]
    o, lse = np.zeros_like(q_lat), np.full((t, n_heads), -np.inf)
    for i in range(t):
        cols = np.flatnonzero(visible[i])
        for h in range(n_heads):
            if len(cols) == 0:
                continue
            s = scale * np.array([q_lat[i, h] @ c_kv[j] + q_pe[i, h] @ k_pe[j] for j in cols])
            lse[i, h] = s.max() + math.log(np.exp(s - s.max()).sum())
            o[i, h] = np.exp(s - lse[i, h]) @ c_kv[cols]
    return o, lse


def test_absorbed_matches_per_row_loop():
    seed = 13
    cfg = get_preset("tiny")
    w, q_nope, q_pe, c_kv, k_pe, visible = _random_attention_case(cfg, seed)
    q_lat = mla.absorb_q(w, cfg, 1, q_nope)
    o, lse = mla.attention_absorbed(q_lat, q_pe, c_kv, k_pe, visible, cfg.softmax_scale)
    o_ref, lse_ref = _loop_attention(q_lat, q_pe, c_kv, k_pe, visible, cfg.softmax_scale)
    assert_rel_l2(o, o_ref, 1e-12, f"seed {seed}: o_lat")
    assert_rel_l2(lse, lse_ref, 1e-12, f"seed {seed}: lse")


def test_absorbed_q_dot_latent_equals_naive_key_dot():
    seed = 14
    cfg = get_preset("tiny")
    w, q_nope, _, c_kv, _, _ = _random_attention_case(cfg, seed)
    w_uk, _ = mla.split_wkv_b(w, cfg, 1)
    naive = np.einsum("thn,shn->ths", q_nope, np.einsum("sc,hnc->shn", c_kv, w_uk))
    absorbed = np.einsum("thc,sc->ths", mla.absorb_q(w, cfg, 1, q_nope), c_kv)
    assert_rel_l2(absorbed, naive, 1e-12, f"seed {seed}")


def test_empty_rows_and_nan_in_unseen_keys():
    # Row 1 sees nothing -> o 0, lse -inf; key 2 is NaN and seen by nobody -> must not leak.
    seed = 15
    rng = np.random.default_rng(seed)
    q_lat, q_pe = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 4))
    c_kv, k_pe = rng.standard_normal((3, 8)), rng.standard_normal((3, 4))
    c_kv[2], k_pe[2] = np.nan, np.nan
    visible = np.array([[True, True, False], [False, False, False]])
    with np.errstate(all="raise"):
        o, lse = mla.attention_absorbed(q_lat, q_pe, c_kv, k_pe, visible, 0.3)
    assert np.all(o[1] == 0.0) and np.all(lse[1] == -np.inf), f"seed {seed}"
    o_ref, lse_ref = _loop_attention(q_lat, q_pe, c_kv, k_pe, visible, 0.3)
    assert_rel_l2(o[0], o_ref[0], 1e-13, f"seed {seed}: seen row")
    assert_rel_l2(lse[0], lse_ref[0], 1e-13, f"seed {seed}: seen row lse")
