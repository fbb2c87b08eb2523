"""Tests for references/model.py: the weight-name contract, init determinism, prefill/decode consistency,
tree verify against decoding each path, and naive == absorbed attention through the whole model."""
from __future__ import annotations

import numpy as np
import pytest

from kdbench.check import require_rel_l2
from kdbench.references import model as M
from kdbench.references.model_config import get_preset

MODELS = [("tiny", 40), ("tiny-groups", 41)]  # (preset, seed): q_lora 32 / one group; q_lora 0 / 4 groups


def assert_rel_l2(actual, expected, tol: float, what: str) -> None:
    require_rel_l2(actual, expected, tol, what)


def assert_out_rows(out: M.ForwardOut, rows, ref: M.ForwardOut, ref_rows, tol: float, what: str) -> None:
    assert_rel_l2(out.logits[rows], ref.logits[ref_rows], tol, what + " logits")
    assert_rel_l2(out.hidden[rows], ref.hidden[ref_rows], tol, what + " hidden")
    assert_rel_l2(out.layer_outputs[:, rows], ref.layer_outputs[:, ref_rows], tol, what + " layer_outputs")


def _setup(name, seed, n_tokens):
    cfg = get_preset(name)
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, n_tokens)
    return cfg, M.init_weights(cfg, seed), tokens


def test_weight_names_follow_the_contract():
    cfg = get_preset("tiny")  # layer 0 dense, layer 1 MoE, q_lora 32
    w = M.init_weights(cfg, 0)
    attn = ["attn_norm", "ffn_norm", "wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b", "wo"]
    moe = ["gate", "gate_bias"] + [f"{g}.{n}" for g in ("experts", "shared") for n in ("w1", "w2", "w3")]
    expect = {"embed", "norm", "lm_head"} | {f"layers.0.{n}" for n in attn + ["mlp.w1", "mlp.w2", "mlp.w3"]}
    expect |= {f"layers.1.{n}" for n in attn + moe}
    assert set(w) == expect
    d, h, v = 64, 4, 256
    shapes = {"embed": (v, d), "lm_head": (v, d), "layers.0.wq_b": (h * 24, 32), "layers.0.wkv_a": (40, d),
              "layers.0.wkv_b": (h * 32, 32), "layers.0.wo": (d, h * 16), "layers.0.mlp.w2": (d, 128),
              "layers.1.gate": (8, d), "layers.1.experts.w1": (8, 32, d), "layers.1.experts.w2": (8, d, 32),
              "layers.1.shared.w1": (32, d), "layers.1.gate_bias": (8,)}
    assert {k: w[k].shape for k in shapes} == shapes
    assert all(a.dtype == np.float64 for a in w.values())
    wg = M.init_weights(get_preset("tiny-groups"), 0)  # q_lora_rank 0: a direct wq
    assert "layers.2.wq" in wg and wg["layers.2.wq"].shape == (h * 24, d)
    assert not any(k.endswith(("wq_a", "wq_b", "q_norm")) for k in wg)


def test_init_is_deterministic_per_seed():
    cfg = get_preset("tiny")
    a, b, c = M.init_weights(cfg, 7), M.init_weights(cfg, 7), M.init_weights(cfg, 8)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["layers.1.gate_bias"], c["layers.1.gate_bias"])
    norm = a["layers.0.kv_norm"]
    assert np.abs(norm - 1).max() < 0.5 and np.std(norm) > 0.01  # ~1 + noise, not exactly 1


@pytest.mark.parametrize("name, seed", MODELS)
def test_prefill_then_decode_equals_longer_prefill(name, seed):
    cfg, w, tokens = _setup(name, seed, 14)
    full, full_cache = M.prefill(w, cfg, tokens)
    out, cache = M.prefill(w, cfg, tokens[:10])
    assert_out_rows(out, slice(None), full, slice(0, 10), 1e-10, f"{name} seed {seed}: prefix")
    for t in range(10, 14):
        step = M.decode(w, cfg, tokens[t], cache)
        assert_out_rows(step, [0], full, [t], 1e-10, f"{name} seed {seed}: decode step {t}")
    assert cache.length == full_cache.length == 14
    for layer in range(cfg.n_layers):
        assert_rel_l2(cache.c_kv[layer], full_cache.c_kv[layer], 1e-10, f"seed {seed}: c_kv layer {layer}")
        assert_rel_l2(cache.k_pe[layer], full_cache.k_pe[layer], 1e-10, f"seed {seed}: k_pe layer {layer}")


