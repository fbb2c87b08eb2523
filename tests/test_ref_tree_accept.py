"""Tests of references/tree_accept.py: greedy walks on hand trees, the inverse-CDF rule exactly, and the
sampled rule by distribution (chi-square over (stop node, bonus token) on a small vocabulary)."""
import math

import numpy as np
import pytest

from kdbench.references.tree_accept import (
    accept_batch, accept_greedy, accept_sampled, sample_inverse_cdf, sample_per_node,
)
from kdbench.references.tree_build import Tree, build_chain, build_tree


def make_tree(tokens, parents, depths, ranks):
    return Tree(tokens=np.array(tokens, np.int64), parents=np.array(parents, np.int64),
                depths=np.array(depths, np.int64), ranks=np.array(ranks, np.int64),
                scores=np.zeros(len(tokens)))


WORKED = make_tree([7, 10, 20, 11, 30, 20, 31], [-1, 0, 1, 0, 2, 3, 2], [0, 1, 2, 1, 3, 2, 3],
                   [-1, 0, 0, 1, 0, 0, 1])  # ddtree.md §2.6


@pytest.mark.parametrize("target, path, bonus", [
    ([10, 20, 31, 0, 0, 0, 99], [0, 1, 2, 6], 99),     # the worked example
    ([10, 20, 30, 0, 5, 0, 0], [0, 1, 2, 4], 5),       # the deepest spine node, bonus at the leaf
    ([12, 0, 0, 0, 0, 0, 0], [0], 12),                 # no child of the root matches
    ([11, 0, 0, 20, 0, 44, 0], [0, 3, 5], 44),         # the target's token is a sibling's subtree
    ([10, 21, 0, 0, 0, 0, 0], [0, 1], 21),             # stops at depth 1
], ids=["worked", "spine", "root_only", "sibling_subtree", "depth1"])
def test_greedy_hand_cases(target, path, bonus):
    accepted, b = accept_greedy(WORKED, np.array(target))
    assert accepted.tolist() == path and b == bonus and accepted.dtype == np.int64


def test_greedy_deep_sibling():
    """Root has children 1..4 (a wide first level); only the last sibling's branch goes deep."""
    tree = make_tree([0, 5, 6, 7, 8, 9, 3], [-1, 0, 0, 0, 0, 4, 5], [0, 1, 1, 1, 1, 2, 3],
                     [-1, 0, 1, 2, 3, 0, 0])
    accepted, bonus = accept_greedy(tree, np.array([8, 1, 1, 1, 9, 3, 77]))
    assert accepted.tolist() == [0, 4, 5, 6] and bonus == 77


def test_greedy_chain():
    chain = build_chain(np.eye(5)[[1, 2, 3, 4]] * 5.0, root_token=0)  # tokens 0 -> 1 -> 2 -> 3 -> 4
    assert chain.tokens.tolist() == [0, 1, 2, 3, 4]
    assert accept_greedy(chain, np.array([1, 2, 3, 4, 0]))[0].tolist() == [0, 1, 2, 3, 4]
    assert accept_greedy(chain, np.array([1, 2, 3, 4, 0]))[1] == 0
    assert accept_greedy(chain, np.array([1, 2, 9, 4, 0])) [0].tolist() == [0, 1, 2]


def test_greedy_bad_input():
    with pytest.raises(ValueError, match="target_tokens"):
        accept_greedy(WORKED, np.zeros(6, np.int64))
    with pytest.raises(ValueError, match="target_tokens"):
        accept_greedy(WORKED, np.zeros(7))


def test_accept_batch_padded_rows_ignored():
    chain = make_tree([0, 1], [-1, 0], [0, 1], [-1, 0])
    padded = np.array([[10, 20, 31, 0, 0, 0, 99, -5], [1, 3, -5, -5, -5, -5, -5, -5]])
    out = accept_batch([WORKED, chain], padded)
    assert [a.tolist() for a, _ in out] == [[0, 1, 2, 6], [0, 1]] and [b for _, b in out] == [99, 3]


# ------------------------------------------------------------------------------------------ inverse CDF

@pytest.mark.parametrize("probs, u, want", [
    ([0.2, 0.0, 0.8], 0.0, 0),
    ([0.2, 0.0, 0.8], 0.2, 2),          # t == c[0] exactly: strict '<' moves on, skipping the zero
    ([0.2, 0.0, 0.8], 0.19999, 0),
    ([0.0, 0.0, 1.0], 0.0, 2),          # leading zeros are never returned
    ([2.0, 6.0], 0.25, 1),              # unnormalised: t = 0.25 * 8 = 2 == c[0]
    ([2.0, 6.0], 0.2499, 0),
    ([0.5, 0.5, 0.0], 0.9999999999, 1),  # a trailing zero is never returned
])
def test_inverse_cdf_rule(probs, u, want):
    assert sample_inverse_cdf(np.array(probs, np.float32), u) == want


def test_cumsum_is_sequential_not_pairwise():
    """The documented rule needs np.cumsum to add left to right (a CUDA scan must reproduce it)."""
    p = np.random.default_rng(4000).random(5000)  # seed 4000
    seq = np.empty_like(p)
    s = 0.0
    for i, v in enumerate(p):
        s += v
        seq[i] = s
    assert (np.cumsum(p) == seq).all()


