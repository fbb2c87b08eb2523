"""The device chain build (suite/backends/chain_device.py) equals the torch host build with build_chain (the
reference heap) row for row: tokens, links, depths, positions, ancestor bits, node counts, scores; ties in
the argmax go to the smaller token id; per-request budgets below the maximum; 64+ rows (two mask words)."""
from __future__ import annotations

import pytest
import torch

from kdbench.backends import chain_device, torch_ops


def _logits(seed: int, B: int, L: int, V: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, V, generator=g)
    if ties:   # plant an exact tie for the maximum at a higher and a lower id in some rows
        top = x.argmax(-1)
        for b in range(B):
            for d in range(0, L, 2):
                other = int(torch.randint(0, V, (1,), generator=g))
                x[b, d, other] = x[b, d, top[b, d]]
    return x


@pytest.mark.parametrize("seed,B,L,V,max_budget,ties", [(0, 3, 15, 257, 15, True), (1, 2, 15, 64, 9, False),
                                                        (2, 1, 5, 33, 0, True), (3, 2, 70, 40, 70, True)])
def test_equals_the_host_build(seed, B, L, V, max_budget, ties):
    x = _logits(seed, B, L, V, ties)
    g = torch.Generator().manual_seed(seed + 100)
    budgets = torch.randint(0, max_budget + 1, (B,), generator=g, dtype=torch.int32)
    budgets[0] = max_budget
    roots = torch.randint(0, V, (B,), generator=g)
    past = torch.randint(1, 50, (B,), generator=g, dtype=torch.int32)
    want = torch_ops.tree_build(x, budgets, roots, past, max_budget, torch_ops.build_chain)
    got = chain_device.build_chain(x, budgets, roots, past, max_budget)
    for name in ("tokens", "parents", "depths", "positions", "anc", "first_child", "next_sibling", "n_nodes"):
        w, h = getattr(want, name), getattr(got, name)
        assert h.dtype == w.dtype and h.shape == w.shape, (name, h.dtype, w.dtype, h.shape, w.shape)
        assert torch.equal(h, w), f"{name} differs:\n{h}\n{w}"
    assert torch.allclose(got.scores, want.scores, rtol=0, atol=1e-9)
    assert torch.equal(got.scores.isinf(), want.scores.isinf())
    assert got.top_lp.shape == want.top_lp.shape
    assert torch.allclose(got.top_lp.sort(-1).values, want.top_lp.sort(-1).values, atol=1e-6)


def test_pack_bits_sets_bit_63():
    vis = torch.zeros(1, 130, dtype=torch.bool)
    vis[0, [0, 63, 64, 129]] = True
    words = chain_device.pack_bits(vis)
    assert words.shape == (1, 3)
    assert words[0].tolist() == [1 - 2 ** 63, 1, 2]   # bit 63 is the sign bit of an int64 word


def test_budget_above_depth_is_refused():
    with pytest.raises(ValueError, match="depth"):
        chain_device.build_chain(torch.zeros(1, 3, 8), torch.tensor([3], dtype=torch.int32), torch.tensor([1]),
                                 torch.tensor([2], dtype=torch.int32), 4)