@pytest.mark.parametrize("name, seed", MODELS)
def test_multi_token_extend_mid_sequence_equals_prefill(name, seed):
    # The DeepSeek reference's mask bug case: several causal tokens after a non-empty cache.
    cfg, w, tokens = _setup(name, seed, 12)
    full, _ = M.prefill(w, cfg, tokens)
    _, cache = M.prefill(w, cfg, tokens[:5])
    out = M.forward(w, cfg, tokens[5:], np.arange(5, 12), cache)
    assert_out_rows(out, slice(None), full, slice(5, 12), 1e-10, f"{name} seed {seed}: extend")


def _ancestors(parents):
    anc = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        while p >= 0:
            anc[i, p], p = True, parents[p]
    return anc


@pytest.mark.parametrize("name, seed", MODELS)
def test_tree_verify_row_equals_decoding_its_path(name, seed):
    cfg, w, tokens = _setup(name, seed, 8)
    parents = [-1, 0, 0, 1, 1, 2, 3, 0, 6]  # node 0 = root (bonus token), node 8 at depth 4
    depths = [0, 1, 1, 2, 2, 2, 3, 1, 4]
    tree_tokens = np.random.default_rng(seed + 1000).integers(0, cfg.vocab_size, len(parents))
    _, cache = M.prefill(w, cfg, tokens)
    verify_cache = cache.copy()
    out = M.tree_verify(w, cfg, tree_tokens, depths, _ancestors(parents), verify_cache)
    assert verify_cache.length == 8 + len(parents) and cache.length == 8  # copy() is independent
    for node in range(len(parents)):
        path, p = [], node
        while p >= 0:
            path, p = [p] + path, parents[p]
        path_cache = cache.copy()
        for n in path:
            step = M.decode(w, cfg, tree_tokens[n], path_cache)
        assert_out_rows(out, [node], step, [0], 1e-10, f"{name} seed {seed}: node {node} path {path}")
        last = cfg.n_layers - 1  # the node's cached latent is the one its path writes at depth past + d
        assert_rel_l2(verify_cache.c_kv[last][8 + node], path_cache.c_kv[last][8 + depths[node]], 1e-10,
                      f"seed {seed}: node {node} cached c_kv")


def test_chain_tree_verify_equals_extend():
    name, seed = "tiny", 42
    cfg, w, tokens = _setup(name, seed, 11)
    full, _ = M.prefill(w, cfg, tokens)
    _, cache = M.prefill(w, cfg, tokens[:6])
    out = M.tree_verify(w, cfg, tokens[6:], np.arange(5), np.tril(np.ones((5, 5), bool)), cache)
    assert_out_rows(out, slice(None), full, slice(6, 11), 1e-10, f"{name} seed {seed}: chain verify")


@pytest.mark.parametrize("name, seed", MODELS)
def test_naive_attention_equals_absorbed_through_the_model(name, seed):
    cfg, w, tokens = _setup(name, seed, 9)
    _, cache = M.prefill(w, cfg, tokens[:4])
    visible = _ancestors([-1, 0, 0, 2, 1])
    absorbed = M.forward(w, cfg, tokens[4:], [4, 5, 5, 6, 6], cache.copy(), visible)
    naive = M.forward(w, cfg, tokens[4:], [4, 5, 5, 6, 6], cache.copy(), visible, attention="naive")
    assert_out_rows(naive, slice(None), absorbed, slice(None), 1e-10, f"{name} seed {seed}: naive vs absorbed")


def test_forward_refuses_rows_that_do_not_see_themselves():
    cfg, w, tokens = _setup("tiny", 43, 3)
    _, cache = M.prefill(w, cfg, tokens)
    bad = np.eye(2, dtype=bool)
    bad[1, 1] = False
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        M.forward(w, cfg, [1, 2], [3, 4], cache, bad)
    assert cache.length == 3 and all(len(c) == 3 for c in cache.c_kv)  # nothing appended


def test_cache_length_is_rows_in_every_layer():
    cfg = get_preset("tiny")
    cache = M.LatentCache.empty(cfg)
    cache.append(0, np.zeros((3, 32)), np.zeros((3, 8)))
    assert cache.length == 0  # layer 1 has no rows yet
    cache.append(1, np.zeros((3, 32)), np.zeros((3, 8)))
    assert cache.length == 3
