"""Tests of references/kv_compact.py: a hand case, identity, leading (layer) axes, the in-place ascending
copy a kernel may use, and errors on bad `accepted`."""
import numpy as np
import pytest

from kdbench.references.kv_compact import compact_kv


def test_hand_case_worked_example():
    past = 3
    cache = np.arange(12, dtype=np.float64).reshape(12, 1) * np.array([[1.0, -1.0]])  # [S=12, D=2]
    out, new_len = compact_kv(cache, past, [0, 1, 2, 6])  # ddtree.md §2.6 keep list
    assert new_len == 7
    assert out[:, 0].tolist() == [0, 1, 2, 3, 4, 5, 9, 7, 8, 9, 10, 11]  # rows >= 7 left as they were
    assert (out[:, 1] == -out[:, 0]).all()
    assert cache[6, 0] == 6  # the input is not modified


def test_identity_prefix_keep_is_unchanged():
    cache = np.random.default_rng(5000).standard_normal((2, 10, 4))  # seed 5000
    out, new_len = compact_kv(cache, 2, np.arange(5))
    assert new_len == 7 and (out == cache).all() and out is not cache


def test_leading_axes_layers_kv_heads():
    rng = np.random.default_rng(5001)  # seed 5001
    cache = rng.standard_normal((3, 2, 4, 20, 8)).astype(np.float32)  # [layers, k/v, heads, S, D]
    acc = np.array([0, 2, 3, 7])
    out, new_len = compact_kv(cache, 9, acc)
    assert new_len == 13 and out.dtype == np.float32
    for k, a in enumerate(acc):
        assert (out[..., 9 + k, :] == cache[..., 9 + a, :]).all(), f"row {k}"
    assert (out[..., :9, :] == cache[..., :9, :]).all() and (out[..., 13:, :] == cache[..., 13:, :]).all()


def test_in_place_ascending_copy_agrees():
    """accepted[k] >= k, so an in-place copy in ascending k never reads an overwritten row."""
    rng = np.random.default_rng(5002)  # seed 5002
    for trial in range(50):
        n1 = int(rng.integers(1, 12))
        acc = np.sort(rng.choice(np.arange(1, n1), size=int(rng.integers(0, n1)), replace=False)) if n1 > 1 \
            else np.zeros(0, np.int64)
        acc = np.concatenate([[0], acc]).astype(np.int64)
        cache = rng.standard_normal((2, 5 + n1, 3))
        work = cache.copy()
        for k, a in enumerate(acc):
            work[:, 5 + k, :] = work[:, 5 + a, :]
        assert (compact_kv(cache, 5, acc)[0] == work).all(), f"seed 5002 trial {trial} acc {acc}"


@pytest.mark.parametrize("cache_shape, past, accepted, match", [
    ((10, 4), 2, [1, 2], "accepted\\[0\\] must be 0"),
    ((10, 4), 2, [0, 3, 3], "strictly increasing"),
    ((10, 4), 2, [0, 4, 3], "strictly increasing"),
    ((10, 4), 2, [], "non-empty"),
    ((10, 4), 2, [[0, 1]], "1-D"),
    ((10, 4), 2, [0.0, 1.0], "int"),
    ((10, 4), 2, [0, 8], "exceed"),
    ((10, 4), -1, [0, 1], "past_len"),
    ((10,), 0, [0], "\\[..., S, D\\]"),
], ids=["first_not_root", "repeat", "decreasing", "empty", "2d", "float", "out_of_range", "neg_past", "1d_cache"])
def test_bad_input_raises(cache_shape, past, accepted, match):
    with pytest.raises(ValueError, match=match):
        compact_kv(np.zeros(cache_shape), past, np.array(accepted))
