"""Tests of references/tree_build.py: the ddtree.md §2.6 worked example, brute-force equality on random
tie-free and tie-heavy cases, structural invariants, boundaries, tie rules, variants and layouts."""
import numpy as np
import pytest

from kdbench.references.tree_build import (
    Tree, ancestor_bitmask, brute_force_top_prefixes, build_chain, build_static_kary, build_tree,
    build_tree_batch, build_tree_from_topk, build_tree_width_capped, first_child_next_sibling,
    pad_tree_arrays, positions, prefix_ranks, topk_logprobs, visibility,
)

NEG = -1e4  # "impossible" logit: exp(NEG - 0) underflows to exactly 0 in float64


def worked_logits(V=40):
    """ddtree.md §2.6: q1=[.6,.3,.1] on tokens 10..12, q2=[.7,.2,.1] on 20..22, q3=[.55,.35,.1] on 30..32."""
    x = np.full((3, V), NEG)
    for d, (toks, q) in enumerate([((10, 11, 12), (.6, .3, .1)), ((20, 21, 22), (.7, .2, .1)),
                                   ((30, 31, 32), (.55, .35, .1))]):
        x[d, list(toks)] = np.log(q)
    return x


def check_invariants(tree: Tree, top_lp, top_tok, msg=""):
    """ddtree.md §2.5 plus the field conventions; top_lp/top_tok must cover the tree's ranks."""
    assert (tree.parents[0], tree.depths[0], tree.ranks[0], tree.scores[0]) == (-1, 0, -1, 0.0), msg
    idx = np.arange(1, tree.size)
    assert (tree.parents[1:] < idx).all(), msg
    assert (tree.depths[1:] == tree.depths[tree.parents[1:]] + 1).all(), msg
    assert (np.diff(tree.scores[1:]) <= 0).all(), f"pop scores increase {msg}"
    assert (tree.tokens[1:] == top_tok[tree.depths[1:] - 1, tree.ranks[1:]]).all(), msg
    np.testing.assert_allclose(tree.scores[1:], tree.scores[tree.parents[1:]]
                               + top_lp[tree.depths[1:] - 1, tree.ranks[1:]], rtol=0, atol=1e-9, err_msg=msg)
    for u in range(tree.size):  # children in index order have ranks 0..m-1
        kids = np.flatnonzero(tree.parents == u)
        assert (tree.ranks[kids] == np.arange(len(kids))).all(), f"children of {u} not a rank prefix {msg}"


# --------------------------------------------------------------------------------------- worked example

def test_worked_example_exact():
    tree = build_tree(worked_logits(), budget=6, root_token=7)
    assert tree.tokens.tolist() == [7, 10, 20, 11, 30, 20, 31]
    assert tree.parents.tolist() == [-1, 0, 1, 0, 2, 3, 2]
    assert tree.depths.tolist() == [0, 1, 2, 1, 3, 2, 3]
    assert tree.ranks.tolist() == [-1, 0, 0, 1, 0, 0, 1]
    np.testing.assert_allclose(np.exp(tree.scores), [1, .6, .42, .3, .231, .21, .147], rtol=1e-12, atol=0)
    np.testing.assert_allclose(np.exp(tree.scores[1:]).sum(), 1.908, rtol=1e-12)
    rows = ["1000000", "1100000", "1110000", "1001000", "1110100", "1001010", "1110001"]
    assert ["".join(str(int(v)) for v in r) for r in visibility(tree)] == rows
    assert positions(tree, past_len=100).tolist() == [100, 101, 102, 101, 103, 102, 103]
    first, nxt = first_child_next_sibling(tree)
    assert first.tolist() == [1, 2, 4, 5, -1, -1, -1]
    assert nxt.tolist() == [-1, 3, -1, -1, 6, -1, -1]
    assert ancestor_bitmask(tree)[:, 0].tolist() == [int(r[::-1], 2) for r in rows]  # bit j = column j


