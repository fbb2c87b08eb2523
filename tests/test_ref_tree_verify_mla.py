"""Tests for references/tree_verify_mla.py: chain == causal, padding rows, NaN hygiene, bit packing, batch."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from kdbench.check import require_rel_l2
from kdbench.references import mla, tree_build
from kdbench.references.model import init_weights, prefill
from kdbench.references.model_config import get_preset
from kdbench.references.tree_verify_mla import (pack_anc_bits, tree_verify_mla, tree_verify_mla_batch,
                                                 unpack_anc_bits)

SCALE = 0.130861  # Kimi K2's softmax scale; any positive value works


def assert_rel_l2(actual, expected, tol: float, what: str) -> None:
    require_rel_l2(actual, expected, tol, what)


def _case(seed, t, n_heads, past, dc=32, dr=8, extra=3):
    """Random q [T, H, dc+dr] and kv [past + T + extra, dc+dr] whose rows beyond past + T are NaN."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, n_heads, dc + dr))
    kv = rng.standard_normal((past + t + extra, dc + dr))
    kv[past + t:] = np.nan
    return q, kv


def _loop_reference(q, kv, visible_cols, scale, dc):
    """Per row and head: softmax over an explicit column list (the rows' visible keys), value = kv[:, :dc]."""
    t, n_heads = q.shape[:2]
    o, lse = np.zeros((t, n_heads, dc)), np.full((t, n_heads), -np.inf)
    for i in range(t):
        cols = visible_cols[i]
        for h in range(n_heads):
            if cols:
                s = scale * (kv[cols] @ q[i, h])
                lse[i, h] = s.max() + math.log(np.exp(s - s.max()).sum())
                o[i, h] = np.exp(s - lse[i, h]) @ kv[cols, :dc]
    return o, lse


def _tree_anc(parents):
    """Ancestor-or-self matrix [T, T] from a parent list (-1 = root)."""
    anc = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        while p >= 0:
            anc[i, p], p = True, parents[p]
    return anc


@pytest.mark.parametrize("seed, t, n_heads, past", [(20, 7, 3, 5), (21, 1, 2, 0), (22, 5, 4, 65)])
def test_chain_tree_equals_causal_attention(seed, t, n_heads, past):
    q, kv = _case(seed, t, n_heads, past)
    o, lse = tree_verify_mla(q, kv, past, np.tril(np.ones((t, t), bool)), SCALE, kv_lora_rank=32)
    causal = [list(range(past + i + 1)) for i in range(t)]  # row i sees keys 0 .. past + i
    o_ref, lse_ref = _loop_reference(q, kv, causal, SCALE, 32)
    assert_rel_l2(o, o_ref, 1e-12, f"seed {seed}: o_lat")
    assert_rel_l2(lse, lse_ref, 1e-12, f"seed {seed}: lse")


def test_bushy_tree_sees_prefix_and_ancestors_only():
    seed, past = 23, 4
    parents = [-1, 0, 0, 1, 1, 2, 5, 0]
    q, kv = _case(seed, len(parents), 2, past)
    anc = _tree_anc(parents)
    o, lse = tree_verify_mla(q, kv, past, anc, SCALE, kv_lora_rank=32)
    cols = [list(range(past)) + [past + j for j in np.flatnonzero(anc[i])] for i in range(len(parents))]
    o_ref, lse_ref = _loop_reference(q, kv, cols, SCALE, 32)
    assert_rel_l2(o, o_ref, 1e-12, f"seed {seed}: o_lat")
    assert_rel_l2(lse, lse_ref, 1e-12, f"seed {seed}: lse")