def test_inverse_cdf_never_zero_probability():
    rng = np.random.default_rng(4001)  # seed 4001
    for trial in range(200):
        p = rng.random(12) * (rng.random(12) < 0.4)
        p[rng.integers(12)] += 0.1
        c = np.cumsum(p)
        for u in [0.0, *(c[:-1] / c[-1]), float(np.nextafter(1.0, 0.0)), float(rng.random())]:
            if u < 1.0:
                assert p[sample_inverse_cdf(p, u)] > 0, f"seed 4001 trial {trial} u={u!r}"


def test_inverse_cdf_bad_input():
    for probs, u in [([0.5, 0.5], 1.0), ([0.5, 0.5], -0.1), ([0.5, -0.1], 0.3), ([0.0, 0.0], 0.3),
                     ([np.nan, 1.0], 0.3), ([], 0.3)]:
        with pytest.raises(ValueError):
            sample_inverse_cdf(np.array(probs), u)


# ------------------------------------------------------------------------------------- by distribution

def chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof > x) = Q(dof/2, x/2), the regularised upper gamma (series / Lentz continued fraction)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_pre = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:  # series for P(a, z)
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= z / (a + n)
            total += term
            if term < total * 1e-16:
                break
        return 1.0 - total * math.exp(log_pre)
    b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)  # continued fraction for Q(a, z)
    h = d
    for i in range(1, 1000):
        an, b = -i * (i - a), b + 2
        d = 1 / (an * d + b)
        c = b + an / c
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return h * math.exp(log_pre)


def test_chi2_sf_helper():
    for x, dof, p in [(3.841458820694124, 1, 0.05), (18.307038053275146, 10, 0.05),
                      (124.34211340400407, 100, 0.05), (2.0, 2, math.exp(-1.0)), (0.5, 3, 0.918891)]:
        assert abs(chi2_sf(x, dof) - p) < 1e-6, (x, dof)


def chi2_pvalue(counts: dict, expected: dict, n: int) -> float:
    """Pearson chi-square; categories with n*p < 5 are pooled into one bin."""
    big = [k for k, p in expected.items() if n * p >= 5]
    obs = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    exp = [n * expected[k] for k in big] + [n * (1 - sum(expected[k] for k in big))]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    return chi2_sf(stat, sum(e > 0 for e in exp) - 1)


def committed_distribution(tree: Tree, probs: np.ndarray) -> dict:
    """Lossless target: P(stop at node u with bonus y) = P_target(path to u) * p_u(y), y not a child of u."""
    reach = np.ones(tree.size)
    for i in range(1, tree.size):
        reach[i] = reach[tree.parents[i]] * probs[tree.parents[i], tree.tokens[i]]
    out = {}
    for u in range(tree.size):
        kids = set(tree.tokens[tree.parents == u].tolist())
        for y in range(probs.shape[1]):
            if y not in kids and probs[u, y] > 0:
                out[(u, y)] = reach[u] * probs[u, y]
    return out


def sampled_counts(tree, probs, uniforms) -> dict:
    counts: dict = {}
    for u in uniforms:
        accepted, bonus = accept_sampled(tree, probs, u)
        key = (int(accepted[-1]), bonus)
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_sampled_acceptance_matches_target_distribution():
    rng = np.random.default_rng(4002)  # seed 4002
    V, n = 4, 5000
    tree = build_tree(rng.standard_normal((3, V)), budget=10, root_token=0)
    probs = rng.dirichlet(np.full(V, 0.7), size=tree.size).astype(np.float32)  # the target, per node
    probs[1, 2] = 0.0                                     # one zero-probability token; rows unnormalised
    p64 = probs.astype(np.float64)
    expected = committed_distribution(tree, p64 / p64.sum(axis=1, keepdims=True))
    assert abs(sum(expected.values()) - 1.0) < 1e-6
    uniforms = rng.random((n, tree.size))
    p_ok = chi2_pvalue(sampled_counts(tree, probs, uniforms), expected, n)
    assert p_ok > 1e-3, f"seed 4002: p = {p_ok}"
    # Negative control: one uniform shared by all nodes couples the draws, which is not lossless.
    p_bad = chi2_pvalue(sampled_counts(tree, probs, np.repeat(uniforms[:, :1], tree.size, 1)), expected, n)
    assert p_bad < 1e-6, f"seed 4002: the chi-square test cannot see a coupled sampler (p = {p_bad})"


def test_sampled_equals_greedy_on_samples_and_on_one_hot():
    rng = np.random.default_rng(4003)  # seed 4003
    tree = build_tree(rng.standard_normal((3, 6)), budget=12, root_token=0)
    probs = rng.random((tree.size, 6))
    u = rng.random(tree.size)
    samples = sample_per_node(probs, u)
    a, b = accept_sampled(tree, probs, u)
    a2, b2 = accept_greedy(tree, samples)
    assert a.tolist() == a2.tolist() and b == b2
    target = rng.integers(0, 6, tree.size)
    a3, b3 = accept_sampled(tree, np.eye(6)[target], u)  # one-hot target = greedy
    assert a3.tolist() == accept_greedy(tree, target)[0].tolist() and b3 == target[a3[-1]]
