"""The torch stage backend (suite/backends/torch_ops.py) against the numpy references on the same inputs:
tree_build (every policy), tree_accept greedy and sampled, inverse-CDF sampling, kv_compact."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdbench.backends import torch_ops as T
from kdbench.references import kv_compact as ref_kv
from kdbench.references import tree_accept as ref_acc
from kdbench.references import tree_build as ref_tb


TREE_KEYS = ("tokens", "parents", "depths", "first_child", "next_sibling")


def _logits(seed: int, B: int, L: int, V: int, ties: bool = False) -> torch.Tensor:
    x = np.random.default_rng(seed).standard_normal((B, L, V)) * 2.0
    if ties:
        x = np.round(x)  # few distinct values: ties everywhere, also at the top-K cut
    return torch.tensor(x, dtype=torch.float32)


def _assert_tree_equal(tb, b: int, tree: ref_tb.Tree, past: int, what: str) -> None:
    n_rows = tb.tokens.shape[1]
    want = ref_tb.pad_tree_arrays(tree, n_rows)
    for key in TREE_KEYS:
        got = getattr(tb, key)[b].numpy()
        assert (got == want[key]).all(), f"{what}: request {b} {key}\n got {got}\nwant {want[key]}"
    assert (tb.anc[b].numpy().view(np.uint64) == want["bitmask"]).all(), f"{what}: request {b} anc"
    assert int(tb.n_nodes[b]) == tree.size, f"{what}: request {b} n_nodes"
    assert (tb.positions[b].numpy() == past + want["depths"]).all(), f"{what}: request {b} positions"
    np.testing.assert_allclose(tb.scores[b].numpy()[:tree.size], tree.scores, rtol=1e-5, atol=1e-5)


# (seed, B, L, V, budgets, ties): one odd shape, one tie-heavy case, budget 1 and budget > V cases
BUILD_CASES = [
    (0, 3, 4, 16, (5, 8, 1), False),
    (1, 2, 15, 37, (64, 0), False),
    (2, 4, 3, 9, (12, 1, 30, 2), True),      # tie-heavy; budget 30 > V = 9 (K = V)
    (3, 1, 1, 5, (1,), False),               # boundary: depth 1, budget 1
    (4, 2, 3, 40, (6, 3), True),             # tie-heavy with K = 6 < V: ties straddle the top-K cut
]


@pytest.mark.parametrize("seed,B,L,V,budgets,ties", BUILD_CASES)
def test_tree_build_matches_reference(seed, B, L, V, budgets, ties):
    x = _logits(seed, B, L, V, ties)
    max_budget = max(budgets)
    roots = torch.arange(B, dtype=torch.int64) + 3
    past = torch.tensor([7 * b for b in range(B)], dtype=torch.int32)
    tb = T.tree_build(x, torch.tensor(budgets, dtype=torch.int32), roots, past, max_budget)
    assert tb.tokens.shape == (B, max_budget + 1) and tb.anc.shape == (B, max_budget + 1, -(-(max_budget + 1) // 64))
    for b in range(B):
        lp, tok = ref_tb.topk_logprobs(x[b].numpy(), max_budget)
        assert (tb.top_tok[b].numpy() == tok).all(), f"request {b}: top-K token order differs"
        np.testing.assert_allclose(tb.top_lp[b].numpy(), lp, rtol=0, atol=2e-6)
        # the heap on the same float32 log-probs is exact; on float64 log-probs (the reference's own
        # build_tree) it is exact for these inputs (no near-ties within float32 rounding)
        same_in = ref_tb.build_tree_from_topk(tb.top_lp[b].double().numpy()[:, :budgets[b]],
                                              tok[:, :budgets[b]], budgets[b], int(roots[b]))
        _assert_tree_equal(tb, b, same_in, int(past[b]), "same top_lp")
        if not ties:
            _assert_tree_equal(tb, b, ref_tb.build_tree(x[b].numpy(), budgets[b], int(roots[b])), int(past[b]),
                               "reference build_tree")


@pytest.mark.parametrize("policy", ["chain", "width_capped", "static_kary"])
def test_tree_build_policies_match_reference(policy):
    x = _logits(11, 3, 5, 23)
    roots = torch.tensor([1, 2, 3])
    past = torch.zeros(3, dtype=torch.int32)
    if policy == "chain":
        build, budget = T.build_chain, 4
        want = [ref_tb.build_chain(x[b].numpy(), int(roots[b]), 4) for b in range(3)]
    elif policy == "width_capped":
        build, budget = T.width_capped(2), 20
        want = [ref_tb.build_tree_width_capped(x[b].numpy(), 20, int(roots[b]), 2) for b in range(3)]
    else:
        branching = (3, 2, 1, 2)
        build, budget = T.static_kary(branching), T.static_kary_size(branching)
        want = [ref_tb.build_static_kary(x[b].numpy(), int(roots[b]), branching) for b in range(3)]
        assert budget == want[0].size - 1
    tb = T.tree_build(x, torch.full((3,), budget, dtype=torch.int32), roots, past, budget, build)
    for b in range(3):
        _assert_tree_equal(tb, b, want[b], 0, policy)


def test_topk_ties_at_the_cut_take_smaller_ids():
    x = torch.tensor([[[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0, 2.0]]])
    lp, tok = T.topk_logprobs(x, 4)
    assert tok[0, 0].tolist() == [1, 3, 2, 4]  # 3s by id, then the smallest ids among the 2s
    want_lp, want_tok = ref_tb.topk_logprobs(x[0].numpy(), 4)
    assert (tok[0].numpy() == want_tok).all()
    np.testing.assert_allclose(lp[0].numpy(), want_lp, atol=1e-6)


def test_tree_build_rejects_budget_above_max():
    with pytest.raises(ValueError, match="max_budget"):
        T.tree_build(_logits(0, 1, 2, 8), torch.tensor([5], dtype=torch.int32), torch.tensor([0]),
                     torch.tensor([0], dtype=torch.int32), 4)


def _random_trees(seed: int, B: int, L: int, V: int, budget: int):
    x = _logits(seed, B, L, V)
    trees = [ref_tb.build_tree(x[b].numpy(), budget, b) for b in range(B)]
    tb = T.tree_build(x, torch.full((B,), budget, dtype=torch.int32), torch.arange(B), torch.zeros(B, dtype=torch.int32),
                      budget)
    return trees, tb


def _path_targets(rng, tree: ref_tb.Tree, n_rows: int, V: int) -> np.ndarray:
    """Random targets, then force acceptance along the path to a random node (deep walks are exercised)."""
    t = rng.integers(0, V, n_rows)
    node = int(rng.integers(0, tree.size))
    while node > 0:
        t[tree.parents[node]] = tree.tokens[node]
        node = int(tree.parents[node])
    return t


def test_parents_from_lcrs():
    trees, tb = _random_trees(5, 4, 6, 11, 40)
    par = T.parents_from_lcrs(tb.first_child, tb.next_sibling)
    for b, tree in enumerate(trees):
        assert (par[b, :tree.size].numpy() == tree.parents).all()
        assert (par[b, tree.size:] == -1).all(), "padding rows are linked to nobody"


@pytest.mark.parametrize("seed,budget", [(0, 1), (1, 8), (2, 64)])
def test_tree_accept_greedy_matches_reference(seed, budget):
    B, L, V = 5, 6, 7
    trees, tb = _random_trees(seed, B, L, V, budget)
    rng = np.random.default_rng(100 + seed)
    targets = np.stack([_path_targets(rng, tree, budget + 1, V) for tree in trees])
    res = T.tree_accept_greedy(tb.tokens, tb.first_child, tb.next_sibling, tb.n_nodes, torch.tensor(targets), L)
    for b, tree in enumerate(trees):
        acc, bonus = ref_acc.accept_greedy(tree, targets[b, :tree.size])
        got = res.accepted[b].numpy()
        assert (got[:len(acc)] == acc).all() and (got[len(acc):] == -1).all(), f"request {b}: {got} vs {acc}"
        assert int(res.accept_len[b]) == len(acc) and int(res.bonus[b]) == bonus


def test_tree_accept_sampled_matches_reference():
    B, L, V, budget = 4, 5, 6, 24
    trees, tb = _random_trees(7, B, L, V, budget)
    rng = np.random.default_rng(8)
    probs = rng.dirichlet(np.full(V, 0.3), size=(B, budget + 1)).astype(np.float32)
    probs[0, :, 2] = 0.0  # zero-probability tokens are never sampled
    u = rng.random((B, budget + 1))
    res = T.tree_accept_sampled(tb.tokens, tb.first_child, tb.next_sibling, tb.n_nodes, torch.tensor(probs),
                                torch.tensor(u), L)
    for b, tree in enumerate(trees):
        acc, bonus = ref_acc.accept_sampled(tree, probs[b, :tree.size], u[b, :tree.size])
        assert (res.accepted[b, :len(acc)].numpy() == acc).all() and int(res.bonus[b]) == bonus
        assert (res.sampled[b].numpy() == ref_acc.sample_per_node(probs[b], u[b])).all()


def test_sample_inverse_cdf_edges():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 3.0]])
    for u in (0.0, 0.4999999, 0.5, 0.75, 1.0 - 2.0 ** -53):
        got = T.sample_inverse_cdf(p, torch.full((3,), u, dtype=torch.float64))
        want = [ref_acc.sample_inverse_cdf(p[i].numpy(), u) for i in range(3)]
        assert got.tolist() == want, f"u={u}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_kv_compact_matches_reference(dtype):
    layers, B, S, D, A = 2, 4, 40, 5, 6
    rng = np.random.default_rng(3)
    cache = rng.standard_normal((layers, B, S, D))
    past = np.array([3, 0, 17, 9])
    # paths: partial, full chain, root only, frozen (accept_len 0)
    accepted = np.array([[0, 2, 5, -1, -1, -1], [0, 1, 2, 3, 4, 5], [0, -1, -1, -1, -1, -1], [0, 4, -1, -1, -1, -1]])
    accept_len = np.array([3, 6, 1, 0])
    c = torch.tensor(cache).to(dtype)
    cache = c.double().clone().numpy()  # the values the kernel sees (a copy: c changes in place)
    T.kv_compact(c, torch.tensor(past, dtype=torch.int32), torch.tensor(accepted, dtype=torch.int32),
                 torch.tensor(accept_len, dtype=torch.int32))
    for b in range(B):
        want = cache[:, b]
        if accept_len[b] > 0:
            want, _ = ref_kv.compact_kv(cache[:, b], int(past[b]), accepted[b, :accept_len[b]])
        assert (c[:, b].double().numpy() == want).all(), f"request {b}"