def test_padding_row_gives_zero_and_minus_inf_without_warnings():
    seed, past = 24, 6
    parents = [-1, 0, 1, 0]
    anc = _tree_anc(parents)
    anc = np.insert(np.insert(anc, 2, False, axis=0), 2, False, axis=1)  # row/column 2 = padding
    q, kv = _case(seed, 5, 3, past)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        o, lse = tree_verify_mla(q, kv, past, anc, SCALE, kv_lora_rank=32)
    assert np.all(o[2] == 0.0) and np.all(lse[2] == -np.inf), f"seed {seed}: padding row"
    real = [0, 1, 3, 4]
    cols = [list(range(past)) + [past + j for j in np.flatnonzero(anc[i])] for i in real]
    o_ref, lse_ref = _loop_reference(q[real], kv, cols, SCALE, 32)
    assert_rel_l2(o[real], o_ref, 1e-12, f"seed {seed}: real rows")
    assert_rel_l2(lse[real], lse_ref, 1e-12, f"seed {seed}: real rows lse")


def test_nan_beyond_tree_rows_never_leaks():
    seed, past, t = 25, 9, 6
    q, kv_nan = _case(seed, t, 4, past, extra=40)
    kv_zero = np.nan_to_num(kv_nan, nan=0.0)
    anc = _tree_anc([-1, 0, 0, 2, 2, 1])
    with np.errstate(all="raise"):
        o, lse = tree_verify_mla(q, kv_nan, past, anc, SCALE, kv_lora_rank=32)
    o_zero, lse_zero = tree_verify_mla(q, kv_zero, past, anc, SCALE, kv_lora_rank=32)
    assert np.isfinite(o).all() and np.isfinite(lse).all(), f"seed {seed}: NaN leaked"
    np.testing.assert_array_equal(o, o_zero, err_msg=f"seed {seed}")
    np.testing.assert_array_equal(lse, lse_zero, err_msg=f"seed {seed}")


def test_lse_is_natural_log_of_scaled_scores():
    # One visible key: lse = scale * q.k exactly, o = that key's latent.
    q, kv = np.array([[[1.0, 2.0, 0.5]]]), np.array([[3.0, -1.0, 2.0]])
    o, lse = tree_verify_mla(q, kv, 0, np.ones((1, 1), bool), 0.25, kv_lora_rank=2)
    assert lse[0, 0] == pytest.approx(0.25 * (3.0 - 2.0 + 1.0))
    np.testing.assert_array_equal(o[0, 0], [3.0, -1.0])


def test_default_width_is_576_with_512_latent():
    seed = 26
    q, kv = _case(seed, 3, 2, 2, dc=512, dr=64)
    o, lse = tree_verify_mla(q, kv, 2, np.tril(np.ones((3, 3), bool)), SCALE)
    o_ref, lse_ref = _loop_reference(q, kv, [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]], SCALE, 512)
    assert o.shape == (3, 2, 512)
    assert_rel_l2(o, o_ref, 1e-12, f"seed {seed}: o_lat")
    assert_rel_l2(lse, lse_ref, 1e-12, f"seed {seed}: lse")


def test_pack_bits_layout_and_round_trip():
    seed, t = 27, 70  # odd size spanning two words
    anc = np.random.default_rng(seed).random((2, t, t)) < 0.3
    bits = pack_anc_bits(anc)
    assert bits.shape == (2, t, 2) and bits.dtype == np.uint64
    np.testing.assert_array_equal(unpack_anc_bits(bits, t), anc, err_msg=f"seed {seed}")
    np.testing.assert_array_equal(unpack_anc_bits(bits.view(np.int64), t), anc)  # torch stores int64
    one = np.zeros((1, 70), bool)
    one[0, 65] = True  # column 65 -> word 1, bit 1
    assert pack_anc_bits(one).tolist() == [[0, 2]]
    one[0, 63] = True  # bit 63 is the sign bit of an int64 view
    assert pack_anc_bits(one).tolist() == [[1 << 63, 2]]


def test_unpack_rejects_too_few_words():
    with pytest.raises(ValueError, match="too few"):
        unpack_anc_bits(np.zeros((65, 1), np.uint64), 65)