def test_worked_example_from_topk_k3_and_lse_is_full_vocab():
    top_lp, top_tok = topk_logprobs(worked_logits(), 3)
    assert top_tok.tolist() == [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    tree = build_tree_from_topk(top_lp, top_tok, budget=6, root_token=7)
    assert tree.tokens.tolist() == [7, 10, 20, 11, 30, 20, 31]
    shifted = worked_logits() + np.array([[0.0], [3.0], [-2.0]])  # log-softmax is shift invariant
    np.testing.assert_allclose(topk_logprobs(shifted, 3)[0], top_lp, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------ brute force, invariants

def tie_free_case(seed):
    rng = np.random.default_rng(seed)
    L, V = int(rng.integers(1, 5)), int(rng.integers(2, 6))
    n_all = sum(V ** d for d in range(1, L + 1))
    return rng.standard_normal((L, V)) * rng.uniform(0.3, 3.0), int(rng.integers(0, n_all + 3))


@pytest.mark.parametrize("seed", range(300), ids=lambda s: f"seed{s}")
def test_random_tie_free_equals_brute_force(seed):
    logits, budget = tie_free_case(seed)
    full_lp, full_tok = topk_logprobs(logits, logits.shape[1])  # brute force over the FULL vocabulary
    scores = np.sort([sum(full_lp[i, r] for i, r in enumerate(p))
                      for p in brute_force_top_prefixes(full_lp, 10 ** 6)])
    assert np.diff(scores).min() > 1e-9, f"seed {seed}: case is not tie-free"
    tree = build_tree(logits, budget, root_token=0)
    expected = brute_force_top_prefixes(full_lp, budget)
    assert prefix_ranks(tree)[1:] == expected, f"seed {seed}, budget {budget}"  # same set, same order
    check_invariants(tree, full_lp, full_tok, f"seed {seed}")


@pytest.mark.parametrize("seed", range(40), ids=lambda s: f"seed{s}")
def test_tie_heavy_integer_logprobs_equal_brute_force(seed):
    """Integer log-probs make every sum exact, so exact ties everywhere: (-score, rank tuple) order."""
    rng = np.random.default_rng(1000 + seed)
    L, K = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    top_lp = -np.sort(rng.integers(0, 3, size=(L, K)), axis=1).astype(np.float64)  # rows descending
    top_tok = np.tile(np.arange(K), (L, 1))
    budget = int(rng.integers(0, sum(K ** d for d in range(1, L + 1)) + 2))
    tree = build_tree_from_topk(top_lp, top_tok, budget, root_token=0)
    assert prefix_ranks(tree)[1:] == brute_force_top_prefixes(top_lp, budget), f"seed {1000 + seed}"


@pytest.mark.parametrize("seed", range(12), ids=lambda s: f"seed{2000 + s}")
def test_invariants_large(seed):
    rng = np.random.default_rng(2000 + seed)
    logits = (rng.standard_normal((15, 300)) * 2.0).astype(np.float32)  # float32 like a real drafter
    budget = [1, 16, 64, 200][seed % 4]
    top_lp, top_tok = topk_logprobs(logits, max(budget, 3))  # wide enough for the variants below
    tree = build_tree(logits, budget, root_token=5)
    assert tree.size == budget + 1, f"seed {2000 + seed}"
    check_invariants(tree, top_lp, top_tok, f"seed {2000 + seed}")
    for t in (build_chain(logits, 5), build_tree_width_capped(logits, budget, 5, 3),
              build_static_kary(logits, 5, (3, 2, 1, 1))):
        check_invariants(t, top_lp, top_tok, f"variant, seed {2000 + seed}")


# ------------------------------------------------------------------------------------------- boundaries

def test_budget_at_least_all_prefixes_gives_all():
    logits = np.random.default_rng(3000).standard_normal((3, 3))  # seed 3000
    tree = build_tree(logits, budget=100, root_token=0)
    assert tree.size == 1 + 3 + 9 + 27
    assert sorted(prefix_ranks(tree)) == sorted(prefix_ranks(build_static_kary(logits, 0, (3, 3, 3))))


def test_vocab_smaller_than_budget():
    logits = np.random.default_rng(3001).standard_normal((2, 3))  # seed 3001
    assert topk_logprobs(logits, 10)[0].shape == (2, 3)
    tree = build_tree(logits, budget=10, root_token=0)
    assert tree.size == 11
    assert prefix_ranks(tree)[1:] == brute_force_top_prefixes(topk_logprobs(logits, 3)[0], 10)


def test_depth_one():
    logits = np.array([[0.5, 2.0, -1.0, 1.0]])
    tree = build_tree(logits, budget=3, root_token=9)
    assert tree.tokens.tolist() == [9, 1, 3, 0] and tree.parents.tolist() == [-1, 0, 0, 0]
    assert tree.ranks.tolist() == [-1, 0, 1, 2]


@pytest.mark.parametrize("logits", [np.zeros((4, 6)), np.zeros((0, 6))], ids=["budget0", "L0"])
def test_root_only(logits):
    tree = build_tree(logits, budget=0 if len(logits) else 5, root_token=3)
    assert tree.size == 1 and tree.tokens.tolist() == [3] and tree.parents.tolist() == [-1]
    assert visibility(tree).tolist() == [[True]] and positions(tree, 7).tolist() == [7]
    assert [a.tolist() for a in first_child_next_sibling(tree)] == [[-1], [-1]]
    assert ancestor_bitmask(tree).tolist() == [[1]]


def test_zero_probability_tokens_never_enter():
    logits = np.array([[0.0, -np.inf, 1.0, -np.inf], [-np.inf, 2.0, -np.inf, 0.5]])
    tree = build_tree(logits, budget=50, root_token=0)
    assert tree.size == 1 + 2 + 4 and np.isfinite(tree.scores).all()
    assert set(tree.tokens[tree.depths == 1]) == {0, 2} and set(tree.tokens[tree.depths == 2]) == {1, 3}


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="budget"):
        build_tree(np.zeros((2, 3)), -1, 0)
    with pytest.raises(ValueError, match="NaN"):
        topk_logprobs(np.array([[0.0, np.nan]]), 1)
    with pytest.raises(ValueError, match="sorted descending"):
        build_tree_from_topk(np.array([[-2.0, -1.0]]), np.array([[0, 1]]), 2, 0)
    with pytest.raises(ValueError, match="<= 0"):
        build_tree_from_topk(np.array([[0.5, -1.0]]), np.array([[0, 1]]), 2, 0)


# ---------------------------------------------------------------------------------------------- ties

def test_exact_score_tie_smaller_rank_tuple_first():
    top_lp = np.array([[-1.0, -2.0, -2.0], [-1.0, -3.0, -4.0]])  # (1,), (2,), (0,0) all score -2
    tree = build_tree_from_topk(top_lp, np.array([[10, 11, 12], [20, 21, 22]]), 4, 0)
    assert prefix_ranks(tree)[1:] == [(0,), (0, 0), (1,), (2,)]
    uniform = build_tree(np.zeros((2, 2)), 6, 0)  # every log-prob is -log 2 exactly
    assert prefix_ranks(uniform)[1:] == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


def test_equal_logits_smaller_token_first():
    _, tok = topk_logprobs(np.array([[1.0, 3.0, 0.0, 3.0, 3.0, 2.0]], dtype=np.float16), 4)
    assert tok.tolist() == [[1, 3, 4, 5]]
    _, tok = topk_logprobs(np.array([[5.0, 1.0, 1.0, 1.0, 0.0]]), 2)  # a tie straddles the cut
    assert tok.tolist() == [[0, 1]]
    assert build_chain(np.array([[0.0, 2.0, 2.0]]), 0).tokens.tolist() == [0, 1]


def test_topk_logprobs_matches_full_log_softmax_any_dtype():
    rng = np.random.default_rng(3002)  # seed 3002
    for dtype in (np.float16, np.float32, np.float64):
        x = (rng.standard_normal((5, 37)) * 4).astype(dtype)
        lp, tok = topk_logprobs(x, 7)
        x64 = x.astype(np.float64)
        ref = x64 - np.log(np.exp(x64).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(lp, np.take_along_axis(ref, tok, 1), rtol=0, atol=1e-12, err_msg=str(dtype))
        assert (np.sort(ref, axis=1)[:, ::-1][:, :7] == np.take_along_axis(ref, tok, 1)).all()
        assert lp.dtype == np.float64 and tok.dtype == np.int64


# ------------------------------------------------------------------------------------------- variants

def test_chain_is_argmax_path():
    logits = np.random.default_rng(3003).standard_normal((6, 11))  # seed 3003
    chain = build_chain(logits, root_token=4)
    assert chain.tokens.tolist() == [4, *np.argmax(logits, axis=1).tolist()]
    assert chain.parents.tolist() == [-1, 0, 1, 2, 3, 4, 5]
    assert build_chain(logits, 4, length=2).size == 3
    with pytest.raises(ValueError, match="length"):
        build_chain(logits, 4, length=7)


def test_width_capped_equals_brute_force_on_capped_ranks():
    logits = np.random.default_rng(3004).standard_normal((4, 6))  # seed 3004
    tree = build_tree_width_capped(logits, budget=20, root_token=0, max_width=2)
    top_lp, _ = topk_logprobs(logits, 2)
    assert prefix_ranks(tree)[1:] == brute_force_top_prefixes(top_lp, 20)
    wide = build_tree_width_capped(logits, budget=20, root_token=0, max_width=50)
    assert wide.tokens.tolist() == build_tree(logits, 20, 0).tokens.tolist()


def test_static_kary_shape():
    logits = np.random.default_rng(3005).standard_normal((4, 5))  # seed 3005
    tree = build_static_kary(logits, 0, (2, 1, 3))
    assert tree.size == 1 + 2 + 2 + 6 and tree.depths.max() == 3
    for u in range(tree.size):
        kids = np.flatnonzero(tree.parents == u)
        want = (2, 1, 3, 0)[tree.depths[u]]
        assert tree.ranks[kids].tolist() == list(range(want)), f"node {u}"
    with pytest.raises(ValueError, match="branching"):
        build_static_kary(logits, 0, (6,))


def test_batch_equals_single():
    rng = np.random.default_rng(3006)  # seed 3006
    x = rng.standard_normal((3, 4, 9))
    trees = build_tree_batch(x, [5, 0, 12], [1, 2, 3])
    for b, (budget, root) in enumerate([(5, 1), (0, 2), (12, 3)]):
        single = build_tree(x[b], budget, root)
        assert trees[b].tokens.tolist() == single.tokens.tolist(), f"request {b}"
        assert trees[b].parents.tolist() == single.parents.tolist(), f"request {b}"


# -------------------------------------------------------------------------------------------- layouts

def test_visibility_and_bitmask_multiword():
    logits = np.random.default_rng(3007).standard_normal((8, 40))  # seed 3007
    tree = build_tree(logits, 140, 0)  # 141 nodes -> 3 words
    vis = visibility(tree)
    for i in range(tree.size):  # ancestor chase
        anc, j = {i}, i
        while j:
            j = tree.parents[j]
            anc.add(int(j))
        assert set(np.flatnonzero(vis[i])) == anc, f"row {i}"
    bits = ancestor_bitmask(tree)
    assert bits.shape == (141, 3) and bits.dtype == np.uint64
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :141]  # little-endian host
    assert (unpacked.astype(bool) == vis).all()
    assert (ancestor_bitmask(tree, 5)[:, 3:] == 0).all()
    with pytest.raises(ValueError, match="n_words"):
        ancestor_bitmask(tree, 2)


def test_pad_tree_arrays():
    tree = build_tree(worked_logits(), 6, 7)
    p = pad_tree_arrays(tree, 10)
    assert int(p["n_nodes"]) == 7
    assert p["tokens"].tolist() == [7, 10, 20, 11, 30, 20, 31, 7, 7, 7]
    assert p["parents"].tolist()[7:] == [0, 0, 0] and p["depths"].tolist()[7:] == [1, 1, 1]
    assert p["first_child"].tolist() == [1, 2, 4, 5, -1, -1, -1, -1, -1, -1]
    assert p["next_sibling"].tolist() == [-1, 3, -1, -1, 6, -1, -1, -1, -1, -1]
    vis = p["visibility"]
    assert (vis[:7, :7] == visibility(tree)).all() and not vis[:7, 7:].any()
    assert [np.flatnonzero(vis[i]).tolist() for i in (7, 8, 9)] == [[0, 7], [0, 8], [0, 9]]
    assert p["bitmask"][:, 0].tolist() == [int("".join(str(int(v)) for v in r[::-1]), 2) for r in vis]
    with pytest.raises(ValueError, match="n_max"):
        pad_tree_arrays(tree, 6)


def test_tree_is_read_only():
    tree = build_tree(worked_logits(), 6, 7)
    with pytest.raises(ValueError):
        tree.tokens[0] = 1