def test_batch_equals_per_sequence():
    seed, t, n_heads, s = 28, 70, 3, 160
    rng = np.random.default_rng(seed)
    past_lens = np.array([0, 13, 64 + 26])
    q = rng.standard_normal((3, t, n_heads, 40))
    kv = rng.standard_normal((3, s, 40))
    anc = np.stack([_tree_anc([-1] + [int(rng.integers(0, i)) for i in range(1, t)]) for _ in range(3)])
    anc[1, t - 3:] = False  # trailing padding rows in sequence 1
    for b, past in enumerate(past_lens):
        kv[b, past + t:] = np.nan
    o, lse = tree_verify_mla_batch(q, kv, past_lens, pack_anc_bits(anc), SCALE, kv_lora_rank=32)
    assert o.shape == (3, t, n_heads, 32) and lse.shape == (3, t, n_heads)
    for b, past in enumerate(past_lens):
        o_b, lse_b = tree_verify_mla(q[b], kv[b], int(past), anc[b], SCALE, kv_lora_rank=32)
        np.testing.assert_array_equal(o[b], o_b, err_msg=f"seed {seed} batch {b}")
        np.testing.assert_array_equal(lse[b], lse_b, err_msg=f"seed {seed} batch {b}")
    assert np.all(lse[1, t - 3:] == -np.inf) and np.isfinite(lse[[0, 2]]).all()


def test_bits_match_tree_build_layout():
    # The same packing as tree_build.ancestor_bitmask / pad_tree_arrays (the tree stage's output).
    seed = 29
    logits = np.random.default_rng(seed).standard_normal((6, 20))
    tree = tree_build.build_tree(logits, 70, root_token=3)  # 71 rows: two mask words
    vis = tree_build.visibility(tree)
    np.testing.assert_array_equal(pack_anc_bits(vis), tree_build.ancestor_bitmask(tree), err_msg=f"seed {seed}")
    padded = tree_build.pad_tree_arrays(tree, 80)
    np.testing.assert_array_equal(pack_anc_bits(padded["visibility"]), padded["bitmask"])


def test_kernel_inputs_from_a_model_layer_reproduce_its_attention():
    # Build q = [q_lat | q_pe] and kv = [c_kv | k_pe] as the engine will, then compare with the model's
    # absorbed attention over the same cache (prefix + tree rows written before attending).
    name, seed, layer = "tiny", 30, 1
    cfg = get_preset(name)
    w = init_weights(cfg, seed)
    rng = np.random.default_rng(seed)
    _, cache = prefill(w, cfg, rng.integers(0, cfg.vocab_size, 11))
    parents, depths = [-1, 0, 0, 1, 2], np.array([0, 1, 1, 2, 2])
    proj = mla.mla_project(w, cfg, layer, rng.standard_normal((5, cfg.hidden)), 11 + depths)
    c_kv = np.concatenate([cache.c_kv[layer], proj["c_kv"]])  # [16, dc]
    k_pe = np.concatenate([cache.k_pe[layer], proj["k_pe"]])  # [16, dr]
    q_lat = mla.absorb_q(w, cfg, layer, proj["q_nope"])
    anc = _tree_anc(parents)
    visible = np.concatenate([np.ones((5, 11), bool), anc], axis=1)
    want = mla.attention_absorbed(q_lat, proj["q_pe"], c_kv, k_pe, visible, cfg.softmax_scale)
    q = np.concatenate([q_lat, proj["q_pe"]], axis=-1)  # [T, H, dc+dr]
    kv = np.concatenate([np.concatenate([c_kv, k_pe], axis=-1), np.full((4, cfg.kv_dim), np.nan)])
    got = tree_verify_mla(q, kv, 11, anc, cfg.softmax_scale, kv_lora_rank=cfg.kv_lora_rank)
    assert_rel_l2(got[0], want[0], 1e-13, f"{name} seed {seed}: o_lat")
    assert_rel_l2(got[1], want[1], 1e-13, f"{name} seed {seed}: lse")
